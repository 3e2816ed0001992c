"""Stable compiled shapes (algorithms/rl_batch.ShapeLadder): on a synthetic length mix with the paper's Stage II
structure (configs/qwen3_8b_agentrl.py: rows of 9,344 tokens, 16 prompts x 8 dialogues per mini-batch, 16 turns,
4 micro-batches on fsdp 8) 200 mini-batches pack to at most 2 GRPO and 4 CSD step programs, all of them listed by
the ladder (what `plan` prints), with the padding cost of the ladders counted from the sizes and checked against
the packed arrays; padding leaves the loss and gradients of the unpadded batch; the learner's logged
num_compilations (jax's compile events) equals the distinct shapes its packing produced. Stage I.3 the same way
(configs/mimesis_simrl.py:9b: 200 mini-batches of simulator segments, at most 3 programs, listed by `plan` with
its one sampler program). The Stage II policy's sampler on its prompt ladder (chat_models.ladder_buckets): the
programs `plan` lists, all reached by the first step of a paper-like step's growing contexts."""

import dataclasses
import math
import os

import numpy as np
import optax
import pytest

from rl_helpers import ScriptedDraws, random_batch, scaled_params, tiny_config, tree_rel_err
from mimesis_jax.algorithms import rl_batch
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.plan import mix, workload
from mimesis_jax.train.rl import agent as A, learner as L
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch
from mimesis_jax.train.rl.ladder import ladder_for_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER = os.path.join(ROOT, "configs", "qwen3_8b_agentrl.py")
MINIBATCHES = 200
HEADER = mix.HEADER
# the paper RL configs sample through the rollout engine (issue #43 item 5); their static sampler, whose programs
# the sampler tests here are about, is this
STATIC = ("rollout.engine=false", "rollout.max_batch=256")


def _paper(variant, sets=()):
    cfg = workload.load_run_config(f"{PAPER}:{variant}", list(sets))
    m = cfg.mesh
    multiple = cfg.rl.num_microbatches * workload.batch_multiple(cfg.model, {"data": m.data, "fsdp": m.fsdp,
                                                                              "tensor": m.tensor})
    return cfg, multiple


_dialogue_plan = mix.agent_dialogue  # the synthetic paper-like mix `plan` reports the LM-head padding on
_sizes = mix.dialogue_sizes


