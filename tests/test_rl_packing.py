"""Packing at scale (algorithms/rl_batch.py): the bucket ladders, the realistic length mix of benchmarks/bench_csd.py
(trunk utilisation, branch padding, every token where it belongs), fixed shapes, the LM head on the agent positions
only (== the full-position path, values and gradients) and the sampling temperature of the log-probs (== NumPy
log_softmax(logits / T))."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_helpers import jaxpr_dims, random_batch, scaled_params, tiny_config, tree_rel_err
from mimesis_jax import models, sharding
from mimesis_jax.algorithms import csd, rl_shapes
from mimesis_jax.algorithms.logprobs import logprobs_from_hidden, token_logprobs
from mimesis_jax.algorithms.rl_batch import HEAD_KEYS, bucket, pack_trajectories, regroup_heads

CFG = tiny_config()


def _bench_csd():
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "bench_csd.py"
    spec = importlib.util.spec_from_file_location("bench_csd", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ------------------------------------------------------------------------------------------- ladders
@pytest.mark.parametrize("steps", [2, 8, 16])
def test_bucket_ladder_matches_its_definition(steps):
    """Every integer up to 2 x steps, then k x 2^e with steps <= k < 2 x steps; padding < 1/(steps + 1) above."""
    ladder = sorted(set(range(1, 2 * steps + 1)) | {k << e for e in range(24) for k in range(steps, 2 * steps)})
    for multiple in (1, 64):
        for n in np.unique(np.geomspace(1, 3e6, 4000).astype(int)):
            m = -(-int(n) // multiple)
            want = next(v for v in ladder if v >= m)
            assert bucket(int(n), multiple, steps) == multiple * want, (n, multiple)
            if m > 2 * steps:
                assert (want - m) / want < 1 / (steps + 1)


# ------------------------------------------------------------------------------------- realistic mix
def test_realistic_mix_meets_the_packing_targets_and_places_every_token():
    """256 dialogues of the benchmark's length mix in rows of 24K: trunk utilisation >= 90%, branch padding
    <= 15%, counted from the arrays; every student sequence, branch and LM-head index where it belongs (4 head
    groups: rows_multiple 4)."""
    bench = _bench_csd()
    rng = np.random.RandomState(7)
    trajs = [bench.realistic_dialogue(rng, 150_000, i) for i in range(256)]
    packed = pack_trajectories(trajs, teacher="fused", use_rollout_logprobs=False, row_len=24576, rows_multiple=4)
    a = packed.arrays
    util = (a["segment_ids"] > 0).sum() / a["segment_ids"].size
    pad = 1 - (a["branch_ids"] > 0).sum() / a["branch_ids"].size
    print(f"rows {a['tokens'].shape}, branches {a['branch_ids'].shape}: trunk utilisation {util:.1%}, "
          f"branch padding {pad:.1%}")
    assert util >= 0.90 and pad <= 0.15
    agents_in_row = {r: [] for r in range(a["tokens"].shape[0])}  # (trunk start, tokens) of every agent turn
    coached_in_row = {r: [] for r in range(a["tokens"].shape[0])}
    for tr, slots in zip(trajs, packed.turns):
        r = slots[0].row
        sid = a["segment_ids"][r, slots[0].start]
        np.testing.assert_array_equal(a["tokens"][r][a["segment_ids"][r] == sid], tr.student_tokens())
        want_branch = []
        for slot, ai, c in zip(slots, tr.agent_indices(), tr.coach_for_turn()):
            toks = tr.segments[ai].tokens
            assert slot.row == r and slot.coached == (c is not None)
            agents_in_row[r].append((slot.start, toks))
            if c is not None:
                coached_in_row[r].append((slot.start, toks))
                want_branch += tr.segments[c].tokens + tr.segments[ai - 1].tokens + toks
        mine = (a["branch_trunk_segment"][r] == sid) & (a["branch_ids"][r] > 0)
        np.testing.assert_array_equal(a["branch_tokens"][r][mine], want_branch)
    # the head positions: per head group (G consecutive rows, flattened), its rows' agent (coached) tokens in
    # row order, then zeros
    G = packed.head_group
    assert G * 4 == a["tokens"].shape[0]
    for g in range(4):
        rows = range(g * G, (g + 1) * G)
        agent = np.concatenate([t for r in rows for _, t in sorted(agents_in_row[r])] or [[]]).astype(np.int64)
        coached = np.concatenate([t for r in rows for _, t in sorted(coached_in_row[r])] or [[]]).astype(np.int64)
        idx, bidx = a["head_idx"][rows].reshape(-1), a["branch_head_idx"][rows].reshape(-1)
        np.testing.assert_array_equal(a["tokens"][rows].reshape(-1)[idx[:len(agent)]], agent)
        np.testing.assert_array_equal(a["branch_tokens"][rows].reshape(-1)[bidx[:len(coached)]], coached)
        assert not idx[len(agent):].any() and not bidx[len(coached):].any()


def test_fixed_shapes_are_kept_and_overflow_is_an_error():
    kw = dict(row_len=192, num_rows=4, branch_len=96, head_len=48, branch_head_len=48, pad_multiple=16)
    want = {"tokens": (4, 192), "branch_tokens": (4, 96), "head_idx": (4, 48), "branch_head_idx": (4, 48)}
    for seed in (3, 4):
        packed = pack_trajectories(random_batch(seed, CFG.vocab_size, (3, 5, 2, 4)), **kw)
        assert {k: packed.arrays[k].shape for k in want} == want
    trajs = random_batch(3, CFG.vocab_size, (3, 5, 2, 4))
    with pytest.raises(ValueError, match=r"trajectory \d: \d+ agent tokens > head_len=4"):
        pack_trajectories(trajs, **{**kw, "head_len": 4})
    with pytest.raises(ValueError, match=r"trajectory \d: \d+ coached tokens > branch_head_len=2"):
        pack_trajectories(trajs, **{**kw, "branch_head_len": 2})
    with pytest.raises(ValueError, match="num_rows=1: the trajectories need"):
        pack_trajectories(trajs, **{**kw, "num_rows": 1, "row_len": 160})


def test_shape_policy_reads_counts_only_and_the_filler_follows_it():
    """rl_shapes.pack_shape, given the per-trajectory token counts read off the segments (trunk = non-coach tokens,
    branch = coach + header + agent tokens of each coached turn, agent, coached agent tokens), picks the rows and
    shape key the packed arrays have: every trajectory's turns sit in the row the policy gave it."""
    trajs = random_batch(5, CFG.vocab_size, (3, 5, 2, 4, 1, 6), max_len=20)
    counts = {k: [] for k in ("trunk", "branch", "agent", "coached")}
    for tr in trajs:
        segs, coach = tr.segments, tr.coach_for_turn()
        turns = [(a, c) for a, c in zip(tr.agent_indices(), coach)]
        counts["trunk"].append(sum(len(x.tokens) for x in segs if x.kind != "coach"))
        counts["branch"].append(sum(len(segs[c].tokens) + len(segs[a - 1].tokens) + len(segs[a].tokens)
                                    for a, c in turns if c is not None))
        counts["agent"].append(sum(len(segs[a].tokens) for a, _ in turns))
        counts["coached"].append(sum(len(segs[a].tokens) for a, c in turns if c is not None))
    assert sum(counts["coached"]) > 0
    for kw in (dict(pad_multiple=16, rows_multiple=2), dict(row_len=256, num_rows=6, pad_multiple=16)):
        packed = pack_trajectories(trajs, use_rollout_logprobs=False, **kw)
        T = kw.get("row_len") or bucket(max(counts["trunk"]), kw["pad_multiple"])
        shape = rl_shapes.pack_shape(*(np.array(v, np.int64) for v in counts.values()), row_len=T, mode="fused",
                                     num_rows=kw.get("num_rows"), rows_multiple=kw.get("rows_multiple", 1),
                                     pad_multiple=kw["pad_multiple"])
        assert shape.key == packed.shape_key and shape.group == packed.head_group
        row_of = {i: r for r, row in enumerate(shape.rows) for i in row}
        assert sorted(row_of) == list(range(len(trajs)))
        assert all(slot.row == row_of[i] for i, turns in enumerate(packed.turns) for slot in turns)


