"""CSD (docs/reference/paper.md §4.2, Eq 7-11): the coach, the branch packing, fused == naive (log-probs and gradients) on 1
and 8 devices, no backward work for the teacher branches, and the theory hooks (alpha = 0; zero advantages)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl_helpers import jaxpr_dims, random_batch, scaled_params, tiny_config, tree_rel_err
from mimesis_jax import models, sharding
from mimesis_jax.algorithms import coach as coach_lib
from mimesis_jax.algorithms import csd, grpo
from mimesis_jax.algorithms.logprobs import logprobs_from_hidden, token_logprobs
from mimesis_jax.algorithms.rl_batch import pack_trajectories
from mimesis_jax.models import hidden_states
from mimesis_jax.chat.base import ChatModel, ChatResponse, ScriptedChatModel
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.train.rl.agent import coach_notes, coach_notes_batch
from mimesis_jax.train.rl.step import RLConfig, make_rl_step, prepare_batch, rl_loss

CFG = tiny_config()
TURNS = (1, 16, 3, 5, 2, 8, 1, 4)  # 1 to 16 agent turns; coach_prob 0.6 leaves some turns without a note
MESHES = {"1dev": None, "fsdp8": {"fsdp": 8}, "fsdp4_tensor2": {"fsdp": 4, "tensor": 2}}


# ------------------------------------------------------------------------------------------ the coach
def _dialogue() -> Trajectory:
    segs = [Segment("public", [1, 2], text="<sys>Book a trip.</sys>"),
            Segment("public", [3], text="<user>I need a flight.</user>"),
            Segment("public", [4], text="<assistant>"),
            Segment("agent", [5, 6], text="Which city?"),
            Segment("public", [7], text="<user>Paris, I said that.</user>"),
            Segment("public", [4], text="<assistant>"),
            Segment("agent", [8], text="Booked.")]
    return Trajectory(segs, turn_rewards=[0.0, 1.0], user_thoughts=["It ignored my message.", None],
                      user_utterances=["Paris, I said that.", None], task={"goal": "flight to Paris", "id": 3})


def test_coach_prompt_template_carries_every_field():
    msgs = coach_lib.build_coach_prompt("CTX", "HIST", "REPLY", "THOUGHT", "NEXT")
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert msgs[0]["content"] == coach_lib.COACH_SYSTEM
    body = msgs[1]["content"]
    assert [body.index(x) for x in ("CTX", "HIST", "REPLY", "THOUGHT", "NEXT")] == sorted(
        body.index(x) for x in ("CTX", "HIST", "REPLY", "THOUGHT", "NEXT"))
    assert "(not available)" in coach_lib.build_coach_prompt("c", "h", "r", None, "n")[1]["content"]


def test_coach_notes_use_hindsight_of_each_turn_and_skip_turns_without_a_next_utterance():
    tr = _dialogue()
    coach = ScriptedChatModel(["Ask less, use what the user already told you."])
    notes = coach_notes(coach, tr)
    assert notes == ["Ask less, use what the user already told you.", None]  # turn 1: no x_{t+1}
    assert len(coach.calls) == 1
    body = coach.calls[0][1]["content"]
    assert "goal: flight to Paris" in body and "It ignored my message." in body and "Which city?" in body
    assert "<user>I need a flight.</user><assistant>" in body  # public history H_t up to the header
    assert "Booked." not in body  # nothing after the turn
    assert coach_notes(ScriptedChatModel(["NONE"]), tr) == [None, None]
    with pytest.raises(RuntimeError, match="turn 0"):
        coach_notes(ScriptedChatModel([ChatResponse("", finish_reason="error")]), tr)
    tr.segments[1].text = None
    with pytest.raises(ValueError, match="segment 1"):
        coach_notes(coach, tr)
    echo = ScriptedChatModel(lambda m: m[1]["content"])
    assert "</sys>3<assistant>" in coach_notes(echo, tr, decode=lambda ids: "|".join(map(str, ids)))[0]


def test_coach_notes_batch_is_one_call_over_all_trajectories():
    trs = [_dialogue(), _dialogue()]
    trs[1].user_utterances = ["Paris!", "Thanks."]
    calls = []

    class Batched(ChatModel):
        def chat(self, messages, **kw):
            raise AssertionError("coach_notes_batch makes one chat_batch call")

        def chat_batch(self, conversations, **kw):
            calls.append(len(conversations))
            return [ChatResponse(f"note {k}") for k in range(len(conversations))]

    assert coach_notes_batch(Batched(), trs) == [["note 0", None], ["note 1", "note 2"]]
    assert calls == [3]

    class Failing(ChatModel):
        def chat(self, messages, **kw):
            raise ConnectionError("coach endpoint down")

    with pytest.raises(RuntimeError, match="trajectory 0: coach failed on agent turn 0"):
        coach_notes_batch(Failing(), trs)


def test_add_coach_notes_places_the_note_before_the_assistant_header():
    tr = _dialogue()
    rendered = []

    def render(msg):
        rendered.append(msg)
        return [90, 91, 92]

    assert coach_lib.add_coach_notes(tr, ["Use the city.", None], render) == 1
    kinds = [s.kind for s in tr.segments]
    assert kinds == ["public", "public", "coach", "public", "agent", "public", "public", "agent"]
    assert rendered[0]["content"].startswith(coach_lib.COACH_NOTE_PREFIX) and rendered[0]["role"] == "system"
    tr.validate()
    seq, off = tr.teacher_sequence(0)
    assert seq == [1, 2, 3, 90, 91, 92, 4, 5, 6] and off == 7
    with pytest.raises(ValueError, match="already has a coach note"):
        coach_lib.add_coach_notes(tr, ["again", None], render)


# ------------------------------------------------------------------------------------------ packing
def test_branch_packing_reconstructs_every_teacher_context():
    """For every coached agent token, trunk keys before prefix_len + its branch up to it == teacher_sequence."""
    trajs = random_batch(3, CFG.vocab_size, TURNS)
    packed = pack_trajectories(trajs, teacher="fused", row_len=320, use_rollout_logprobs=True, pad_multiple=16)
    a = packed.arrays
    assert max(len(set(r[r > 0].tolist())) for r in a["segment_ids"]) >= 2, "want several trajectories per row"
    checked = 0
    for i, tr in enumerate(trajs):
        coach_of = tr.coach_for_turn()
        for t, slot in enumerate(packed.turns[i]):
            seg = tr.segments[tr.agent_indices()[t]]
            r, j = slot.row, slot.start
            np.testing.assert_array_equal(a["tokens"][r, j:j + slot.length], seg.tokens)
            np.testing.assert_allclose(a["old_logp"][r, j:j + slot.length], seg.logprobs, rtol=1e-6)
            assert slot.coached == (coach_of[t] is not None)
            if not slot.coached:
                assert a["coached_mask"][r, j:j + slot.length].sum() == 0
                continue
            seq, off = tr.teacher_sequence(t)
            sid = a["segment_ids"][r, j]
            for k in range(slot.length):
                b = a["teacher_src"][r, j + k]
                bid, pre = a["branch_ids"][r, b], a["branch_prefix_len"][r, b]
                assert a["branch_trunk_segment"][r, b] == sid
                trunk = [a["tokens"][r, x] for x in range(pre) if a["segment_ids"][r, x] == sid]
                trunk_pos = [a["positions"][r, x] for x in range(pre) if a["segment_ids"][r, x] == sid]
                own = [x for x in range(b + 1) if a["branch_ids"][r, x] == bid]
                ctx = trunk + [a["branch_tokens"][r, x] for x in own]
                pos = trunk_pos + [a["branch_positions"][r, x] for x in own]
                assert ctx == seq[:off + k + 1] and pos == list(range(off + k + 1))
                checked += 1
    assert checked == packed.num_coached_tokens > 0
    assert packed.teacher_tokens == sum(len(tr.segments[c].tokens) + len(tr.segments[c + 1].tokens)
                                        + len(tr.segments[c + 2].tokens)
                                        for tr in trajs for c in tr.coach_for_turn() if c is not None)


def test_bucket_ladder():
    from mimesis_jax.algorithms.rl_batch import bucket

    got = [bucket(n, 64) for n in (1, 64, 65, 129, 193, 257, 385, 513, 769, 1025, 1664)]
    assert got == [64, 64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048]
    assert all(bucket(n, 8) >= n and bucket(n, 8) % 8 == 0 for n in range(1, 300))
    assert len({bucket(n, 64) for n in range(1, 8193)}) == 14  # 64 .. 8192 in 14 shapes


def test_packing_errors_name_the_trajectory():
    trajs = random_batch(0, CFG.vocab_size, (2, 3))
    with pytest.raises(ValueError, match="trajectory 1: .* exceed row_len"):
        pack_trajectories(trajs, row_len=len(trajs[0].student_tokens()) + 1)
    trajs[1].segments[-1].logprobs = [float("nan")] * len(trajs[1].segments[-1].tokens)
    with pytest.raises(ValueError, match="trajectory 1: agent segment .* non-finite"):
        pack_trajectories(trajs)
    trajs[1].segments[-1].logprobs = None
    with pytest.raises(ValueError, match="trajectory 1: agent segment .* no rollout log-probs"):
        pack_trajectories(trajs)
    trajs[0].segments.insert(0, Segment("coach", [1]))
    with pytest.raises(ValueError, match="trajectory 0: coach segment 0"):
        pack_trajectories(trajs, use_rollout_logprobs=False)


# ------------------------------------------------------------------------------------- fused == naive
def _mesh(name):
    return None if MESHES[name] is None else sharding.make_mesh(MESHES[name])


def _params(mesh):
    p = scaled_params(CFG)
    return p if mesh is None else models.shard_params(CFG, p, mesh)


@pytest.fixture(scope="module")
def trajectories():
    return random_batch(1, CFG.vocab_size, TURNS)


@pytest.fixture(scope="module")
def naive_reference(trajectories):
    return csd.naive_score(CFG, scaled_params(CFG), trajectories)


@pytest.mark.parametrize("mesh_name,impl", [(m, "dense") for m in MESHES] + [("1dev", "blockwise"),
                                                                              ("fsdp4_tensor2", "blockwise")])
def test_fused_score_equals_naive(mesh_name, impl, trajectories, naive_reference):
    """Teacher branches through both attention backends (blockwise with small blocks: several per row)."""
    mesh = _mesh(mesh_name)
    cfg = CFG.replace(attention_impl=impl, attention_block_q=64, attention_block_k=48)
    fused = csd.score(cfg, _params(mesh), trajectories, mesh=mesh, row_len=320)
    gap, n_coached = 0.0, 0
    for tr, f_turns, n_turns in zip(trajectories, fused, naive_reference):
        assert len(f_turns) == len(n_turns) == tr.num_agent_turns
        for (fs, ft), (ns, nt), c in zip(f_turns, n_turns, tr.coach_for_turn()):
            assert fs.dtype == ft.dtype == np.float32 and fs.shape == ns.shape
            np.testing.assert_allclose(fs, ns, rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(ft, nt, rtol=1e-5, atol=1e-5)
            if c is None:
                np.testing.assert_array_equal(ft, fs)
            else:
                gap = max(gap, float(np.abs(nt - ns).max()))
                n_coached += 1
    assert n_coached >= 10 and gap > 0.5, "the notes must move the teacher for this comparison to mean anything"


def _reference_loss(trajectories, advantages, rl: RLConfig):
    """Eq 5-6 + 8-11 written out per token on the plain path: each student and teacher sequence alone
    (right-padded rows, causal), no packing, no branches, the normalisers counted from the trajectories."""
    student = [tr.student_tokens() for tr in trajectories]
    teacher = []
    cols = {k: [] for k in ("srow", "sidx", "old", "adv", "coached", "trow", "tidx")}
    for i, tr in enumerate(trajectories):
        pos, starts = 0, {}
        for k, s in enumerate(tr.segments):
            if s.kind != "coach":
                starts[k] = pos
                pos += len(s.tokens)
        for t, (a, c) in enumerate(zip(tr.agent_indices(), tr.coach_for_turn())):
            seg = tr.segments[a]
            n = len(seg.tokens)
            if c is not None:
                seq, off = tr.teacher_sequence(t)
                teacher.append(seq)
            for k in range(n):  # token k is predicted from the position before it
                for key, v in (("srow", i), ("sidx", starts[a] + k - 1), ("old", seg.logprobs[k]),
                               ("adv", advantages[i][t]), ("coached", float(c is not None)),
                               ("trow", len(teacher) - 1 if c is not None else 0),
                               ("tidx", off + k - 1 if c is not None else 0)):
                    cols[key].append(v)
    cols = {k: np.asarray(v, np.float32 if k in ("old", "adv", "coached") else np.int32) for k, v in cols.items()}
    n_agent, n_coached = len(cols["old"]), cols["coached"].sum()

    def rows(seqs):
        out = np.zeros((len(seqs), max(map(len, seqs))), np.int32)
        for k, q in enumerate(seqs):
            out[k, :len(q)] = q
        return jnp.asarray(out)

    S, Tt = rows(student), rows(teacher)

    def loss(params):
        s = token_logprobs(CFG, params, S)[cols["srow"], cols["sidx"]]
        t = token_logprobs(CFG, jax.lax.stop_gradient(params), Tt)[cols["trow"], cols["tidx"]]
        rho, adv = jnp.exp(s - cols["old"]), cols["adv"]
        l_grpo = -jnp.sum(jnp.minimum(rho * adv, jnp.clip(rho, 1 - rl.eps_low, 1 + rl.eps_high) * adv)) / n_agent
        w = jax.nn.sigmoid(rl.beta * (jax.lax.stop_gradient(t) - jax.lax.stop_gradient(s)))
        l_csd = -jnp.sum(cols["coached"] * w * s) / n_coached
        return l_grpo + rl.alpha * l_csd

    return jax.jit(jax.value_and_grad(loss))


@pytest.fixture(scope="module")
def grad_case(trajectories, naive_reference):
    """Rollout log-probs near the current policy (some tokens clipped, most not) and group advantages."""
    rng = np.random.RandomState(7)
    for tr, turns in zip(trajectories, naive_reference):
        for a, (s, _) in zip(tr.agent_indices(), turns):
            tr.segments[a].logprobs = (s + rng.uniform(-0.25, 0.25, s.shape)).tolist()
    rl = RLConfig(alpha=0.5, beta=5.0, eps_low=0.2, eps_high=0.28)
    adv = grpo.trajectory_turn_advantages(trajectories)
    assert np.abs(np.concatenate(adv)).max() > 0.1
    ref_loss, ref_grads = _reference_loss(trajectories, adv, rl)(scaled_params(CFG))
    return rl, ref_loss, ref_grads


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("teacher", ["fused", "naive"])
def test_fused_loss_gradient_equals_naive(mesh_name, teacher, trajectories, grad_case):
    if teacher == "naive" and mesh_name != "fsdp4_tensor2":
        pytest.skip("the packed naive path is checked once, on the 2-D mesh")
    rl, ref_loss, ref_grads = grad_case
    rl = RLConfig(**{**rl.__dict__, "teacher": teacher, "num_microbatches": 2})
    mesh = _mesh(mesh_name)
    step = make_rl_step(CFG, optax.sgd(1.0), mesh, rl)
    packed = prepare_batch(trajectories, rl, rows_multiple=step.rows_multiple(), row_len=320, pad_multiple=16)
    assert packed.teacher == teacher
    loss, grads, sums = step.loss_and_grads(_params(mesh), step.place(packed))
    assert 0 < float(sums["clipped"]) < float(sums["agent"]) / 2, "want both clipped and unclipped tokens"
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    err = tree_rel_err(grads, ref_grads)
    print(f"{mesh_name}/{teacher}: loss {float(loss):.6f}, max relative grad error {err:.2e}")
    assert err <= 1e-5


# --------------------------------------------------------------------- no backward work for branches
# lengths no other dim shares: branch work shows up as dims 37 (Tb), 93 (T + Tb) or 23 (branch head positions);
# the student's head runs on 19 positions (the trunk's agent tokens)
_T, _TB, _KA, _KC = 56, 37, 19, 23
_IMPLS = {"dense": {}, "blockwise": dict(attention_impl="blockwise", attention_block_q=16, attention_block_k=16)}


def _small_packed():
    segs = [Segment("public", list(range(1, 13))), Segment("public", [13, 14, 15, 16, 17]),
            Segment("coach", [20, 21, 22, 23, 24, 25]), Segment("public", [30, 31]),
            Segment("agent", [40, 41, 42, 43, 44, 45, 46], logprobs=[-1.0] * 7), Segment("public", [50, 51, 52]),
            Segment("coach", [60, 61, 62, 63]), Segment("public", [30, 31]),
            Segment("agent", [70, 71, 72, 73, 74, 75], logprobs=[-1.0] * 6)]
    tr = Trajectory(segs, turn_rewards=[1.0, 0.0])
    packed = pack_trajectories([tr], [[1.0, -0.5]], row_len=_T, branch_len=_TB, head_len=_KA, branch_head_len=_KC)
    assert packed.arrays["tokens"].shape == (1, _T) and packed.arrays["branch_tokens"].shape == (1, _TB)
    assert packed.arrays["head_idx"].shape == (1, _KA) and packed.arrays["branch_head_idx"].shape == (1, _KC)
    return {k: jnp.asarray(v) for k, v in packed.arrays.items()}


@pytest.mark.parametrize("impl", list(_IMPLS))
@pytest.mark.parametrize("remat", ["none", "full", "dots"])
@pytest.mark.parametrize("scan", [True, False])
def test_branches_do_no_backward_work(remat, scan, impl):
    """The backward pass (vjp jaxpr, with remat recomputation inside it) touches no branch-shaped value, with
    either attention backend (blockwise: 16-token blocks, so the trunk runs several query x key blocks)."""
    cfg = CFG.replace(remat=remat, scan_layers=scan, **_IMPLS[impl])
    batch, params = _small_packed(), scaled_params(cfg)
    rl = RLConfig(alpha=1.0)
    branch_dims = {_TB, _TB - 1, _T + _TB, _KC}

    def backward_dims(loss):  # the jaxpr of the vjp function alone (residuals in), traced abstractly
        leaves, tree = jax.tree.flatten(jax.eval_shape(lambda p: jax.vjp(loss, p)[1], params))
        bwd = jax.make_jaxpr(lambda res, ct: jax.tree.unflatten(tree, res)(ct))(
            leaves, jax.ShapeDtypeStruct((), jnp.float32))
        return jaxpr_dims(bwd.jaxpr)

    fwd_dims = jaxpr_dims(jax.make_jaxpr(lambda p: rl_loss(cfg, rl, p, batch)[0])(params).jaxpr)
    assert {_TB, _KC} <= fwd_dims, "the forward must run the branches and their LM head"
    bwd = backward_dims(lambda p: rl_loss(cfg, rl, p, batch)[0])
    assert _KA in bwd, "the student's LM head (on its gathered positions) must show in the backward"
    assert not bwd & branch_dims

    def leaky(p):  # negative control: a teacher score that (wrongly) differentiates through the LM head
        h, hb = hidden_states(cfg, p, batch["tokens"], batch["positions"], batch["segment_ids"], {
            "tokens": batch["branch_tokens"], "positions": batch["branch_positions"],
            "branch_ids": batch["branch_ids"], "trunk_segment": batch["branch_trunk_segment"],
            "prefix_len": batch["branch_prefix_len"]})
        return logprobs_from_hidden(cfg, p, hb[:, :-1], batch["branch_tokens"][:, 1:]).sum() + h.sum()

    assert backward_dims(leaky) & branch_dims, "the detector must see branch work when there is some"


@pytest.mark.parametrize("remat,scan", [("full", False), pytest.param("dots", True, marks=pytest.mark.slow)])
def test_branch_cost_is_forward_only_in_compiled_flops(remat, scan):
    """XLA's FLOP count: adding the branches to value_and_grad costs what they cost in the forward alone."""
    cfg = CFG.replace(remat=remat, scan_layers=scan)
    batch, params = _small_packed(), scaled_params(cfg)
    rl = RLConfig(alpha=1.0)

    def flops(fn):
        c = jax.jit(fn).lower(params).compile().cost_analysis()
        return (c[0] if isinstance(c, (list, tuple)) else c)["flops"]

    def loss(teacher):
        return lambda p: rl_loss(cfg, rl, p, batch, teacher=teacher)[0]

    fwd_extra = flops(loss("fused")) - flops(loss("none"))
    grad_extra = flops(jax.value_and_grad(loss("fused"))) - flops(jax.value_and_grad(loss("none")))
    assert fwd_extra > 0
    assert abs(grad_extra - fwd_extra) <= 0.05 * fwd_extra, (grad_extra, fwd_extra)


