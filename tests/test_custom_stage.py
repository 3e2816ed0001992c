"""docs/api.md "Writing your own RL stage" runs as written: its toy world (a World on the toy gym, the default
Cluster and GRPO: train/rl/seams.py) trains two steps of the tiny agent config, and each step's reward_mean is the
mean toy reward (envs/toy.py keyword_reward) of that step's agent replies."""

import json
import math
import os
import re

from mimesis_jax.envs.agent_env import visible_reply
from mimesis_jax.envs.toy import keyword_reward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECTION = "## Writing your own RL stage"
CALL = 'result = train_toy("runs/toy")'
CHEAP = ("rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.mini_batch_prompts=1",
         "rollout.agent_max_tokens=8", "train.progress_bar=false", "train.tensorboard=false",
         "checkpoint.async_save=false")


def _stage_code() -> str:
    """The section's python block, without its last line (the call into runs/toy, which the test makes itself)."""
    with open(os.path.join(ROOT, "docs", "api.md")) as f:
        text = f.read()
    assert SECTION in text, f"docs/api.md has no section {SECTION!r}"
    code = re.search(r"```python\n(.*?)```", text[text.index(SECTION):], re.S).group(1).rstrip()
    assert code.endswith(CALL), code[-200:]
    return code[:-len(CALL)]


def test_the_documented_custom_stage_trains_and_logs_its_reward(tmp_path, monkeypatch):
    ns: dict = {}
    exec(compile(_stage_code(), "docs/api.md", "exec"), ns)
    monkeypatch.chdir(ROOT)  # the block names its config relative to the repository root
    steps: dict[int, list] = {}
    real = ns["RLLearner"]

    class Watched(real):  # the block's learner, recording each step's rollouts
        def __init__(self, *a, **kw):
            super().__init__(*a, on_rollouts=lambda s, outs: steps.setdefault(s, list(outs)), log=lambda *_: None,
                             **kw)
    ns["RLLearner"] = Watched
    result = ns["train_toy"](str(tmp_path), CHEAP)
    assert (result.start_step, result.final_step) == (0, 2) and sorted(result.metrics) == [1, 2]
    with open(tmp_path / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2]
    for s, rec in result.metrics.items():
        outs = steps[s]
        assert len(outs) == 2 * 2 and rec["rollouts"] == len(outs)  # prompts_per_step x group_size
        replies = [seg.text for t in outs for seg in t.segments if seg.kind == "agent"]
        assert len(replies) == len(outs)  # one agent turn each (max_steps=1)
        expected = sum(keyword_reward(visible_reply(r), "s") for r in replies) / len(replies)
        assert math.isclose(rec["reward_mean"], expected, rel_tol=0, abs_tol=1e-12), (s, rec["reward_mean"], expected)
        assert rec["updates"] == 2 and math.isfinite(rec["loss"])  # one update per mini-batch of 1 prompt
