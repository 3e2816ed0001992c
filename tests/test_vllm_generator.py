"""The vLLM generator (inference/vllm_generator.py, issue #45 items 1-4): vLLM in a child process behind the
generation protocol, checked against this project's own scoring of the same tokens under the same weights.

The tests marked `vllm` need the vLLM environment (scripts/vllm_env.sh; MIMESIS_VLLM_PYTHON names another
interpreter) and are skipped, saying so, without it. One vLLM child serves the generator's own tests: a tiny Qwen3
with head_dim 32 (vLLM's CPU attention takes 32-512; the tiny configs' 16 is below it), fp32, its embedding scaled
so that the next-token distributions are neither uniform nor one-hot (entropies of a few nats). Each RL run (agentrl
synchronous and asynchronous, simrl) starts and stops its own, as a run does. The config checks and the pipe's
two-thread check (a stand-in child) at the end need no vLLM.
"""

import dataclasses
import math
import os
import subprocess
import threading

import jax
import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.config import presets
from mimesis_jax.errors import ConfigError
from mimesis_jax.inference.protocol import Sampling
from mimesis_jax.inference.vllm_generator import DEFAULT_PYTHON, KNOWN_EXIT_ABORT, VLLMGenerator, hf_buckets

PYTHON = os.path.expanduser(os.environ.get("MIMESIS_VLLM_PYTHON", DEFAULT_PYTHON))
STOP = 7
SCORE_LEN = 64  # every scored row is padded to this length: one scoring program for the module
TOL = 1e-4  # fp32 on both sides; different kernels and summation orders


@pytest.fixture(autouse=True, scope="module")
def _one_omp_thread():
    """The vLLM children this module starts (they inherit the environment) run torch on one OpenMP thread: the
    tiny models' kernels are too small to split, and on the test machine's few cores, shared with the other test
    workers, a second thread only spin-waits between them. What the tests check (tokens under a seed, log-probs
    within TOL of this project's scoring, syncs, versions) does not depend on the thread count."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


def _has_vllm() -> bool:
    if not os.access(PYTHON, os.X_OK):
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"
    return subprocess.run([PYTHON, "-c", probe], capture_output=True).returncode == 0


def _config():
    return dataclasses.replace(presets.tiny_qwen3(), head_dim=32, max_position_embeddings=256)


def _params(seed: int):
    p = models.init_params(_config(), jax.random.PRNGKey(seed))
    return dict(p, embed=p["embed"] * 6.0)


@pytest.fixture(scope="module")
def vllm_gen():
    if not _has_vllm():
        pytest.skip(f"no vLLM environment at {PYTHON} (scripts/vllm_env.sh builds it; or set MIMESIS_VLLM_PYTHON)")
    params = _params(0)
    # buckets of 64 KiB: the 0.66 MB model syncs in several, as a large one does
    gen = VLLMGenerator(_config(), params, stop_ids=[STOP], seed=3, python=PYTHON, kv_cache_bytes=64 << 20,
                        max_num_seqs=8, bucket_bytes=64 << 10, engine_args={"block_size": 32})
    yield gen, params
    gen.close()
    assert gen.exit_code in (0, KNOWN_EXIT_ABORT), f"vLLM child exited with {gen.exit_code} (log {gen.log_path})"


def _scores(params, prompts, samples, temperature):
    """This project's log-probs of each sample's tokens after its prompt: the model's forward, one padded batch."""
    rows = [list(p) + list(s.tokens) for p, s in zip(prompts, samples)]
    assert max(map(len, rows)) <= SCORE_LEN
    ids = np.array([r + [0] * (SCORE_LEN - len(r)) for r in rows], np.int32)
    lp = np.asarray(token_logprobs(_config(), params, ids, temperature=temperature))
    return [lp[i, len(p) - 1:len(p) - 1 + len(s.tokens)] for i, (p, s) in enumerate(zip(prompts, samples))]


def _max_gap(params, prompts, samples, temperature):
    refs = _scores(params, prompts, samples, temperature)
    return max(float(np.abs(np.asarray(s.logprobs) - r).max()) for s, r in zip(samples, refs))


