"""The main job end to end (README's first command), shortened: tiny mid-training -> SFT -> export -> load_hf."""

import json
import os

import numpy as np
import pytest

from mimesis_jax import models
from mimesis_jax.cli import main
from mimesis_jax.train.metrics import read_metrics


@pytest.mark.slow
def test_demo_runs_both_stages_and_exports(tmp_path, capsys):
    root = str(tmp_path / "demo")
    assert main(["demo", "--workdir", root, "--set", "train.steps=12", "train.progress_bar=false"]) == 0
    out = capsys.readouterr().out
    assert "init: weights from" in out and "midtrain" in out  # SFT started from the mid-training checkpoint
    for stage in ("midtrain", "sft"):
        recs = read_metrics(os.path.join(root, stage))
        assert [r["step"] for r in recs] == list(range(1, 13))
        assert all(np.isfinite(r["loss"]) for r in recs)
        with open(os.path.join(root, stage, "run_config.json")) as f:
            run = json.load(f)
        assert run["model"]["model_type"] == "qwen3_5_text" and run["stage"] == stage
    mid = read_metrics(os.path.join(root, "midtrain"))
    assert np.mean([r["loss"] for r in mid[-3:]]) < np.mean([r["loss"] for r in mid[:3]])
    config, params = models.load_hf(os.path.join(root, "hf"))
    assert config.model_type == "qwen3_5_text" and config.vocab_size == 1024
    assert os.path.isfile(os.path.join(root, "hf", "tokenizer.model"))
    assert "load_hf(" in out and "logits finite: True" in out