# ------------------------------------------------------------------------------------- theory hooks
def test_csd_gradient_is_nonzero_when_every_grpo_advantage_is_zero(trajectories):
    trajs = random_batch(5, CFG.vocab_size, (3, 4, 2))
    for tr in trajs:
        tr.group_id, tr.turn_rewards = 0, [0.5] * tr.num_agent_turns  # identical scores -> A = 0 for all
    params = scaled_params(CFG)
    rl = RLConfig(alpha=0.01)
    packed = prepare_batch(trajs, rl, pad_multiple=16)
    assert packed.num_coached_tokens > 0 and not packed.arrays["advantages"].any()
    batch = {k: jnp.asarray(v) for k, v in packed.arrays.items()}
    g_grpo = jax.jit(jax.grad(lambda p: rl_loss(CFG, RLConfig(alpha=0.0), p, batch)[0]))(params)
    g_full = jax.jit(jax.grad(lambda p: rl_loss(CFG, rl, p, batch)[0]))(params)
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(g_grpo))
    assert float(optax.tree.norm(g_full)) > 1e-4


def _eqn_count(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (tuple, list)) else (p,)):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    n += _eqn_count(inner)
    return n


def test_alpha_zero_is_exactly_the_grpo_step(trajectories):
    params = scaled_params(CFG)
    rl0 = RLConfig(alpha=0.0)
    adv = [[0.3] * tr.num_agent_turns for tr in trajectories]
    with_notes = pack_trajectories(trajectories, adv, teacher="fused", row_len=320, pad_multiple=16)
    plain = pack_trajectories(trajectories, adv, teacher="none", row_len=320, pad_multiple=16)
    assert with_notes.num_coached_tokens > 0 and plain.teacher == "none"
    notes_b, plain_b = ({k: jnp.asarray(v) for k, v in x.arrays.items()} for x in (with_notes, plain))
    # With alpha = 0 the loss traced on a batch WITH notes is the GRPO loss: not one extra operation.
    count = lambda b: _eqn_count(jax.make_jaxpr(jax.grad(lambda p: rl_loss(CFG, rl0, p, b)[0]))(params).jaxpr)  # noqa
    assert count(notes_b) == count(plain_b)
    # Running the teacher branches anyway leaves the trunk's loss and gradient unchanged.
    ln, gn = jax.jit(jax.value_and_grad(lambda p: rl_loss(CFG, rl0, p, notes_b, teacher="none")[0]))(params)
    lf, gf = jax.jit(jax.value_and_grad(lambda p: rl_loss(CFG, rl0, p, notes_b, teacher="fused")[0]))(params)
    np.testing.assert_allclose(float(lf), float(ln), rtol=1e-6)
    assert tree_rel_err(gf, gn) <= 1e-6
    # The jitted step with alpha = 0 on the batch with notes = one SGD step on the GRPO gradient.
    lr = 1e3  # large, so that the update is not lost in the rounding of params - update
    step = make_rl_step(CFG, optax.sgd(lr), None, rl0)
    new, _, m = step(jax.tree.map(jnp.copy, params), step.init_opt_state(params), step.place(with_notes))
    np.testing.assert_allclose(float(m["loss"]), float(ln), rtol=1e-6)
    assert float(m["mean_w"]) == 0.0 and float(m["csd_loss"]) == 0.0
    assert tree_rel_err(jax.tree.map(lambda a, b: a - b, params, new), jax.tree.map(lambda g: lr * g, gn)) <= 1e-5