PROMPTS = [[1, 2, 3, 4, 5], [9, 10, 11], list(range(20, 40))]


@pytest.mark.vllm
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.0])
def test_logprobs_match_the_projects_scoring(vllm_gen, temperature):
    gen, params = vllm_gen
    out = gen.generate(PROMPTS, Sampling(max_tokens=16, temperature=temperature, seed=11))
    assert [s.prompt_len for s in out] == [len(p) for p in PROMPTS]
    assert all(s.version == 0 for s in out)
    for s in out:
        assert len(s.logprobs) == len(s.tokens) >= 1
        stopped = s.tokens[-1] == STOP
        assert s.finish_reason == ("stop" if stopped else "length")
        assert stopped or len(s.tokens) == 16
        assert STOP not in s.tokens[:-1]
    # greedy samples are scored at T = 1, as the sampler and the RL update do
    assert _max_gap(params, PROMPTS, out, temperature or 1.0) < TOL
    # the check has teeth: the same tokens scored at another temperature are far off
    assert _max_gap(params, PROMPTS, out, 0.5 if temperature == 1.0 else 1.5) > 100 * TOL


@pytest.mark.vllm
def test_same_seed_same_sample_and_fresh_draws_without_one(vllm_gen):
    gen, _ = vllm_gen
    a = gen.generate(PROMPTS, Sampling(max_tokens=12, seed=21))
    b = gen.generate(PROMPTS, Sampling(max_tokens=12, seed=21))
    c = gen.generate(PROMPTS, Sampling(max_tokens=12, seed=22))
    assert [s.tokens for s in a] == [s.tokens for s in b]
    assert [s.logprobs for s in a] == [s.logprobs for s in b]
    assert [s.tokens for s in a] != [s.tokens for s in c]
    # unseeded requests: derive_seed(generator seed, call, index), so two calls differ
    d, e = (gen.generate(PROMPTS, Sampling(max_tokens=12)) for _ in range(2))
    assert [s.tokens for s in d] != [s.tokens for s in e]


@pytest.mark.vllm
def test_set_params_streams_the_new_weights_and_resets_the_prefix_cache(vllm_gen):
    gen, params = vllm_gen
    new = _params(1)
    long_prompts = [list(range(100, 140)), list(range(200, 248))]  # a full 32-token block each: prefix-cached
    before = gen.generate(long_prompts, Sampling(max_tokens=6, seed=5))
    assert _max_gap(params, long_prompts, before, 1.0) < TOL
    try:
        gen.set_params(new, version=4)
        after = gen.generate(long_prompts, Sampling(max_tokens=6, seed=5))
        assert all(s.version == 4 for s in after)
        assert _max_gap(new, long_prompts, after, 1.0) < TOL  # the new weights, not cached keys of the old
        assert _max_gap(params, long_prompts, after, 1.0) > 0.1
        sync = gen.last_sync
        cfg = _config()
        total = sum(math.prod(e.hf_shape) * 4 for e in models.family(cfg, "hf").hf_tensors(cfg))
        assert sync["bytes"] == total
        assert sync["buckets"] == len(hf_buckets(cfg, 64 << 10)) > 1
        assert sync["tensors"] == len(models.family(cfg, "hf").hf_tensors(cfg))
    finally:
        gen.set_params(params, version=0)
    again = gen.generate(long_prompts, Sampling(max_tokens=6, seed=5))
    assert [s.tokens for s in again] == [s.tokens for s in before]


