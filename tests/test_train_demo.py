"""The main job end to end (README's first command), shortened: tiny mid-training -> SFT -> joint RL -> export ->
load_hf -> tiny agent GRPO and GRPO + CSD on the toy gym with the frozen simulator as the coach -> table and plot."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from helpers import subprocess_env

from mimesis_jax import models
from mimesis_jax.train.metrics import read_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_demo_runs_both_stages_and_exports(tmp_path):
    """The README's demo command in a fresh process on one CPU device, as a user runs it: in the test process the 8
    fake devices of tests/conftest.py made every stage compile 8-way sharded programs (most of this test's time).
    It compiles at the suite's fast setting (tests/conftest.py): the tiny stages' cost is compiling, not running."""
    root = str(tmp_path / "demo")
    env = subprocess_env(PYTHONUNBUFFERED="1")
    proc = subprocess.run([sys.executable, "-m", "mimesis_jax", "demo", "--workdir", root, "--set", "train.steps=12",
                           "train.progress_bar=false", "--simrl-steps", "1", "--agent-steps", "2",
                           # half the demo's RL batches (the stages' own tests cover the full ones): 2 prompts x 4
                           # rollouts for simrl (one update of 4 micro-batches), 4 tasks per agent step; the CSD
                           # arm's coach notes of at most 32 tokens instead of 256 (sampling the notes was most of
                           # that arm's time; the notes still reach the fused teacher's branch rows)
                           "--simrl-set", "rollout.prompts_per_step=2",
                           "--agent-set", "rollout.prompts_per_step=4", "users.coach_max_tokens=32"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = proc.stdout
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
    # Stage I joint RL started from the SFT checkpoint; its result is what gets exported and coaches Stage II
    sim = read_metrics(os.path.join(root, "simrl"))
    assert [r["step"] for r in sim] == [1] and all(np.isfinite(r["reward_mean"]) for r in sim)
    assert {"reward/hitom", "reward/abcd_behaviour"} & set(sim[0]) and "=== export" in out
    with open(os.path.join(root, "simrl", "run_config.json")) as f:
        sim_run = json.load(f)
    assert sim_run["init"]["from_workdir"] == os.path.join(root, "sft")
    assert sim_run["rl"]["num_microbatches"] == 4  # the demo's simrl updates in 4 micro-batches (its peak RSS)
    assert sim_run["rollout"]["prompts_per_step"] == 2 and sim[0]["rollouts"] == 8  # --simrl-set reached the run
    with open(os.path.join(root, "agent_csd", "run_config.json")) as f:
        csd_run = json.load(f)
    # --agent-set reached the run
    assert csd_run["rollout"]["prompts_per_step"] == 4 and csd_run["users"]["coach_max_tokens"] == 32
    assert csd_run["users"]["coach"] == os.path.join(root, "simrl")  # the Stage I result coached
    config, params = models.load_hf(os.path.join(root, "hf"))
    assert config.model_type == "qwen3_5_text" and config.vocab_size == 1024
    assert os.path.isfile(os.path.join(root, "hf", "tokenizer.model"))
    assert "load_hf(" in out and "logits finite: True" in out
    # Stage II: both arms ran 2 steps; only the CSD arm asked the coach (the frozen Stage I simulator)
    grpo, csd = (read_metrics(os.path.join(root, f"agent_{arm}")) for arm in ("grpo", "csd"))
    assert [r["step"] for r in grpo] == [r["step"] for r in csd] == [1, 2]
    assert all(r["coach_notes"] == 0 for r in grpo) and sum(r["coach_notes"] for r in csd) > 0
    assert all(np.isfinite(r["reward_mean"]) and r["invalid"] == 0 for r in grpo + csd)
    table = open(os.path.join(root, "agent_rl_summary.md")).read()
    assert table.splitlines()[2].startswith("| grpo | 2 |") and table.splitlines()[3].startswith("| csd | 2 |")
    with open(os.path.join(root, "agent_rl_rewards.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
