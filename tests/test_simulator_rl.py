"""Stage I joint RL (train/rl/simulator.py) on the tiny config: a single-turn (hitom) and a multi-turn
(abcd_behaviour) domain, finite metrics with per-domain rewards, invalid rollouts counted, FoldGRPO advantages
against a formula written here, resume == uninterrupted through the CLI, config errors named.

The runs are marked slow: they compile the tiny Qwen3.5 RL step at 2,048-token rows, which twice crashed inside
XLA's CPU compiler (SIGSEGV / SIGABRT, no message) late in the ~1,300-test single default process on the CI machine
while passing alone and in a short process. The suite now runs on three workers, dearest module first
(tests/conftest.py), so this module starts a worker's life instead of ending a long one."""

import json
import os

import numpy as np
import pytest

from mimesis_jax import cli
from mimesis_jax.algorithms import rl_batch
from mimesis_jax.envs.domains import SideModels
from mimesis_jax.envs.toy import ToyBehaviourJudge, ToySupportAgent
from mimesis_jax.errors import ConfigError
from mimesis_jax.inference import sampler
from mimesis_jax.chat.base import ChatResponse
from mimesis_jax.episodes.simulator import SimRollout
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.train.rl import simulator as S
from mimesis_jax.train.rl.learner import BUSY_KEYS, COMPILATION_KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "tiny_simrl.py")
TIMING = ("rollout_s", "train_s", "rollout_tokens_per_s",
          "train_tokens_per_s", "step_s") + COMPILATION_KEYS + BUSY_KEYS  # process-local: a resumed process compiles again
SMALL = ["train.progress_bar=false", "train.tensorboard=false", "rollout.prompts_per_step=2", "rollout.group_size=2",
         "rollout.mini_batch_prompts=1", "rollout.max_tokens=8", "domains.max_user_turns=2",
         "checkpoint.async_save=false", "validation.every=2", "validation.max_records=1",
         "mesh.fsdp=1",  # one device: the tiny Qwen3.5 gains nothing from the 8 fake devices but compile time
         # rows of 1,536 tokens, = the context budget (as the 9B config sets both equal): the sampled ABCD dialogues
         # reach 1,338 tokens with the tiny tokenizer, and the config's 2,048 made each step ~1.8x the attention work
         "rollout.row_len=1536", "rollout.max_context_tokens=1536",
         # one step program: 2 rows per dialogue (an ABCD rollout's two 700..1,338-token segments need a row each)
         # for every mini-batch; one sampler program: calls of <= 4 sequences (also test_invalid_rollouts' 6)
         "rollout.row_rungs=(2.0,)", "rollout.max_batch=4"]