def _trajectory(rng, plan, rid):
    segs = [Segment(k, rng.randint(1, 1000, size=n).tolist()) for k, n in plan]
    turns = sum(k == "agent" for k, _ in plan)
    return Trajectory(segs, turn_rewards=[0.0] * turns, group_id=rid // 8, rollout_id=rid)


def _padding(key, s, fused):
    """Padded / real tokens per dimension of one mini-batch: trunk, head (agent), branch, branch head (coached)."""
    B, T, Ka, Tb, Kc = key
    real = [s[0].sum(), s[-1].sum() if not fused else s[2].sum()]
    padded = [B * T, B * Ka]
    if fused:
        real += [s[1].sum(), s[3].sum()]
        padded += [B * Tb, B * Kc]
    return np.array(padded, np.int64), np.array(real, np.int64)


_MIX = {}


def _paper_mix(cfg):
    """The 200 mini-batches' sizes [4, 128] (fused: trunk, branch, agent, coached), drawn once for both variants
    (they share every rollout setting)."""
    if not _MIX:
        n = cfg.rollout.mini_batch_prompts * cfg.rollout.group_size
        rng = np.random.RandomState(2025)
        _MIX["sizes"] = [_sizes([_dialogue_plan(rng, cfg, 0.5) for _ in range(n)], True) for _ in range(MINIBATCHES)]
    return _MIX["sizes"]


@pytest.mark.parametrize("variant,most", [("grpo", 2), ("csd", 6)])
def test_paper_mix_compiles_a_bounded_known_set_of_programs(variant, most):
    """The head rungs (rollout.head_rungs = 0.55, 1 of the row, per row of a head group: the rows of one device
    in one micro-batch) and, with CSD, the teacher's branch-head rungs (rollout.branch_head_rungs = 0.5, 0.7 and 1
    of the head) against the ladder of one rung each (the whole row; min(branch, head)): fewer padded LM-head
    positions, at most 1.5 x the agent tokens, and for CSD at most 1.5 x the coached tokens in the teacher's head
    and 1.5 x the agent + coached tokens in both heads together; all costs printed."""
    cfg, multiple = _paper(variant)
    ladder = ladder_for_config(cfg, multiple)
    fused = variant == "csd"
    assert ladder.fused == fused and ladder.row_len == cfg.rollout.row_len == 9344
    assert ladder.rows == (64, 96, 128)  # 1/2, 3/4, 1 of 16 x 8 dialogues, multiples of 4 micro-batches x fsdp 8
    assert ladder.head == (5184, 9344)  # 0.55 of 9,344 rounded up to 64, and the row
    # the longest branch block: 8,192 agent tokens + 16 turns x (256 + 32) note tokens = 12,800
    assert ladder.branch == ((6400, 12800) if fused else ())
    assert ladder.branch_head == ((0.5, 0.7, 1.0) if fused else ())
    listed = ladder.programs()
    # every (rows, branch, head, branch-head fraction): the branch head rounded up to 64, within the branch and head
    want = {(B, 9344, K, Tb, min(Tb, K, -(-math.ceil(f * K) // 64) * 64) if Tb else 0)
            for B in ladder.rows for K in ladder.head for Tb in (ladder.branch or (0,))
            for f in (ladder.branch_head or (1,))}
    assert len(listed) == len(want) == (33 if fused else 6) and set(listed) == want
    assert listed == list(workload.workload_from_config(cfg, {"data": 1, "fsdp": 8, "tensor": 2}, cfg.model).programs)
    one_rung = dataclasses.replace(ladder, head=(), branch_head=())
    seen, before = {}, set()
    padded, real, padded_one = 0, 0, 0
    for s in _paper_mix(cfg):
        s = s if fused else s[[0, 2]]
        key, overflow = rl_batch.ladder_shape_key(s, ladder, multiple)
        assert not overflow and key in listed
        seen[key] = seen.get(key, 0) + 1
        p, r = _padding(key, s, fused)
        padded, real = padded + p, real + r
        padded_one = padded_one + _padding(rl_batch.ladder_shape_key(s, one_rung, multiple)[0], s, fused)[0]
        # the fine ladders the packer used before (rows, head and branch dims each on their own)
        _, old, _ = rl_batch._choose_shapes(s, [ladder.row_len] + [None] * (len(s) - 1), fused=fused, ladder=None,
                                            num_rows=None, head_len=None, branch_len=None, branch_head_len=None,
                                            rows_multiple=multiple, pad_multiple=64)
        before.add(old)
    cost, cost_one = padded / real, padded_one / real
    names = ["trunk", "head", "branch", "branch_head"][:len(cost)]
    print(f"{variant}: {len(seen)} programs of {len(listed)} over {MINIBATCHES} mini-batches (fine ladders: "
          f"{len(before)}); uses {dict(sorted(seen.items()))}; padded / real tokens: "
          + ", ".join(f"{k} {v:.3f} (one rung {w:.3f})" for k, v, w in zip(names, cost, cost_one))
          + (f", both heads {(padded[1] + padded[3]) / (real[1] + real[3]):.3f}" if fused else ""))
    assert len(seen) <= most and len(before) > most
    assert cost[1] < cost_one[1] and cost[0] == cost_one[0]  # the head rungs cut head padding, not the rows
    assert cost[1] <= 1.5
    if fused:  # the teacher's head: its own rungs; both heads' work together
        assert cost[3] < cost_one[3] and cost[2] == cost_one[2]
        assert cost[3] <= 1.5 and padded[1] + padded[3] <= 1.5 * (real[1] + real[3])


@pytest.mark.parametrize("variant", ["grpo", "csd"])
def test_packed_arrays_have_the_ladder_shape_and_the_counted_padding(variant):
    """Two paper-size mini-batches packed for real: the arrays have the shape key `ladder_shape_key` gives from
    the sizes, their padding (zero segment ids, masks, branch ids) is the one counted from the sizes, and so are
    the step record's pad/head_fraction and (CSD) pad/branch_head_fraction."""
    cfg, multiple = _paper(variant)
    ladder = ladder_for_config(cfg, multiple)
    fused = variant == "csd"
    rng = np.random.RandomState(5)
    for _ in range(2):
        plans = [_dialogue_plan(rng, cfg, 0.5) for _ in range(128)]
        trs = [_trajectory(rng, p, i) for i, p in enumerate(plans)]
        packed = rl_batch.pack_trajectories(trs, teacher="fused" if fused else "none", use_rollout_logprobs=False,
                                            rows_multiple=multiple, ladder=ladder)
        s = _sizes(plans, fused)
        key, _ = rl_batch.ladder_shape_key(s, ladder, multiple)
        a = packed.arrays
        assert packed.shape_key == key and not packed.ladder_overflow
        p, r = _padding(key, s, fused)
        got_real = [(a["segment_ids"] > 0).sum(), a["agent_mask"].sum()]
        got_padded = [a["tokens"].size, a["head_idx"].size]
        if fused:
            got_real += [(a["branch_ids"] > 0).sum(), a["coached_mask"].sum()]
            got_padded += [a["branch_tokens"].size, a["branch_head_idx"].size]
        assert list(r) == [int(x) for x in got_real] and list(p) == got_padded
        # the step record's pad/* fractions of this batch (learner.pad_counts -> update_record), from the sizes
        rec = L.update_record([dict(L.pad_counts(a), clip_frac=0.0)], None)
        assert rec["pad/head_fraction"] == pytest.approx(1 - r[1] / p[1])
        if fused:  # the teacher's head: coached tokens in rows x branch_head slots
            assert rec["pad/branch_head_fraction"] == pytest.approx(1 - r[3] / p[3]) and 0 < r[3] < p[3]
        else:
            assert "pad/branch_head_fraction" not in rec


@pytest.mark.parametrize("variant", ["grpo", "csd"])
def test_plan_prints_the_lm_head_padding_of_the_synthetic_mix(capsys, variant):
    """`plan` on the paper's Stage II configs prints its LM-head positions per update against the real agent
    tokens on the synthetic mix (plan/mix.py), and for CSD the teacher head's positions against the real coached
    tokens and both heads' together: the same figures counted here from the mix's own dialogues (agent segments,
    those after a coach note) and the programs the ladder takes, each at most 1.5 x the real tokens."""
    import argparse
    from mimesis_jax.commands import plan as plan_cli

    cfg, multiple = _paper(variant)
    fused = variant == "csd"
    args = plan_cli.add_args(argparse.ArgumentParser()).parse_args(["--config", f"{PAPER}:{variant}"])
    assert plan_cli.run(args) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("LM head: ")]
    ladder = ladder_for_config(cfg, multiple)
    rng = np.random.RandomState(mix.SEED)
    n, head, agent, bhead, coached, seen = plan_cli.HEAD_MIX_MINIBATCHES, 0, 0, 0, 0, set()
    for _ in range(n):
        plans = [_dialogue_plan(rng, cfg, mix.COACH_PROB) for _ in range(cfg.rollout.mini_batch_prompts
                                                                         * cfg.rollout.group_size)]
        key, _ = rl_batch.ladder_shape_key(_sizes(plans, fused), ladder, multiple)
        seen.add(key)
        head += key[0] * key[2]
        bhead += key[0] * key[4]
        agent += sum(k for p in plans for kind, k in p if kind == "agent")
        coached += sum(p[i + 2][1] for p in plans for i, (kind, _) in enumerate(p) if kind == "coach")
    teacher = (f"; teacher head {bhead / n:.0f} vs {coached / n:.0f} real coached tokens ({bhead / coached:.2f}x), "
               f"both heads {(head + bhead) / (agent + coached):.2f}x") if fused else ""
    assert line == [f"LM head: {head / n:.0f} positions per update vs {agent / n:.0f} real agent tokens "
                    f"({head / agent:.2f}x){teacher} on a synthetic paper-like mix ({n} mini-batches, plan/mix.py; "
                    f"{len(seen)} step programs taken)"]
    assert head <= 1.5 * agent and bhead <= 1.5 * coached and (bhead > 0) == fused


# ------------------------------------------------------------------------------ padding is masked
CFG = tiny_config(num_hidden_layers=1)


_STEPS = {}


def _loss_and_grads(trs, rl, **pack):
    step = _STEPS.setdefault(rl, make_rl_step(CFG, optax.sgd(1.0), None, rl))  # one jit cache for the module
    packed = prepare_batch(trs, rl, pad_multiple=16, **pack)
    loss, grads, sums = step.loss_and_grads(scaled_params(CFG), step.place(packed))
    return packed, float(loss), grads, {k: float(v) for k, v in sums.items()}


@pytest.mark.parametrize("alpha,coach_prob", [(0.3, 0.6), (0.3, 0.0)])
def test_padding_to_a_rung_leaves_loss_and_grads(alpha, coach_prob):
    """The unpadded packing (fine ladders at pad_multiple 16) against a ladder rung larger in every dimension
    (rows, head_idx, branch_tokens, branch_head_idx): the same loss, gradients and counts. Without a coached turn:
    the fused layout with empty branches against the batch without branches (the GRPO program, the unpadded
    path)."""
    trs = random_batch(3, CFG.vocab_size, (3, 2, 4, 1, 2, 3), coach_prob=coach_prob)
    rl = RLConfig(alpha=alpha, beta=5.0, old_logprobs="rollout")
    small, loss0, g0, s0 = _loss_and_grads(trs, rl, row_len=64)
    ladder = rl_batch.ShapeLadder(64, (8,), (160,) if alpha > 0 else ())
    big, loss, g, s = _loss_and_grads(trs, rl, ladder=ladder)
    assert big.shape_key == ladder.programs()[0]
    assert all(b > a for i, (a, b) in enumerate(zip(small.shape_key, big.shape_key)) if a and i != 1)
    assert big.teacher == ("fused" if alpha > 0 else "none")
    assert small.teacher == ("fused" if alpha > 0 and coach_prob > 0 else "none")
    assert loss == pytest.approx(loss0, rel=1e-5, abs=1e-7)
    assert tree_rel_err(g, g0) <= 1e-5
    for k in ("agent", "coached", "clipped"):
        assert s[k] == s0[k], k


def test_ladder_errors_name_the_argument():
    trs = random_batch(3, CFG.vocab_size, (2, 1))
    ladder = rl_batch.ShapeLadder(64, (4,))
    with pytest.raises(ValueError, match="num_rows"):
        rl_batch.pack_trajectories(trs, teacher="none", ladder=ladder, num_rows=4)
    with pytest.raises(ValueError, match="teacher='fused'"):
        rl_batch.pack_trajectories(trs, teacher="fused", ladder=ladder)


# ------------------------------------------------------------------------------ the learner's metric
class VaryingStage(ScriptedDraws, L.RLLearner):
    """Scripted dialogues whose lengths change the row rung: short (several per row of 64) on odd steps, long
    (one per row) on even steps."""

    stage = "ladders"
    packed_keys: list = []

    def rollouts(self, model, items, *, group_size, first_group, first_rid, **kw):
        rng = np.random.RandomState(self.drawn)
        n = 5 if self.drawn % 2 else 20

        def dialogue(group, rid):
            segs = [Segment("public", rng.randint(1, 50, size=n).tolist())]
            for _ in range(2):
                segs += [Segment("public", rng.randint(1, 50, size=3).tolist()),
                         Segment("agent", rng.randint(1, 50, size=5).tolist(), logprobs=(-rng.rand(5)).tolist())]
            return Trajectory(segs, turn_rewards=[1.0, 0.0], group_id=group, rollout_id=rid)
        return [[dialogue(first_group + i, first_rid + i * group_size + k) for k in range(group_size)]
                for i in range(len(items))]


def test_learner_logs_the_programs_it_compiled(tmp_path, monkeypatch):
    """16 dialogues per mini-batch on one device: rows rungs (8, 12, 16); short dialogues pack in 8 rows, long
    ones need 16: steps 1-2 compile 2 programs, counted from jax's compile events."""
    sets = ["train.progress_bar=false", "train.tensorboard=false", "train.steps=2", "rollout.prompts_per_step=8",
            "rollout.group_size=2", "rollout.mini_batch_prompts=8", "rollout.row_len=64", "rl.old_logprobs=rollout",
            "checkpoint.async_save=false", "checkpoint.every=100", "mesh.fsdp=1"]
    cfg = A.load(os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo", sets)
    cfg = cfg.replace(model=cfg.model.replace(num_hidden_layers=1, layer_types=("full_attention",)))  # cheap
    keys, real = [], []
    pack = rl_batch.pack_trajectories

    def recording(*a, **kw):
        p = pack(*a, **kw)
        keys.append(p.shape_key)
        segs = [s for t in a[0] for s in t.segments]
        real.append((sum(len(s.tokens) for s in segs if s.kind != "coach"),
                     sum(len(s.tokens) for s in segs if s.kind == "agent")))
        return p
    monkeypatch.setattr(rl_batch, "pack_trajectories", recording)
    learner = VaryingStage(cfg, str(tmp_path), handle_signals=False, log=lambda *a: None)
    res = learner.run()
    ladder = L.run_ladder(learner.run_state)
    assert ladder.rows == (8, 12, 16) and set(keys) == {ladder.key(8), ladder.key(16)}
    counts = [res.metrics[s]["num_compilations"] for s in (1, 2)]
    assert counts == [1, 2] == [len(set(keys[:s])) for s in (1, 2)]
    assert len(learner.run_state.step_fn.shape_keys) == 2
    # pad/*: the fraction of the step's trunk slots (rows x row_len) and LM-head slots (rows x head) left padding,
    # here from the dialogues' own token counts (one mini-batch per step)
    for s, (B, T, Ka, _, _), (trunk, agent) in zip((1, 2), keys, real):
        assert res.metrics[s]["pad/row_fraction"] == pytest.approx(1 - trunk / (B * T))
        assert res.metrics[s]["pad/head_fraction"] == pytest.approx(1 - agent / (B * Ka))


def test_paper_configs_plan_their_programs():
    cfg, _ = _paper("csd")
    w = workload.workload_from_config(cfg, {"data": 1, "fsdp": 8, "tensor": 2}, cfg.model)
    text = workload.programs_text(w)[0]
    assert text.startswith("step programs: 33 (rows x row_len x head x branch x branch_head")
    assert "64x9344x9344x6400x6400" in text and "128x9344x9344x12800x9344" in text
    bare = workload.workload_from_config(dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout,
                                                                                            row_len=0)),
                                         {"data": 1, "fsdp": 8, "tensor": 2}, cfg.model)
    assert bare.programs == () and "not bounded" in workload.programs_text(bare)[0]


# ------------------------------------------------------------------------------ Stage I.3 (simulator RL)
SIMRL = os.path.join(ROOT, "configs", "mimesis_simrl.py:9b")
SIM_MINIBATCHES = 200


_sim_rollout = mix.sim_rollout


def test_simrl_paper_mix_compiles_a_bounded_known_set_of_programs():
    """configs/mimesis_simrl.py:9b (rows of 16,384 tokens, 16 prompts x 8 rollouts per mini-batch, 4 micro-batches
    on data 2 x fsdp 4): 200 mini-batches of a synthetic mix (each policy turn its own segment, ~460 segments per
    mini-batch) pack to at most the ladder's 3 GRPO programs (64 / 96 / 128 rows: 1/2, 3/4, 1 of one row per
    rollout), none past it, every one listed by `plan`; the padding cost is printed (and checked against a
    NumPy count). The first 20 mini-batches on the fine ladders the packer used before need more programs."""
    cfg, multiple = _paper_sim()
    r = cfg.rollout
    ladder = ladder_for_config(cfg, multiple)
    # heads at rollout.head_rungs = 0.2, 0.3, 1 of the row, rounded up to 64
    assert multiple == 32 and ladder == rl_batch.ShapeLadder(16384, (64, 96, 128), (), (3328, 4928, 16384))
    w = workload.workload_from_config(cfg, {"data": 2, "fsdp": 4, "tensor": 2}, cfg.model)
    listed = ladder.programs()
    assert listed == list(w.programs) and len(listed) == 9
    rng = np.random.RandomState(7)
    seen, before, padded, real = {}, set(), np.zeros(2, np.int64), np.zeros(2, np.int64)
    for i in range(SIM_MINIBATCHES):
        segs = [s for _ in range(r.mini_batch_prompts * r.group_size)
                for s in _sim_rollout(rng, r, cfg.domains.max_user_turns)]
        s = np.array(segs, np.int64).T
        key, overflow = rl_batch.ladder_shape_key(s, ladder, multiple)
        assert not overflow and key in listed
        seen[key] = seen.get(key, 0) + 1
        p, q = _padding(key, s, False)
        padded, real = padded + p, real + q
        if i < 20:
            _, old, _ = rl_batch._choose_shapes(s, [ladder.row_len, None], fused=False, ladder=None, num_rows=None,
                                                head_len=None, branch_len=None, branch_head_len=None,
                                                rows_multiple=multiple, pad_multiple=64)
            before.add(old)
    cost = padded / real
    print(f"simrl: {len(seen)} programs over {SIM_MINIBATCHES} mini-batches (fine ladders, first 20: "
          f"{len(before)}); uses {dict(sorted(seen.items()))}; padded / real tokens: trunk {cost[0]:.3f}, "
          f"head {cost[1]:.3f}")
    assert len(seen) <= len(listed) and len(before) > 3 and cost[1] <= 1.5
    assert sum(seen.values()) == SIM_MINIBATCHES and padded[0] == sum(k[0] * k[1] * n for k, n in seen.items())


def _paper_sim(sets=()):
    cfg = workload.load_run_config(SIMRL, list(sets))
    m = cfg.mesh
    return cfg, cfg.rl.num_microbatches * workload.batch_multiple(cfg.model, {"data": m.data, "fsdp": m.fsdp,
                                                                               "tensor": m.tensor})


def test_simrl_plan_lists_its_step_and_sampler_programs():
    """`plan` for the 9B simulator config with the static sampler: its 3 step programs and its one sampler program
    (the loop's chat_models.fixed_buckets: 256 rollouts per call, prompts padded to 16,384 - 2,048 tokens, 2,048
    new); rollout.row_rungs sets the rows (here one program of 2 rows per rollout)."""
    cfg, _ = _paper_sim(STATIC)
    mesh = {"data": 2, "fsdp": 4, "tensor": 2}
    text = workload.programs_text(workload.workload_from_config(cfg, mesh, cfg.model))
    assert text == ["step programs: 9 (rows x row_len x head x branch x branch_head, cheapest first): "
                    + ", ".join(f"{rows}x16384x{head}x0x0" for rows in (64, 96, 128) for head in (3328, 4928, 16384)),
                    "sampler programs: 1 (batch x prompt + new tokens): 256x14336+2048"]
    two = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, row_rungs=(2.0,), head_rungs=()))
    assert workload.workload_from_config(two, mesh, cfg.model).programs == ((256, 16384, 16384, 0, 0),)