# ------------------------------------------------------------------------------ LM head at agent positions
def _full_position_logprobs(config, params, batch):
    """The previous path, written out: the LM head on every trunk and branch position, token-aligned, the
    teacher gathered through teacher_src."""
    branch = {"tokens": batch["branch_tokens"], "positions": batch["branch_positions"],
              "branch_ids": batch["branch_ids"], "trunk_segment": batch["branch_trunk_segment"],
              "prefix_len": batch["branch_prefix_len"]}
    h, hb = models.hidden_states(config, params, batch["tokens"], batch["positions"], batch["segment_ids"], branch)
    aligned = lambda lp: jnp.pad(lp, ((0, 0), (1, 0)))  # noqa: E731
    s = aligned(logprobs_from_hidden(config, params, h[:, :-1], batch["tokens"][:, 1:]))
    frozen = jax.lax.stop_gradient(params)
    tb = aligned(logprobs_from_hidden(config, frozen, jax.lax.stop_gradient(hb)[:, :-1], batch["branch_tokens"][:, 1:]))
    return s, jax.lax.stop_gradient(jnp.take_along_axis(tb, batch["teacher_src"], axis=1))


def test_head_at_agent_positions_equals_the_full_position_path():
    """Student and teacher log-probs and the gradient of a loss over them: gathered head == every position; the
    gathered path never runs the head over the T - 1 or Tb - 1 shifted positions."""
    T, Tb = 211, 137  # T - 1 = 210 and Tb - 1 = 136: dims nothing else has
    trajs = random_batch(21, CFG.vocab_size, (4, 7, 2, 5, 1))
    packed = pack_trajectories(trajs, teacher="fused", row_len=T, branch_len=Tb, pad_multiple=16)
    batch = {k: jnp.asarray(v) for k, v in packed.arrays.items()}
    assert batch["head_idx"].shape[1] < T and packed.num_coached_tokens > 0
    params = scaled_params(CFG)
    rng = np.random.RandomState(0)
    wa = jnp.asarray(rng.randn(*batch["tokens"].shape) * packed.arrays["agent_mask"], jnp.float32)
    wc = jnp.asarray(rng.randn(*batch["tokens"].shape) * packed.arrays["coached_mask"], jnp.float32)

    def loss(fn):
        def f(p, b):
            s, t = fn(CFG, p, b)
            return jnp.sum(wa * s) + jnp.sum(wc * jax.nn.sigmoid(t - jax.lax.stop_gradient(s)) * s), (s, t)
        return jax.jit(jax.value_and_grad(f, has_aux=True))

    (l_ref, (s_ref, t_ref)), g_ref = loss(_full_position_logprobs)(params, batch)
    (l_new, (s_new, t_new)), g_new = loss(csd.fused_logprobs)(params, batch)
    agent, coached = packed.arrays["agent_mask"] > 0, packed.arrays["coached_mask"] > 0
    np.testing.assert_allclose(np.asarray(s_new)[agent], np.asarray(s_ref)[agent], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(t_new)[coached], np.asarray(t_ref)[coached], rtol=1e-5, atol=1e-5)
    assert not np.asarray(s_new)[~agent].any() and not np.asarray(t_new)[~coached].any()
    np.testing.assert_allclose(float(l_new), float(l_ref), rtol=1e-5)
    assert tree_rel_err(g_new, g_ref) <= 1e-5
    # without the head keys (e.g. a batch of trunk keys only) the student falls back to every position
    plain = {k: v for k, v in batch.items() if k not in HEAD_KEYS}
    s_fb = np.asarray(jax.jit(lambda p, b: csd.student_logprobs(CFG, p, b))(params, plain))
    np.testing.assert_allclose(s_fb[agent], np.asarray(s_ref)[agent], rtol=1e-5, atol=1e-5)
    shifted = {T - 1, Tb - 1}
    assert shifted <= jaxpr_dims(jax.make_jaxpr(lambda p: _full_position_logprobs(CFG, p, batch))(params).jaxpr)
    assert not shifted & jaxpr_dims(jax.make_jaxpr(lambda p: csd.fused_logprobs(CFG, p, batch))(params).jaxpr)