@pytest.mark.vllm
def test_agentrl_samples_through_vllm_and_syncs_every_step(tmp_path):
    """Two steps of the tiny Stage II GRPO run (toy user side) with rollout.generator=vllm at head_dim 32: each
    step's dialogues are sampled by the weights of the step before (versions 0, 1), with their log-probs, and each
    step logs its weight sync."""
    if not _has_vllm():
        pytest.skip(f"no vLLM environment at {PYTHON} (scripts/vllm_env.sh builds it; or set MIMESIS_VLLM_PYTHON)")
    from helpers import run_tiny_grpo
    from mimesis_jax.train.rl.async_rollouts import agent_segments

    res, seen = run_tiny_grpo(tmp_path, 2, "rollout.generator=vllm", f"rollout.vllm_python={PYTHON}",
                              "model.head_dim=32", "rollout.vllm_kv_cache_gib=0.0625")
    assert res.final_step == 2 and sorted(seen) == [1, 2]
    for step, trajs in seen.items():
        segs = agent_segments(trajs)
        assert len(trajs) == 4 and segs
        assert {s.version for s in segs} == {step - 1}
        assert all(len(s.logprobs) == len(s.tokens) and max(s.logprobs) <= 0 for s in segs)
    m = res.metrics
    assert m[1]["staleness_max"] == m[2]["staleness_max"] == 0
    cfg = _config()  # configs/tiny_agentrl.py's agent is tiny_qwen3; head_dim 32 as set
    whole = sum(math.prod(e.hf_shape) * 4 for e in models.family(cfg, "hf").hf_tensors(cfg))
    assert m[1]["vllm/sync_bytes"] == m[2]["vllm/sync_bytes"] == whole  # the whole model in fp32, every step
    assert m[1]["vllm/sync_buckets"] >= 1
    assert [m[s]["vllm/sync_version"] for s in (1, 2)] == [1, 2]  # each step puts its own version in vLLM


ASYNC_STEPS = 3
ROW_LEN = 128  # tiny_grpo_config's rollout.row_len: every dialogue fits one scored row


def _versions_at(workdir, step: int):
    """(the run's model config, {version: weights}) from the checkpoint of `step` of an rl.max_staleness=1 run:
    its params (version `step`) and the version before it, which that checkpoint keeps for the step in flight."""
    from mimesis_jax import config as config_lib
    from mimesis_jax.checkpoints import Checkpointer

    ck = Checkpointer(str(workdir), read_only=True)
    try:
        mc = config_lib.model_from_dict(ck.run_config()["model"])
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev),
                              models.abstract_params(mc))
        params, got = ck.restore_params(step, target)
        lagged = ck.restore_lagged(step, target, [step - 1])
    finally:
        ck.close()
    assert got == step
    return mc, {step: params, step - 1: lagged[step - 1]}


def _dialogue_gap(mc, params, trajs) -> float:
    """The largest |vLLM's log-prob - this project's| over the agent tokens of `trajs` (status ok): each dialogue's
    non-coach segments in order are one row (what the update scores), scored by the model's forward."""
    rows, spans = [], []
    for t in trajs:
        if t.status != "ok":
            continue
        row, at = [], []
        for seg in t.segments:
            if seg.kind == "coach":
                continue
            if seg.kind == "agent":
                at.append((len(row), seg))
            row += seg.tokens
        assert len(row) <= ROW_LEN and at
        rows.append(row + [0] * (ROW_LEN - len(row)))
        spans.append(at)
    lp = np.asarray(token_logprobs(mc, params, np.array(rows, np.int32), temperature=1.0))
    return max(float(np.abs(np.asarray(seg.logprobs) - lp[i, o - 1:o - 1 + len(seg.tokens)]).max())
               for i, at in enumerate(spans) for o, seg in at)