# ------------------------------------------------------------------------------ Stage II sampler ladder
def _sampler_calls(rng, cfg, dialogues):
    """The longest prompt of every agent sampler call of one step: `dialogues` dialogues of the paper-like mix
    (`_dialogue_plan`), each turn's prompt its context so far + the user / tool reply + the header, sampled only
    while prompt + agent_max_tokens fit the context budget (episodes/agent.py); per turn one call over the live
    dialogues, in chunks of rollout.max_batch (sampler.generate). Returns [(sequences, [prompt lengths])]."""
    r = cfg.rollout
    longest = r.max_context_tokens - r.agent_max_tokens
    per_turn = []
    for _ in range(dialogues):
        plan, prompts, i = _dialogue_plan(rng, cfg, 0.0), [], 1
        used = plan[0][1]
        while i < len(plan):
            env, head, agent = plan[i][1], plan[i + 1][1], plan[i + 2][1]
            if used + env + head > longest:
                break
            prompts.append(used + env + head)
            used, i = used + env + head + agent, i + 3
        per_turn.append(prompts)
    calls = []
    for t in range(r.max_turns):
        live = [p[t] for p in per_turn if len(p) > t]
        calls += [live[a:a + r.max_batch] for a in range(0, len(live), r.max_batch)]
    return calls


