"""Helpers shared by tests: tiny random HF checkpoints built with transformers (torch) as the reference."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the benchmarks are scripts, not a package), registered in sys.modules
    under `name` so that its dataclasses can look their module up."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def subprocess_env(devices: int | None = None, collective_timeout_s: int = 60, **extra: str) -> dict:
    """The environment for a CLI or worker subprocess a test starts: the test's own variables, JAX on CPU, and
    XLA_FLAGS rebuilt (the compile setting travels in JAX_DISABLE_MOST_OPTIMIZATIONS and, for the fusion emitters,
    MIMESIS_TEST_QUICK_EMITTERS, tests/conftest.py): with ``devices``, that many fake CPU devices and a collective
    timeout so a hung peer fails the test instead of blocking it; without ``devices`` the child sees one CPU
    device, as a user's laptop does."""
    flags = ["--xla_cpu_use_fusion_emitters=false"] if os.environ.get("MIMESIS_TEST_QUICK_EMITTERS") == "1" else []
    if devices is not None:
        flags += [f"--xla_force_host_platform_device_count={devices}",
                  f"--xla_cpu_collective_call_terminate_timeout_seconds={collective_timeout_s}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=" ".join(flags))
    env.update(extra)
    return env


def run_script(script: str, devices: int, *args: str, root: str | None = None, timeout: int = 900):
    """Runs the Python `script` in a subprocess on `devices` fake CPU devices (cwd and PYTHONPATH: the repository
    root); the JSON it prints after "RESULT "."""
    import json
    import subprocess
    import sys

    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = subprocess_env(devices=devices, collective_timeout_s=15, PYTHONPATH=root)
    r = subprocess.run([sys.executable, "-c", script, *args], cwd=root, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(next(line for line in r.stdout.splitlines() if line.startswith("RESULT "))[7:])


def run_two_processes(worker: str, arg: str, out_dir, root: str, devices: int = 4, timeout: int = 300) -> list[str]:
    """Runs `worker` (a `python -c` source) as processes 0 and 1 of a 2-process jax run on a free local port, each
    with `devices` fake devices, given (coordinator address, process id, `arg`, its output file); asserts both
    exit 0 (their output tails otherwise) and returns the two output files' paths."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = subprocess_env(devices=devices, PYTHONPATH=root)
    outs = [os.path.join(str(out_dir), f"{i}.json") for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-c", worker, f"127.0.0.1:{port}", str(i), arg, outs[i]], cwd=root,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    logs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    return outs


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


def assert_trees_equal(a, b) -> None:
    """Two parameter pytrees have the same structure (a zip over leaves would not notice a missing one) and
    bit-identical leaves."""
    import jax

    sa, sb = jax.tree.structure(a), jax.tree.structure(b)
    assert sa == sb, f"pytree structures differ:\n{sa}\n{sb}"
    for (path, x), y in zip(jax.tree.leaves_with_path(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(jax.device_get(x)), np.asarray(jax.device_get(y)),
                                      err_msg=jax.tree_util.keystr(path))


def randomize_torch_model(model, seed: int = 0, scale: float = 0.15, norm_scale: float = 0.1):
    """Re-draws every weight so logits are O(1) and norms are not all-ones (a stronger parity check)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name and p.ndim == 1:
                # Qwen3.5 norms compute x * (1 + w) (w near 0), except the DeltaNet's gated output norm (x * w)
                offset_norm = getattr(model.config, "model_type", "").startswith("qwen3_5") and \
                    not name.endswith("linear_attn.norm.weight")
                p.copy_((0.0 if offset_norm else 1.0) + norm_scale * noise)
            elif name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 4 + 0.5))
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * noise)
            else:
                p.copy_(scale * noise)
    return model


def make_hf_qwen3(tmpdir: str, seed: int = 0, **cfg) -> str:
    """Writes a random transformers Qwen3ForCausalLM (fp32) to tmpdir and returns the path."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    base = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, max_position_embeddings=256, rope_theta=10000.0,
                tie_word_embeddings=False)
    base.update(cfg)
    torch.manual_seed(seed)
    config = Qwen3Config(**base)
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()
    randomize_torch_model(model, seed)
    os.makedirs(tmpdir, exist_ok=True)
    model.save_pretrained(tmpdir, safe_serialization=True)
    return tmpdir


def hf_logits(path: str, ids: np.ndarray) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


def hf_greedy(path: str, ids: np.ndarray, n: int) -> np.ndarray:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor(np.asarray(ids), dtype=torch.long), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, eos_token_id=None, pad_token_id=0,
                             attention_mask=torch.ones(ids.shape, dtype=torch.long))
    return out[:, ids.shape[1]:].numpy()


def expected_ids_mask(tok, pieces):
    """Independent construction of (ids, loss mask) from pieces (kind, value, is_target): kind "c" = one control
    token by name, "t" = plain text encoded on its own."""
    ids, mask = [], []
    for kind, value, target in pieces:
        new = [tok.token_id(value)] if kind == "c" else tok.encode(value)
        ids += new
        mask += [int(target)] * len(new)
    return np.asarray(ids, np.int32), np.asarray(mask, np.int32)


def tiny_grpo_config(steps: int, *sets: str):
    """configs/tiny_agentrl.py:grpo cut to `steps` steps of 2 prompts x 2 dialogues, 8-token agent turns in 128-token
    rows, one mini-batch per prompt, no progress bar, TensorBoard or async checkpoint; `sets` on top."""
    from mimesis_jax.train.rl import agent

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = ["train.progress_bar=false", "train.tensorboard=false", f"train.steps={steps}",
            "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.mini_batch_prompts=1",
            "rollout.agent_max_tokens=8", "rollout.row_len=128", "checkpoint.async_save=false",
            "checkpoint.every=100"]
    return agent.load(os.path.join(root, "configs", "tiny_agentrl.py") + ":grpo", base + list(sets))


def run_tiny_grpo(workdir, steps: int, *sets: str):
    """`tiny_grpo_config` run in `workdir` against the rule-based toy user and coach: (RLResult, {step: the step's
    trajectories})."""
    from mimesis_jax.chat.base import SimulatorAsResponder
    from mimesis_jax.envs.toy import ToyCoach, ToyUser
    from mimesis_jax.train.rl import agent

    seen = {}
    user = ToyUser()
    res = agent.run(tiny_grpo_config(steps, *sets), str(workdir),
                    user_side=agent.UserSide(user, SimulatorAsResponder(user), user, ToyCoach()),
                    on_rollouts=lambda step, trajs: seen.__setitem__(step, trajs), handle_signals=False,
                    log=lambda *a: None)
    return res, seen