class FlakyJudge(ToyBehaviourJudge):
    """The toy judge, failing (an endpoint error) on every third request it gets (deterministic with one env
    worker). Counting calls, not hashing the request text, keeps the failures independent of prompt wording."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls = 0

    def chat(self, messages, **kw):
        self.calls += 1
        if self.calls % 3 == 1:
            return ChatResponse("", finish_reason="error", meta={"error": "judge endpoint 503"})
        return super().chat(messages, **kw)


def _strip(rec):
    return {k: v for k, v in rec.items() if k not in TIMING}


def _recording_sampler(mp, shapes):
    """Records the (batch, prompt, new tokens) of every compiled sampler call (sampler.generate_bucket)."""
    inner = sampler.generate_bucket

    def call(config, params, n_new, filtering, tokens, *a, **kw):
        shapes.add((*tokens.shape, n_new, filtering))
        return inner(config, params, n_new, filtering, tokens, *a, **kw)
    mp.setattr(sampler, "generate_bucket", call)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    wd = tmp_path_factory.mktemp("simrl")
    seen, shapes, packed = {}, set(), []
    # rollout.max_context_tokens = row_len (SMALL): test_row_len_equal_to_the_context_limit_trains reads this run's
    # first step; validation runs at step 2 only
    with pytest.MonkeyPatch.context() as mp:
        _recording_sampler(mp, shapes)
        pack = rl_batch.pack_trajectories
        mp.setattr(rl_batch, "pack_trajectories", lambda *a, **kw: packed.append(pack(*a, **kw)) or packed[-1])
        traced = sampler.trace_count()
        res = S.run(S.load(CONFIG, SMALL + ["train.steps=2"]),
                    str(wd), handle_signals=False,
                    on_rollouts=lambda step, outs: seen.__setitem__(step, outs), log=lambda *a: None)
    return res, seen, {"sampler_shapes": shapes, "sampler_traces": sampler.trace_count() - traced,
                       "packed": packed}


@pytest.mark.slow  # early in a worker: see the module docstring
def test_one_step_program_and_one_sampler_program(straight):
    """The run's fixed shapes (train/rl/ladder.py ladder_for_config, chat_models.fixed_buckets): every mini-batch of both
    steps packs to the ladder's one program, 4 rows of 1,536 tokens (2 per dialogue), and every policy call,
    validation included, to one sampler program: 4 sequences x the 1,528-token prompts the context budget allows
    (1,536 - 8 new tokens) + 8 new tokens; each compiled once (the metrics' compilations/*; sampler traces), and
    nothing in step 2."""
    res, _, c = straight
    m1, m2 = res.metrics[1], res.metrics[2]
    assert [m["compilations/update"] for m in (m1, m2)] == [1, 1]
    assert m1["compilations/sampler"] <= 1 and m1["compilations/engine"] == 0
    assert all(m2[k] == m1[k] for k in COMPILATION_KEYS)
    assert {p.shape_key for p in c["packed"]} == {(4, 1536, 1536, 0, 0)} and len(c["packed"]) == 4
    assert not any(p.ladder_overflow for p in c["packed"])
    assert c["sampler_shapes"] == {(4, 1528, 8, 0)} and c["sampler_traces"] <= 1


@pytest.mark.slow  # early in a worker: see the module docstring
def test_metrics_domains_and_unique_rollout_ids(straight):
    res, seen, _ = straight
    assert sorted(res.metrics) == [1, 2] and res.checkpoint_step == 2
    domains_seen = set()
    for step, rec in res.metrics.items():
        outs = seen[step]
        assert all(np.isfinite(v) for v in rec.values() if isinstance(v, float)), rec
        assert rec["rollouts"] == len(outs) == 4 and rec["segments"] == sum(len(o.segments) for o in outs)
        for d in {o.domain for o in outs}:
            domains_seen.add(d)
            assert rec[f"reward/{d}"] == pytest.approx(np.mean([o.reward for o in outs if o.domain == d]))
        for o in outs:
            assert 0.0 <= o.reward <= 1.0 and o.status == "ok"
            if o.domain == "hitom":
                assert len(o.segments) == 1
            else:  # two customer turns, each its own segment sharing the rollout id
                assert len(o.segments) == 2 and {s.rollout_id for s in o.segments} == {o.rollout_id}
                assert "meta_narration_rate" in rec
    assert domains_seen == {"hitom", "abcd_behaviour"}
    ids = [o.rollout_id for outs in seen.values() for o in outs]
    assert len(set(ids)) == len(ids) == 8
    # validation at step 2 only: one temperature-0 rollout per held-out record and domain
    assert not any(k.startswith("val/") for k in res.metrics[1])
    assert {k for k in res.metrics[2] if k.startswith("val/")} == {"val/hitom", "val/abcd_behaviour", "val/invalid"}
    assert res.metrics[2]["val/invalid"] == 0 and 0.0 <= res.metrics[2]["val/abcd_behaviour"] <= 1.0
    # running mean: over every rollout of the domain so far
    allb = [o.reward for s in (1, 2) for o in seen[s] if o.domain == "abcd_behaviour"]
    assert res.metrics[2]["reward_running/abcd_behaviour"] == pytest.approx(np.mean(allb))


@pytest.mark.slow  # early in a worker: see the module docstring
def test_resume_through_the_cli_reproduces_the_uninterrupted_run(straight, tmp_path):
    res, _, _ = straight
    args = ["simrl", "--config", CONFIG, "--workdir", str(tmp_path), "--set"] + SMALL
    assert cli.main(args + ["train.steps=1", "checkpoint.every=1"]) == 0
    assert cli.main(args + ["train.steps=2", "checkpoint.every=1"]) == 0  # resumes from step 1
    recs = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        want = _strip(res.metrics[r["step"]])
        got = {k: v for k, v in r.items() if k in want}
        assert got == pytest.approx(want), r["step"]


@pytest.mark.slow  # early in a worker: see the module docstring
def test_trained_simulator_exports_for_the_agent_stage(straight, tmp_path):
    """The hand-off: the simrl checkpoint exports to a HF directory that load_hf reads back exactly, and the
    agent stage's user spec accepts the workdir itself (chat/specs.py via export.load_trained)."""
    import jax

    from mimesis_jax import models
    from mimesis_jax.checkpoints import load_trained
    from mimesis_jax.train.export import export_hf

    res, _, _ = straight
    assert export_hf(res.workdir, str(tmp_path / "hf"), log=lambda *a: None) == 2
    config, params = models.load_hf(str(tmp_path / "hf"))
    mc, trained, step, tok = load_trained(res.workdir)
    assert step == 2 and tok == "tiny" and config.model_type == mc.model_type == "qwen3_5_text"
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(trained)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow  # early in a worker: see the module docstring
def test_invalid_rollouts_leave_their_group(tmp_path):
    sides = SideModels(judge=FlakyJudge(), partner=ToySupportAgent(), support_agent=ToySupportAgent())
    seen = {}
    cfg = S.load(CONFIG, SMALL + ["train.steps=1", "rollout.group_size=3", "rollout.min_valid_per_group=2",
                                  'domains.weights=(("abcd_behaviour", 1.0),)'])
    shapes = set()
    with pytest.MonkeyPatch.context() as mp:
        _recording_sampler(mp, shapes)
        res = S.run(cfg, str(tmp_path), sides=sides, handle_signals=False,
                    on_rollouts=lambda step, outs: seen.__setitem__(step, outs), log=lambda *a: None)
    # 6 rollouts in chunks of rollout.max_batch=4: the module run's one sampler program (compiled there once)
    assert shapes == {(4, 1528, 8, 0)}
    n_invalid = 0
    for step, rec in res.metrics.items():
        outs = seen[step]
        bad = [o for o in outs if o.status != "ok"]
        n_invalid += len(bad)
        assert rec["invalid"] == len(bad) and all("judge endpoint 503" in o.invalid_reason for o in bad)
        per_group = {}
        for o in outs:
            per_group[o.group_id] = per_group.get(o.group_id, 0) + (o.status == "ok")
        assert rec["skipped_groups"] == sum(v < 2 for v in per_group.values())
        assert rec["reward/abcd_behaviour"] == pytest.approx(np.mean([o.reward for o in outs if o.status == "ok"]))
    assert n_invalid > 0


def _rollout(rid, gid, reward, k):
    segs = [Trajectory([Segment("public", [1, 2]), Segment("agent", [3, 4], [-0.1, -0.2])], [reward], group_id=gid,
                       rollout_id=rid) for _ in range(k)]
    return SimRollout(segs, "d", gid, rid, reward=reward)


def test_fold_advantages_count_each_rollout_once():
    rollouts = [_rollout(0, 0, 1.0, 3), _rollout(1, 0, 0.0, 1), _rollout(2, 0, 0.5, 2), _rollout(3, 1, 0.2, 4),
                _rollout(4, 1, 0.6, 1)]
    bad = _rollout(5, 1, 0.0, 2)
    bad.status, bad.reward = "invalid", None
    segs, adv = S.fold_advantages(rollouts + [bad])
    assert len(segs) == 11 and all(len(a) == 1 for a in adv)
    g0 = np.array([1.0, 0.0, 0.5])
    g1 = np.array([0.2, 0.6])
    per_rollout = {0: (1.0 - g0.mean()) / (g0.std(ddof=1) + 1e-6), 1: (0.0 - g0.mean()) / (g0.std(ddof=1) + 1e-6),
                   2: (0.5 - g0.mean()) / (g0.std(ddof=1) + 1e-6), 3: (0.2 - g1.mean()) / (g1.std(ddof=1) + 1e-6),
                   4: (0.6 - g1.mean()) / (g1.std(ddof=1) + 1e-6)}
    np.testing.assert_allclose([a[0] for a in adv], [per_rollout[s.rollout_id] for s in segs], rtol=1e-12)
    # the naive ablation: statistics over segments (rollout 0 counted 3 times, rollout 3 four times)
    _, naive = S.fold_advantages(rollouts, fold=False)
    n0 = np.array([1.0] * 3 + [0.0] + [0.5] * 2)
    assert naive[0][0] == pytest.approx((1.0 - n0.mean()) / (n0.std(ddof=1) + 1e-6))


@pytest.mark.parametrize("sets,match", [
    (["rl.alpha=0.01"], "rl.alpha"),
    (["rl.credit=infopo"], "rl.credit"),
    (['domains.weights=(("nope", 1.0),)'], "unknown domain 'nope'"),
    (['domains.weights=(("hitom", 0.0),)'], "every weight is 0"),
    (['domains.weights=(("hitom", -1.0),)'], "must be a finite number >= 0"),
    (['domains.sources=(("hitom", "/no/such/file.jsonl"),)'], "domains.sources.*does not exist"),
    (["rollout.group_size=1"], "rollout.group_size"),
    (["domains.neutral_share=1.5"], "domains.neutral_share"),
    (["rollout.row_rungs=(0.5, 0.0)"], "'rollout.row_rungs': must be a tuple of finite numbers > 0"),
    (["rollout.head_rungs=(0.5, 1.5)"], "'rollout.head_rungs': must be a tuple of numbers in \\(0, 1\\]"),
    (["rollout.branch_head_rungs=(0,)"], "'rollout.branch_head_rungs': must be a tuple of numbers in \\(0, 1\\]"),
])
def test_config_errors_name_the_key(tmp_path, sets, match):
    with pytest.raises(ConfigError, match=match):
        S.run(S.load(CONFIG, SMALL + sets), str(tmp_path), handle_signals=False, log=lambda *a: None)


def test_paper_configs():
    cfg = S.load(os.path.join(ROOT, "configs", "mimesis_simrl.py:9b")).validate()
    assert (cfg.train.steps, cfg.rollout.prompts_per_step, cfg.rollout.group_size) == (500, 64, 8)
    assert cfg.optimizer.lr == 8e-6 and cfg.rl.kl_coef == 0.0 and cfg.rl.alpha == 0.0 and cfg.rollout.thinking
    assert cfg.model.hidden_size == 4096 and cfg.mesh.axes() == {"data": 2, "fsdp": 4, "tensor": 2}
    assert cfg.domains.weights == () and cfg.rollout.fold
    four = S.load(os.path.join(ROOT, "configs", "mimesis_simrl.py:4b"))
    assert four.model.hidden_size == 2560 and four.init.from_workdir == "runs/mimesis_4b_sft"
    # ablation switches
    off = S.load(os.path.join(ROOT, "configs", "mimesis_simrl.py:9b"), ["domains.behaviour=false"])
    w = S.domain_weights(off.domains)
    assert w["abcd_behaviour"] == 0.0 and len(w) == 24 and sum(v > 0 for v in w.values()) == 23


def test_rollouts_with_no_policy_turn_are_skipped_and_counted(tmp_path):
    """row_len == rollout.max_context_tokens = 256, shorter than every tiny prompt + max_tokens: each rollout
    finishes ok before its first policy turn (no segment to train on). They are counted (no_policy_turn), do not
    count as their group's valid rollouts (every group skipped) and the step makes no update -- before, such
    groups were kept and the update crashed on an empty mini-batch."""
    seen = {}
    cfg = S.load(CONFIG, SMALL + ["train.steps=1", "validation.every=0", "rollout.row_len=256",
                                  "rollout.max_context_tokens=256"])
    res = S.run(cfg, str(tmp_path), handle_signals=False, log=lambda *a: None,
                on_rollouts=lambda step, outs: seen.__setitem__(step, outs))
    rec, outs = res.metrics[1], seen[1]
    assert len(outs) == 4 and all(o.status == "ok" and o.end == "context_limit" and not o.segments for o in outs)
    assert (rec["no_policy_turn"], rec["skipped_groups"], rec["segments"], rec["invalid"]) == (4, 2, 0, 0)


@pytest.mark.slow  # early in a worker: see the module docstring
def test_row_len_equal_to_the_context_limit_trains(straight):
    """row_len == rollout.max_context_tokens (as the 9B config sets it): every policy turn's segment (its prompt and
    sample) fits one row and the step trains. Step 1 of the module's run, which sets both to 1536 (a run of its own
    cost a second compilation of the same step)."""
    res, seen, _ = straight
    with open(os.path.join(res.workdir, "run_config.json")) as f:
        run = json.load(f)
    assert run["rollout"]["row_len"] == run["rollout"]["max_context_tokens"] == 1536
    rec, outs = res.metrics[1], seen[1]
    segs = [s for o in outs for s in o.segments]
    assert segs and all(len(s.student_tokens()) <= 1536 for s in segs)
    assert rec["segments"] == len(segs) and rec["no_policy_turn"] == 0
    assert "clip_frac_last" in rec and np.isfinite(rec["loss"])  # clip_frac_last: logged only after an update


@pytest.mark.parametrize("sets,match", [
    (["rollout.row_len=1024", "rollout.max_context_tokens=2048"], r"'rollout.row_len': must be >= "),
    (["rollout.row_len=0", "rollout.max_context_tokens=20"], r"'rollout.max_context_tokens': = 20 leaves no room .*"
     r"rollout.max_tokens=8 \+ 16 header tokens need 24; raise rollout.max_context_tokens"),
])
def test_context_budget_errors_name_the_key(sets, match):
    with pytest.raises(ConfigError, match=match):
        S.load(CONFIG, SMALL + sets).validate()
