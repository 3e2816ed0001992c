"""All eight gyms in ONE batched run of the episode runner with the tiny local (JAX sampler) agent, token-exact;
and the `python -m mimesis_jax rollout` command end to end (trajectories JSONL + per-gym summary)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from mimesis_jax import cli
from mimesis_jax.algorithms.logprobs import token_logprobs
from mimesis_jax.envs.userrl import GYM_MODULES, shipped_tasks
from mimesis_jax.episodes.userrl import episode_tasks, trajectory_record
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.chat.local import LocalChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, run_episodes
from mimesis_jax.chat.specs import tiny_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_gym_with_the_tiny_local_agent_in_one_batch():
    config, params, tok = tiny_model("qwen3", seed=0)
    agent = LocalChatModel(config, params, tok, max_tokens=12, temperature=1.0, seed=5)
    tasks = []
    for gym in GYM_MODULES:
        tasks.append(next(t for t in shipped_tasks("test", [gym])))
    user, judge = ScriptedChatModel(["Yes."]), ScriptedChatModel(['{"judgment": "No"}'])
    ep = episode_tasks(tasks, group_size=1, first_rollout_id=100, seed=3, user=user, judge=judge)
    trajs = run_episodes(agent, None, ep, EpisodeConfig(max_turns=2, agent_max_tokens=12, seed=1))
    assert [t.task["gym"] for t in trajs] == list(GYM_MODULES)
    assert [t.rollout_id for t in trajs] == list(range(100, 108))
    # token-exact: the sampler's log-probs are the model's log-probs of the recorded student sequence, scored in one
    # jitted forward over the eight sequences right-padded to the longest (causal: padding after a sequence leaves
    # its positions' log-probs unchanged); eight eager calls of different lengths cost ~20 CPU s of op compiles
    seqs = [t.student_tokens() for t in trajs]
    padded = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    for i, seq in enumerate(seqs):
        padded[i, :len(seq)] = seq
    lps = np.asarray(jax.jit(lambda p, ids: token_logprobs(config, p, ids))(params, padded))
    for t, seq, lp in zip(trajs, seqs, lps):
        assert t.status == "ok", (t.task, t.invalid_reason)
        assert 1 <= t.num_agent_turns <= 2 and len(t.env_info) == t.num_agent_turns
        pos = 0
        for seg in t.student_segments():
            if seg.kind == "agent":
                np.testing.assert_allclose(seg.logprobs, lp[pos - 1:pos - 1 + len(seg.tokens)], atol=2e-5)
            pos += len(seg.tokens)
        rec = json.loads(json.dumps(trajectory_record(t)))
        assert rec["status"] == "ok" and rec["train_reward"] == max(s["reward"] for s in t.env_info)
        assert sum(len(s["tokens"]) for s in rec["segments"]) == len(seq)


@pytest.mark.slow
def test_rollout_command_writes_trajectories_and_a_summary(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    cmd = [sys.executable, "-m", "mimesis_jax", "rollout", "--agent", "tiny", "--user", "tiny",
           "--gyms", "FunctionGym,TauGym,SearchGym", "--n", "5", "--group", "2", "--max-turns", "2",
           "--agent-max-tokens", "16", "--user-max-tokens", "16", "--judge-max-tokens", "16", "--batch", "4",
           "--max-prompt-tokens", "0", "--out", str(out)]
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 10 and len({r["rollout_id"] for r in recs}) == 10
    groups = {}
    for r in recs:
        groups.setdefault(r["group_id"], []).append(r["task"]["id"])
    assert all(len(v) == 2 and len(set(v)) == 1 for v in groups.values())  # --group 2: two episodes per task
    gyms = {r["task"]["gym"] for r in recs}
    assert gyms <= {"FunctionGym", "TauGym", "SearchGym"}
    for line in proc.stdout.splitlines():
        if line.startswith(tuple(gyms)):
            name, episodes, valid, invalid = line.split()[:4]
            n = sum(r["task"]["gym"] == name for r in recs)
            assert int(episodes) == n and int(valid) + int(invalid) == n
    assert "overall" in proc.stdout and "10 episodes in" in proc.stdout
    # the two refusals run in this process (cli.main's exit status and stderr are the command's): a subprocess each
    # cost a fresh jax import and tokenizer load
    capsys.readouterr()
    assert cli.main(cmd[3:-2] + ["--gyms", "ChessGym", "--out", str(out)]) == 2
    assert "unknown gyms ['ChessGym']" in capsys.readouterr().err
    # the tiny tokenizer makes every shipped prompt longer than UserRL's 1,152-token limit: a clear error says so
    assert cli.main(cmd[3:-4] + ["--out", str(out)]) == 2
    assert "dropped for prompts of >= 1152 tokens" in capsys.readouterr().err