def _collectives(compiled_text: str) -> dict[str, int]:
    return {op: compiled_text.count(f" {op}(") + compiled_text.count(f" {op}-start(")
            for op in ("all-gather", "all-to-all", "collective-permute", "all-reduce")}


def test_grouped_head_on_a_mesh_equals_the_full_row_path(monkeypatch):
    """8 devices (fsdp 4 x tensor 2; rows over fsdp): 8 rows packed with rows_multiple 4 -> head groups of the 2
    rows each device holds. Student and teacher log-probs of the grouped head == the full-row log-softmax
    (`_full_position_logprobs`), and the compiled program has no collective the per-row head (groups of 1 row)
    lacks: the group's rows are flattened on their own device."""
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    trajs = random_batch(5, CFG.vocab_size, (4, 7, 2, 5, 1, 3, 6, 2, 3, 1))
    packed = pack_trajectories(trajs, teacher="fused", row_len=160, num_rows=8, rows_multiple=4, pad_multiple=16)
    assert packed.head_group == 2
    params = models.shard_params(CFG, scaled_params(CFG), mesh)
    ref_batch = sharding.shard_batch(dict(packed.arrays), mesh)
    with sharding.use_mesh(mesh):
        s_ref, t_ref = jax.jit(lambda p, b: _full_position_logprobs(CFG, p, b))(params, ref_batch)
    agent, coached = packed.arrays["agent_mask"] > 0, packed.arrays["coached_mask"] > 0

    def run(arrays):
        fn = jax.jit(lambda p, b: csd.fused_logprobs(CFG, p, b))
        b = sharding.shard_batch(arrays, mesh)
        with sharding.use_mesh(mesh):
            s, t = fn(params, b)
            text = fn.lower(params, b).compile().as_text()
        np.testing.assert_allclose(np.asarray(s)[agent], np.asarray(s_ref)[agent], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(t)[coached], np.asarray(t_ref)[coached], rtol=1e-5, atol=1e-5)
        assert not np.asarray(s)[~agent].any() and not np.asarray(t)[~coached].any()
        return _collectives(text)
    grouped = run(dict(packed.arrays))
    monkeypatch.setattr(csd, "head_group", lambda rows, config=None: 1)
    per_row = run(regroup_heads(packed.arrays, 1))
    print(f"collectives: grouped {grouped}, per row {per_row}")
    assert all(grouped[k] <= per_row[k] for k in grouped)


