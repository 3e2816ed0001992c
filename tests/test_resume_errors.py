"""Resuming with a changed model shape: one clean error line (rc 2), nothing else on stderr.

Before the layout check in checkpoints.py, orbax started reading every array, the first shape mismatch
raised, and the reads still pending printed "Event loop is closed" / "Exception ignored" traces at exit.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from mimesis_jax.cli import main
from mimesis_jax.checkpoints import CheckpointError, Checkpointer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = textwrap.dedent("""
    from mimesis_jax.config import CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig
    from mimesis_jax.models import ModelConfig
    from mimesis_jax.train.synthetic import SyntheticData

    def get_config():
        model = ModelConfig(model_type="qwen3", vocab_size=64, hidden_size=32, intermediate_size=64,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            rope_theta=10000.0, tie_word_embeddings=False, max_position_embeddings=64,
                            logits_seq_chunk=16, logits_vocab_chunk=32)
        return RunConfig(stage="midtrain", model=model, data=SyntheticData(vocab_size=64, seq_len=16),
                         optimizer=OptimizerConfig(lr=1e-2, warmup_steps=0, schedule="constant"),
                         train=TrainConfig(steps=1, global_batch=2, dtype="float32", progress_bar=False,
                                           tensorboard=False),
                         mesh=MeshConfig(data=1, fsdp=1, tensor=1),
                         checkpoint=CheckpointConfig(every=1, keep=1))
""")


def test_resume_with_a_changed_shape_prints_one_error_line(tmp_path):
    cfg, wd = tmp_path / "tiny.py", tmp_path / "work"
    cfg.write_text(CONFIG)
    assert main(["midtrain", "--config", str(cfg), "--workdir", str(wd)]) == 0
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "mimesis_jax", "midtrain", "--config", str(cfg), "--workdir",
                           str(wd), "--set", "train.steps=2", "model.hidden_size=48"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    want = (f"error: {wd}/checkpoints/1: cannot restore into the current model/optimizer layout: params[embed] has "
            "shape (64, 32) in the checkpoint and (64, 48) in the current model")
    assert len(lines) == 1 and lines[0].startswith(want), proc.stderr
    for bad in ("Traceback", "Event loop is closed", "Exception ignored"):
        assert bad not in proc.stderr + proc.stdout


def test_restore_params_names_a_missing_array(tmp_path):
    import jax
    import numpy as np

    cfg, wd = tmp_path / "tiny.py", tmp_path / "work"
    cfg.write_text(CONFIG)
    assert main(["midtrain", "--config", str(cfg), "--workdir", str(wd)]) == 0
    ck = Checkpointer(str(wd), read_only=True)
    extra = {"embed": jax.ShapeDtypeStruct((64, 32), np.float32), "not_saved": jax.ShapeDtypeStruct((3,), np.float32)}
    with pytest.raises(CheckpointError) as e:
        ck.restore_params(None, extra)
    ck.close()
    assert str(e.value).startswith(f"{wd}/checkpoints/1: cannot restore into the current model/optimizer layout: "
                                   "params[not_saved] is not in the checkpoint")