@pytest.mark.vllm
def test_agentrl_through_vllm_beside_the_updates_one_version_late(tmp_path):
    """Three steps of the tiny Stage II GRPO run with rollout.generator=vllm under the asynchronous loop
    (rl.max_staleness=1, the fixed lag): the producer thread samples through vLLM while the trainer updates and
    syncs each new version into it. Step s (1-based) trains with version s - 1 on tokens vLLM sampled with version
    max(0, s - 2), so the logged staleness is 0, 1, 1; every step syncs version s; vLLM's behaviour log-probs are
    this project's scoring of the same tokens under the weights of the version they carry (restored from the
    checkpoint of step 1, which keeps version 0 for the step in flight), and they feed the decoupled objective
    (rl.behavior_is_cap): its behaviour-vs-proximal gap is that agreement at staleness 0 and an update's change at
    staleness 1."""
    if not _has_vllm():
        pytest.skip(f"no vLLM environment at {PYTHON} (scripts/vllm_env.sh builds it; or set MIMESIS_VLLM_PYTHON)")
    from helpers import run_tiny_grpo

    res, seen = run_tiny_grpo(tmp_path, ASYNC_STEPS, "rollout.generator=vllm", f"rollout.vllm_python={PYTHON}",
                              "model.head_dim=32", "rollout.vllm_kv_cache_gib=0.0625", "rl.max_staleness=1",
                              "rl.async_deterministic=true", "rl.old_logprobs=recompute", "rl.behavior_is_cap=2.0",
                              "checkpoint.every=1", f"checkpoint.keep={ASYNC_STEPS}",
                              # each step's record holds its own sync: early updates defer a version's publication
                              # past its step's record under the fixed lag
                              "rl.async_early_updates=false")
    assert res.final_step == ASYNC_STEPS and sorted(seen) == list(range(1, ASYNC_STEPS + 1))
    mc, weights = _versions_at(tmp_path, 1)  # versions 0 and 1
    m = res.metrics
    whole = sum(math.prod(e.hf_shape) * 4 for e in models.family(mc, "hf").hf_tensors(mc))
    for step, trajs in seen.items():
        sampled = max(0, step - 2)
        segs = [s for t in trajs if t.status == "ok" for s in t.segments if s.kind == "agent"]
        assert segs and {s.version for s in segs} == {sampled}, step
        rec = m[step]
        assert rec["staleness_max"] == rec["staleness_mean"] == (step - 1) - sampled
        tokens = sum(len(s.tokens) for s in segs)
        assert rec[f"staleness_hist/{step - 1 - sampled}"] == tokens
        assert rec["vllm/sync_version"] == step and rec["vllm/sync_bytes"] == whole  # the whole model, fp32
        assert _dialogue_gap(mc, weights[sampled], trajs) < TOL
    # the check has teeth: version 1's tokens scored by version 0 are far off (an update moved the weights)
    assert _dialogue_gap(mc, weights[0], seen[3]) > 100 * TOL
    # the decoupled objective read vLLM's log-probs as the behaviour ones: equal to the proximal at staleness 0
    assert m[1]["behav_logp_gap"] < TOL < 100 * TOL < m[2]["behav_logp_gap"]


def _has_torchvision() -> bool:
    return subprocess.run([PYTHON, "-c", "import torchvision"], capture_output=True).returncode == 0


# vLLM's CPU kernels for the tiny simulator: gated-DeltaNet in bf16 only, its head dims 64 or 128 (32 is refused),
# attention head_dim >= 32; the training step then runs in bf16 too (train.dtype sets the compute dtype)
SIMRL_VLLM = ["train.dtype=bfloat16", "model.head_dim=32", "model.linear_key_head_dim=64",
              "model.linear_value_head_dim=64", "rollout.vllm_kv_cache_gib=0.0625"]