# --------------------------------------------------------------------------------------- temperature
def _numpy_logprobs(params, seqs, temperature):
    """log_softmax(logits / T) of each sequence from the full logits (one right-padded, causal forward), in
    float64: per sequence, entry j = log p(seq[j + 1] | seq[:j + 1])."""
    rows = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
    for k, q in enumerate(seqs):
        rows[k, :len(q)] = q
    logits = np.asarray(models.forward(CFG, params, rows), np.float64) / temperature
    z = logits - logits.max(-1, keepdims=True)
    lsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return [lsm[k, np.arange(len(q) - 1), np.asarray(q[1:])] for k, q in enumerate(seqs)]


def test_temperature_is_log_softmax_of_the_scaled_logits():
    """token_logprobs, student_logprobs and both teachers at T = 0.6, 1, 1.7 (T traced under jit and a Python
    float) against NumPy on the full logits."""
    params = scaled_params(CFG)
    trajs = random_batch(4, CFG.vocab_size, (2, 3, 4))
    students = [tr.student_tokens() for tr in trajs]
    teachers = [[tr.teacher_sequence(k) if c is not None else None for k, c in enumerate(tr.coach_for_turn())]
                for tr in trajs]
    flat_t = [q for ts in teachers for q, _ in filter(None, ts)]
    lp_tokens = jax.jit(lambda p, ids, T: token_logprobs(CFG, p, ids, temperature=T))
    packs = {t: pack_trajectories(trajs, teacher=t, use_rollout_logprobs=False, pad_multiple=16)
             for t in ("fused", "naive")}
    both = {t: jax.jit(lambda p, b, T, t=t: csd.student_teacher_logprobs(CFG, p, b, t, temperature=T))
            for t in packs}
    student_only = jax.jit(lambda p, b, T: csd.student_logprobs(CFG, p, b, temperature=T))
    for temperature in (0.6, 1.0, 1.7):
        ref_s = _numpy_logprobs(params, students, temperature)
        ref_t = iter(_numpy_logprobs(params, flat_t, temperature))
        ref_t = [[None if x is None else next(ref_t) for x in ts] for ts in teachers]
        np.testing.assert_allclose(np.asarray(lp_tokens(params, np.asarray(students[:1]), temperature))[0],
                                   ref_s[0], rtol=1e-5, atol=1e-5)
        eager = token_logprobs(CFG, params, np.asarray(students[:1]), temperature=temperature)  # a Python float
        np.testing.assert_allclose(np.asarray(eager)[0], ref_s[0], rtol=1e-5, atol=1e-5)
        for teacher, packed in packs.items():
            batch = {k: jnp.asarray(v) for k, v in packed.arrays.items()}
            s, t = map(np.asarray, both[teacher](params, batch, temperature))
            s_only = np.asarray(student_only(params, batch, temperature))
            n_coached = 0
            for i, slots in enumerate(packed.turns):
                for k, slot in enumerate(slots):
                    sl = (slot.row, slice(slot.start, slot.start + slot.length))
                    want = ref_s[i][slot.start - 1:slot.start - 1 + slot.length]
                    np.testing.assert_allclose(s[sl], want, rtol=1e-5, atol=1e-5)
                    np.testing.assert_allclose(s_only[sl], want, rtol=1e-5, atol=1e-5)
                    if teachers[i][k] is not None:
                        off = teachers[i][k][1]
                        want_t = ref_t[i][k][off - 1:off - 1 + slot.length]
                        np.testing.assert_allclose(t[sl], want_t, rtol=1e-5, atol=1e-5)
                        n_coached += 1
            assert n_coached >= 3
    with pytest.raises(ValueError, match="temperature must be > 0"):
        token_logprobs(CFG, params, np.asarray(students[:1]), temperature=0.0)


