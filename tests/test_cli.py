"""`python -m mimesis_jax`: SIGTERM -> checkpoint + exit 0, resume, export -> load_hf / transformers, named errors."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from helpers import assert_trees_equal
from mimesis_jax import models
from mimesis_jax.cli import main
from mimesis_jax.checkpoints import Checkpointer, abstract_like
from mimesis_jax.train.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny Qwen3.5 simulator (2 DeltaNet + ... as the pattern says) on the synthetic stream: no tokenizer needed.
CONFIG = textwrap.dedent("""
    from mimesis_jax.config import (CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig,
                                    qwen3_5_layer_types)
    from mimesis_jax.models import ModelConfig
    from mimesis_jax.train.synthetic import SyntheticData

    def get_config():
        model = ModelConfig(model_type="qwen3_5_text", vocab_size=64, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            partial_rotary_factor=0.5, rope_theta=10000.0, tie_word_embeddings=False,
                            attn_output_gate=True, full_attention_interval=2, layer_types=qwen3_5_layer_types(2, 2),
                            linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8,
                            linear_num_key_heads=2, linear_num_value_heads=4, max_position_embeddings=256,
                            logits_seq_chunk=16, logits_vocab_chunk=32)
        return RunConfig(stage="midtrain", model=model, data=SyntheticData(vocab_size=64, seq_len=32),
                         optimizer=OptimizerConfig(lr=1e-2, warmup_steps=0, schedule="constant"),
                         train=TrainConfig(steps=100000, global_batch=4, dtype="float32", progress_bar=False,
                                           tensorboard=False),
                         mesh=MeshConfig(data=1, fsdp=1, tensor=1),
                         checkpoint=CheckpointConfig(every=100000, keep=2))
""")


@pytest.fixture(scope="module")
def sigtermed_run(tmp_path_factory):
    """Starts the CLI on a 100,000-step run, sends SIGTERM once a few steps are logged."""
    d = tmp_path_factory.mktemp("cli")
    cfg, wd = d / "synthetic.py", d / "work"
    cfg.write_text(CONFIG)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "mimesis_jax", "midtrain", "--config", str(cfg), "--workdir",
                             str(wd)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = wd / "metrics.jsonl"
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.2)
        assert proc.poll() is None, f"the run ended early:\n{proc.stdout.read()}"
        assert metrics.exists(), "no step logged within 300 s"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return str(cfg), str(wd), proc.returncode, out


def test_sigterm_saves_a_checkpoint_and_exits_0(sigtermed_run):
    cfg, wd, rc, out = sigtermed_run
    assert rc == 0, out
    assert "stop requested: checkpoint saved at step" in out
    steps = [r["step"] for r in read_metrics(wd)]
    ck = Checkpointer(wd, read_only=True)
    assert ck.all_steps() == [steps[-1]] and 3 <= steps[-1] < 100000  # the step the signal interrupted
    assert ck.run_config()["train"]["steps"] == 100000
    ck.close()
    # the same command resumes from there (fewer total steps so it ends quickly)
    k = steps[-1]
    assert main(["midtrain", "--config", cfg, "--workdir", wd, "--set", f"train.steps={k + 2}"]) == 0
    assert [r["step"] for r in read_metrics(wd)] == list(range(1, k + 3))
    assert Checkpointer(wd, read_only=True).latest_step() == k + 2


def test_export_reads_back_and_loads_in_transformers(sigtermed_run, tmp_path):
    _, wd, rc, _ = sigtermed_run
    assert rc == 0
    out = str(tmp_path / "hf")
    assert main(["export", "--workdir", wd, "--out", out]) == 0
    config, params = models.load_hf(out)
    ck = Checkpointer(wd, read_only=True)
    from mimesis_jax.config import model_from_dict

    mc = model_from_dict(ck.run_config()["model"])
    rep = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    ab = models.abstract_params(mc)
    saved, step = ck.restore_params(None, abstract_like(ab, jax.tree.map(lambda _: rep, ab)))
    ck.close()
    assert config.model_type == "qwen3_5_text" and config.hidden_size == mc.hidden_size
    assert_trees_equal(params, saved)

    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.array([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits.numpy()
    assert logits.shape == (1, 8, 64) and np.isfinite(logits).all()
    ours = np.asarray(models.forward(config, params, ids))
    assert np.abs(ours - logits).max() < 1e-3  # same weights, same function (parity is tested elsewhere)

    # bf16 export: half the bytes, load_hf reads it back as bf16 weights
    out16 = str(tmp_path / "hf16")
    assert main(["export", "--workdir", wd, "--out", out16, "--dtype", "bfloat16"]) == 0
    c16, p16 = models.load_hf(out16, dtype="bfloat16")
    assert p16["embed"].dtype == jax.numpy.bfloat16


@pytest.mark.parametrize("args, message", [
    (["--set", "train.stepz=3"], "unknown key 'train.stepz'"),
    (["--set", "train.steps=abc"], "train.steps=abc: not an integer"),
    (["--set", "checkpoint.every=0"], "'checkpoint.every': must be >= 1"),
    (["--set", "mesh.fsdp=64"], "config section 'mesh': mesh {'data': 1, 'fsdp': 64, 'tensor': 1} needs 64 devices"),
])
def test_bad_values_exit_2_naming_the_key(tmp_path, capsys, args, message):
    cfg = tmp_path / "synthetic.py"
    cfg.write_text(CONFIG)
    rc = main(["midtrain", "--config", str(cfg), "--workdir", str(tmp_path / "w")] + args)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert message in err


def test_command_and_config_must_agree(tmp_path, capsys):
    cfg = tmp_path / "synthetic.py"
    cfg.write_text(CONFIG)
    assert main(["sft", "--config", str(cfg), "--workdir", str(tmp_path / "w")]) == 2
    assert "config key 'stage': 'midtrain' config given to the sft command" in capsys.readouterr().err
    assert main(["export", "--workdir", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")]) == 2
    assert "no checkpoints directory" in capsys.readouterr().err
    assert main(["midtrain", "--config", str(tmp_path / "nope.py"), "--workdir", str(tmp_path / "w")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_user_errors_are_one_line_rc_2_naming_the_file(tmp_path, capsys):
    cfg = tmp_path / "synthetic.py"
    cfg.write_text(CONFIG)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert main(["midtrain", "--config", str(cfg), "--workdir", str(blocker / "run")]) == 2
    assert capsys.readouterr().err.strip() == f"error: --workdir {blocker / 'run'}: cannot be created, {blocker} is a file"
    assert main(["midtrain", "--config", str(cfg), "--workdir", str(blocker)]) == 2
    assert capsys.readouterr().err.strip() == f"error: --workdir {blocker}: exists and is not a directory"
    bad = tmp_path / "bad_syntax.py"
    bad.write_text("def get_config(:\n")
    assert main(["midtrain", "--config", str(bad), "--workdir", str(tmp_path / "w")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {bad}:1: syntax error") and "\n" not in err