@pytest.mark.vllm
@pytest.mark.slow  # two tiny Qwen3.5 RL steps at 1,536-token rows plus vLLM's start
def test_simrl_samples_through_vllm_and_syncs_every_step(tmp_path):
    """Two steps of the tiny Stage I.3 run (configs/tiny_simrl.py, cut as tests/test_simulator_rl.py cuts it, one
    prompt a step) with rollout.generator=vllm: each step's simulator turns are sampled by the weights of the step before (versions 0,
    1), with their log-probs, and each step syncs the whole model in bf16."""
    if not _has_vllm() or not _has_torchvision():
        pytest.skip(f"no vLLM environment with torchvision at {PYTHON} (vLLM's Qwen3.5 module imports it; "
                    "scripts/vllm_env.sh builds it; or set MIMESIS_VLLM_PYTHON)")
    from mimesis_jax.train.rl import simulator as S
    from mimesis_jax.train.rl.async_rollouts import agent_segments

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # one prompt's group of 2 per step (test_simulator_rl.py's runs take 2): the same update program, run once a
    # step instead of twice, and still a version and a sync per step to check
    small = ["train.progress_bar=false", "train.tensorboard=false", "train.steps=2", "rollout.prompts_per_step=1",
             "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.max_tokens=8",
             "domains.max_user_turns=2", "checkpoint.async_save=false", "checkpoint.every=100", "mesh.fsdp=1",
             "rollout.row_len=1536", "rollout.max_context_tokens=1536", "rollout.row_rungs=(2.0,)",
             "rollout.generator=vllm", f"rollout.vllm_python={PYTHON}"]
    cfg = S.load(os.path.join(root, "configs", "tiny_simrl.py"), small + SIMRL_VLLM)
    seen = {}
    res = S.run(cfg, str(tmp_path), handle_signals=False, on_rollouts=lambda step, outs: seen.__setitem__(step, outs),
                log=lambda *a: None)
    assert res.final_step == 2 and sorted(seen) == [1, 2]
    for step, outs in seen.items():
        segs = agent_segments(outs)
        assert len(outs) == 2 and segs
        assert {s.version for s in segs} == {step - 1}
        assert all(len(s.logprobs) == len(s.tokens) and max(s.logprobs) <= 0 for s in segs)
    mc = cfg.runtime_model()
    whole = sum(math.prod(e.hf_shape) * 2 for e in models.family(mc, "hf").hf_tensors(mc))
    m = res.metrics
    assert m[1]["vllm/sync_bytes"] == m[2]["vllm/sync_bytes"] == whole  # the whole model in bf16, every step


def test_buckets_cover_every_tensor_once_within_the_cap():
    cfg = dataclasses.replace(_config(), dtype="bfloat16")
    names = [e.name for e in models.family(cfg, "hf").hf_tensors(cfg)]
    buckets = hf_buckets(cfg, 20_000)
    assert [e.name for b in buckets for e in b] == names
    for b in buckets:
        sizes = [math.prod(e.hf_shape) * 2 for e in b]  # bf16
        assert sum(sizes) <= 20_000 or len(b) == 1


def test_the_worker_imports_only_vllm_torch_safetensors_and_the_stdlib():
    import ast
    import sys

    from mimesis_jax.inference import vllm_worker

    with open(vllm_worker.__file__) as f:
        tree = ast.parse(f.read())
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert roots - set(sys.stdlib_module_names) == {"vllm", "safetensors"}


def test_a_child_that_cannot_start_vllm_raises_its_one_line_error(tmp_path, monkeypatch):
    """The worker run by a Python without vLLM (this one) answers that vLLM did not start; the generator raises it
    and removes its scratch directory."""
    import sys

    from mimesis_jax.inference import vllm_generator

    scratch = tmp_path / "scratch"
    monkeypatch.setattr(vllm_generator, "_scratch_dir", lambda: str(scratch.mkdir() or scratch))
    with pytest.raises(vllm_generator.VLLMError, match=r"vLLM did not start: ModuleNotFoundError: No module named "
                       r"'vllm'") as e:
        VLLMGenerator(_config(), _params(0), stop_ids=[STOP], python=sys.executable)
    assert "\n" not in str(e.value)
    assert not scratch.exists()


# A stand-in for inference/vllm_worker.py that speaks its protocol without vLLM, slowly enough that two threads'
# exchanges would interleave on the pipe without the generator's lock: a sync that reads a generate request where
# it expects a bucket's path fails, and so does a generate that reads a "want".
FAKE_WORKER = """
import json, os, sys, time
out = os.fdopen(int(sys.argv[2]), "w")
def reply(obj):
    out.write(json.dumps(obj) + "\\n")
    out.flush()
reply({"ok": True, "ready": True})
for line in sys.stdin:
    msg = json.loads(line)
    if msg["op"] == "close":
        reply({"ok": True})
        os._exit(0)
    if msg["op"] == "generate":
        time.sleep(0.02)
        reply({"ok": True, "samples": [{"tokens": [5], "logprobs": [-0.5], "finish_reason": "length"}
                                       for _ in msg["prompts"]]})
        continue
    for i in range(msg["buckets"]):
        reply({"ok": True, "want": i})
        time.sleep(0.005)
        assert os.path.exists(json.loads(sys.stdin.readline())["path"])
    reply({"ok": True, "loaded": 1, "seconds": 0.0})
"""