def test_agentrl_sampler_ladder_is_listed_and_compiles_in_the_first_step():
    """configs/qwen3_8b_agentrl.py with the static sampler (budget 9,344 tokens, 2,048 new, 1,024 dialogues per step
    in calls of 256): the policy's sampler buckets (chat_models.ladder_buckets, what AgentLearner.policy_buckets
    returns) put every call of a paper-like step on one of 4 programs, the ones `plan` lists; the first step's
    growing contexts reach every rung, so a second step compiles nothing. The prefill work (padded rows x prompt length over the real
    prompt tokens) is printed for the ladder, one rung (Stage I.3's fixed_buckets) and the default buckets."""
    from mimesis_jax.inference.sampler import Buckets
    from mimesis_jax.train.rl import chat_models

    cfg, _ = _paper("grpo", STATIC)
    r = cfg.rollout
    longest, dialogues = r.max_context_tokens - r.agent_max_tokens, r.prompts_per_step * r.group_size
    b = chat_models.ladder_buckets(r, r.agent_max_tokens, dialogues)
    rungs = b.prompt_rungs
    assert len(rungs) == 4 and list(rungs) == sorted(set(rungs)) and rungs[-1] - 64 < longest <= rungs[-1]
    assert all(x % 64 == 0 and abs(x - f * longest) < 64 for x, f in zip(rungs, (0.25, 0.5, 0.75, 1.0)))
    w = workload.workload_from_config(cfg, {"data": 1, "fsdp": 8, "tensor": 2}, cfg.model)
    listed = {(w.rollout.batch, p, w.rollout.new_tokens) for p in w.sampler_prompts}
    assert workload.programs_text(w)[1] == "sampler programs: 4 (batch x prompt + new tokens): " + ", ".join(
        f"256x{p}+2048" for p in rungs)
    rng = np.random.RandomState(11)
    steps = [_sampler_calls(rng, cfg, dialogues) for _ in range(2)]
    used = [{(b.batch(len(c)), b.prompt(max(c)), b.new_tokens(r.agent_max_tokens)) for c in s} for s in steps]
    assert used[0] == listed and used[1] <= used[0]
    costs = {}
    for name, bk in (("ladder", b), ("one rung", chat_models.fixed_buckets(r, r.agent_max_tokens, dialogues)),
                     ("default", Buckets())):
        padded = sum(bk.batch(len(c)) * bk.prompt(max(c)) for c in steps[0])
        programs = len({(bk.batch(len(c)), bk.prompt(max(c))) for c in steps[0]})
        costs[name] = (padded / sum(sum(c) for c in steps[0]), programs)
    print("agentrl sampler, first step: padded / real prompt tokens (programs): "
          + ", ".join(f"{k} {v:.2f} ({n})" for k, (v, n) in costs.items()))
    assert costs["ladder"][0] < costs["one rung"][0] and costs["ladder"][1] == 4