def test_trailing_loss_free_tokens_past_row_len_are_dropped():
    """A trajectory longer than row_len keeps its first row_len tokens when its last agent token ends within them
    (what follows carries no loss: causal attention); an agent token past row_len is still an error."""
    from mimesis_jax.data.trajectory import Segment, Trajectory
    tr = Trajectory([Segment("public", [11, 12, 13, 14, 15]), Segment("agent", [21, 22, 23], [-0.5, -0.25, -1.0]),
                     Segment("public", [31, 32, 33, 34, 35, 36])], [1.0])
    short = Trajectory([Segment("public", [41, 42]), Segment("agent", [51], [-2.0])], [0.0])
    packed = pack_trajectories([tr, short], advantages=[[1.5], [-1.5]], teacher="none", row_len=10, num_rows=2,
                               pad_multiple=1)
    a = packed.arrays
    assert packed.dropped_tail_tokens == 14 - 10
    np.testing.assert_array_equal(a["tokens"][0], [11, 12, 13, 14, 15, 21, 22, 23, 31, 32])
    np.testing.assert_array_equal(a["positions"][0], np.arange(10))
    np.testing.assert_array_equal(a["segment_ids"][0], [1] * 10)
    np.testing.assert_array_equal(a["agent_mask"][0], [0, 0, 0, 0, 0, 1, 1, 1, 0, 0])
    np.testing.assert_allclose(a["old_logp"][0], [0, 0, 0, 0, 0, -0.5, -0.25, -1.0, 0, 0])
    np.testing.assert_allclose(a["advantages"][0], [0, 0, 0, 0, 0, 1.5, 1.5, 1.5, 0, 0])
    np.testing.assert_array_equal(a["tokens"][1], [41, 42, 51] + [0] * 7)
    np.testing.assert_allclose(a["grpo_weight"][0, 5:8], [0.25] * 3)  # token-mean over the 4 agent tokens
    np.testing.assert_allclose(a["grpo_weight"][1, 2], 0.25)
    fits = pack_trajectories([tr], teacher="none", row_len=16, pad_multiple=1)
    assert fits.dropped_tail_tokens == 0 and fits.arrays["tokens"][0, :14].tolist() == tr.student_tokens()
    with pytest.raises(ValueError, match=r"trajectory 0: 14 tokens exceed row_len=7 \(its last agent token ends at 8"):
        pack_trajectories([tr], teacher="none", row_len=7, pad_multiple=1)