def test_the_producer_and_the_trainer_share_the_pipe_one_exchange_at_a_time(tmp_path, monkeypatch):
    """The asynchronous loop calls `generate` from its producer thread and `set_params` from its trainer thread:
    each exchange with the child holds the generator's lock, so both threads' calls all succeed and every sample
    carries a version that had been synced when its call ran, never falling back (a stand-in child, no vLLM)."""
    import sys

    from mimesis_jax.inference import vllm_generator

    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE_WORKER)
    monkeypatch.setattr(vllm_generator, "WORKER", str(worker))
    params = _params(0)
    gen = VLLMGenerator(_config(), params, stop_ids=[STOP], python=sys.executable, bucket_bytes=64 << 10)
    assert len(hf_buckets(_config(), 64 << 10)) > 1  # several lines per sync: room to interleave
    seen, errors = [], []

    def sample():
        try:
            for _ in range(12):
                seen.append([s.version for s in gen.generate([[1, 2], [3]], Sampling(max_tokens=1, seed=0))])
        except Exception as e:  # the test reports it below, in its own thread
            errors.append(e)

    producer = threading.Thread(target=sample)
    try:
        producer.start()
        for v in range(1, 7):
            gen.set_params(params, version=v)
            assert gen.last_sync["version"] == v
        producer.join()
    finally:
        gen.close()
    assert not errors, errors
    versions = [vs[0] for vs in seen]
    assert all(len(set(vs)) == 1 for vs in seen) and len(seen) == 12
    assert versions == sorted(versions) and set(versions) <= set(range(7))
    assert gen.exit_code == 0


def test_a_missing_vllm_python_is_a_config_error_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout\.vllm_python.*scripts/vllm_env\.sh"):
        VLLMGenerator(_config(), None, stop_ids=[STOP], python=str(tmp_path / "nope" / "python"))


@pytest.mark.parametrize("sets, key", [
    (["rollout.generator=sglang"], "rollout.generator"),
    (["rollout.generator=vllm", "rollout.engine=true"], "rollout.generator"),
    (["rollout.generator=vllm", "rollout.mesh=tensor=1"], "rollout.generator"),
    # vLLM's child is the rollout pool: a JAX pool beside it would hold nothing
    (["rollout.generator=vllm", "rl.max_staleness=1", "rollout.devices=4"], "rollout.devices"),
    (["rollout.vllm_sync_bucket_mib=0"], "rollout.vllm_sync_bucket_mib"),
    (["rollout.vllm_kv_cache_gib=0"], "rollout.vllm_kv_cache_gib"),
])
def test_rollout_generator_keys_are_checked(sets, key):
    from helpers import tiny_grpo_config

    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
        tiny_grpo_config(1, *sets)
    assert "\n" not in str(e.value)


def test_vllm_may_sample_beside_the_updates():
    """rl.max_staleness > 0 with rollout.generator=vllm loads (it was refused before the asynchronous loop took
    vLLM); only a JAX rollout pool beside it is refused (above)."""
    from helpers import tiny_grpo_config

    cfg = tiny_grpo_config(1, "rollout.generator=vllm", "rl.max_staleness=1")
    assert (cfg.rollout.generator, cfg.rl.max_staleness, cfg.rollout.devices) == ("vllm", 1, 0)
    with pytest.raises(ConfigError, match=r"^config key 'rollout\.devices': must be 0 with rollout\.generator=vllm"):
        tiny_grpo_config(1, "rollout.generator=vllm", "rl.max_staleness=1", "rollout.devices=4")
