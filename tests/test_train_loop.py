"""The Stage I trainer: exact resume (1 and 8 devices), accumulation, non-finite handling, metrics, checkpoints."""

import dataclasses
import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mimesis_jax import models
from mimesis_jax.config import CheckpointConfig, MeshConfig, OptimizerConfig, RunConfig, TrainConfig
from mimesis_jax.models import ModelConfig
from mimesis_jax.checkpoints import Checkpointer, abstract_like
from mimesis_jax.train.loop import NonFiniteLossError, train
from mimesis_jax.train.metrics import read_metrics
from mimesis_jax.train.optim import decay_mask, make_optimizer, make_schedule
from mimesis_jax.train.step import init_train_state, lm_loss, train_step
from mimesis_jax.train.synthetic import SyntheticData, SyntheticIterator

MODEL = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, logits_vocab_chunk=32, logits_seq_chunk=16)
DATA = SyntheticData(vocab_size=64, seq_len=32)


def _cfg(steps=6, mesh=MeshConfig(data=1, fsdp=1, tensor=1), **train_kw) -> RunConfig:
    t = dict(steps=steps, global_batch=8, grad_accum=2, dtype="float32", progress_bar=False, tensorboard=False)
    t.update(train_kw)
    return RunConfig(stage="midtrain", model=MODEL, data=DATA,
                     optimizer=OptimizerConfig(lr=3e-3, warmup_steps=2, weight_decay=0.1),
                     train=TrainConfig(**t), mesh=mesh, checkpoint=CheckpointConfig(every=2, keep=3))


class _CrashAfter(SyntheticIterator):
    """Dies (like a killed process) when asked for batch number `limit`."""

    limit = 0

    def __next__(self):
        if self.index >= self.limit:
            raise RuntimeError("simulated crash")
        return super().__next__()


def _crashing(limit):
    def make(tok, b, seed, pi, pc):
        it = _CrashAfter(DATA, b, seed, pi)
        it.limit = limit
        return it
    return make


def _final_params(workdir, cfg):
    ck = Checkpointer(workdir, read_only=True)
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:1]), ("x",))
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    ab = models.abstract_params(cfg.runtime_model())
    params, step = ck.restore_params(None, abstract_like(ab, jax.tree.map(lambda _: rep, ab)))
    ck.close()
    return step, jax.device_get(params)


@pytest.mark.parametrize("mesh", [MeshConfig(data=1, fsdp=1, tensor=1), MeshConfig(data=1, fsdp=4, tensor=2)],
                         ids=["1device", "fsdp4_tensor2"])
def test_resume_equals_uninterrupted(tmp_path, mesh):
    cfg = _cfg(steps=6, mesh=mesh)
    straight = train(cfg, str(tmp_path / "straight"), handle_signals=False)
    assert sorted(straight.losses) == list(range(1, 7))

    wd = str(tmp_path / "resumed")
    with pytest.raises(RuntimeError, match="simulated crash"):  # dies while fetching batch 6 (after step 5)
        train(cfg, wd, data=_crashing(5), handle_signals=False)
    assert Checkpointer(wd, read_only=True).latest_step() == 4  # every=2: step 5 was not saved
    resumed = train(cfg, wd, handle_signals=False)
    assert resumed.start_step == 4 and sorted(resumed.losses) == [5, 6]
    for s in (5, 6):  # same compiled program, same restored bits, same data position: exact
        assert resumed.losses[s] == straight.losses[s], (s, resumed.losses[s], straight.losses[s])
    # metrics.jsonl of the resumed run describes one consistent run (step 5 of the dead run was dropped)
    recs = read_metrics(wd)
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in recs] == [straight.losses[s] for s in range(1, 7)]
    s1, p1 = _final_params(str(tmp_path / "straight"), cfg)
    s2, p2 = _final_params(wd, cfg)
    assert s1 == s2 == 6
    jax.tree.map(np.testing.assert_array_equal, p1, p2)
    assert straight.losses[6] < straight.losses[1]
    if mesh.tensor > 1:
        _check_restored_shardings(wd, cfg)


def _check_restored_shardings(workdir, cfg):
    """Restoring on a mesh places params by the rules and Adam moments like their params."""
    from mimesis_jax import sharding
    from mimesis_jax.train.state import state_shardings

    mesh = sharding.make_mesh(cfg.mesh.axes())
    mc = cfg.runtime_model()
    ab, sh = state_shardings(mc, make_optimizer(cfg.optimizer, cfg.train.steps, mc), mesh)
    ck = Checkpointer(workdir, read_only=True)
    state, data_state, run = ck.restore(None, abstract_like(ab, sh))
    ck.close()
    assert data_state == {"index": 6} and run["train"]["steps"] == 6 and int(state["step"]) == 6
    q = state["params"]["layers"]["attn"]["q"]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
    adam = state["opt_state"][1][0]  # chain(clip, adamw): adamw = (scale_by_adam, weight decay, lr)
    assert adam.mu["layers"]["attn"]["q"].sharding.spec == q.sharding.spec
    assert adam.nu["embed"].sharding.spec == state["params"]["embed"].sharding.spec


def _random_batch(B=4, T=16, seed=0):
    rng = np.random.RandomState(seed)
    seg = np.ones((B, T), np.int32)
    seg[0, 10:] = 2
    seg[3, 5:] = 0  # a mostly padded row: micro-batches hold very different target counts
    mask = (rng.rand(B, T) < 0.7).astype(np.float32)
    pos = np.where(seg == 2, np.arange(T) - 10, np.arange(T)).astype(np.int32)
    return {"tokens": rng.randint(0, MODEL.vocab_size, (B, T)).astype(np.int32), "positions": pos,
            "segment_ids": seg, "loss_mask": mask}


def test_grad_accumulation_uses_the_global_token_count():
    """grad_accum=2 gives the loss and update of one big batch (not a mean of micro-batch means)."""
    mc = MODEL
    params = models.init_params(mc, jax.random.key(0))
    tx = optax.sgd(1.0)  # the update is -grad: compares gradients directly
    batch = {k: jnp.asarray(v) for k, v in _random_batch().items()}
    ref_loss, ref_grad = jax.value_and_grad(lambda p: lm_loss(mc, p, batch))(params)
    for accum in (1, 4):
        state = init_train_state(params, tx, jax.random.key(1))
        new, m = jax.jit(lambda s, b: train_step(mc, tx, s, b, grad_accum=accum))(state, batch)
        np.testing.assert_allclose(float(m["loss"]), float(ref_loss), rtol=1e-6)
        got = jax.tree.map(lambda a, b: a - b, params, new["params"])
        jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, atol=2e-7, rtol=1e-5), got, ref_grad)
    # a mean of micro-batch means would differ here: the micro-batches have unequal target counts
    w = np.asarray(batch["loss_mask"])[:, 1:] * (np.asarray(batch["segment_ids"])[:, 1:] != 0)
    counts = [w[j::4].sum() for j in range(4)]
    assert len(set(counts)) > 1, counts


def test_nonfinite_loss_stops_with_the_step(tmp_path):
    cfg = _cfg(steps=6, mesh=MeshConfig(data=1, fsdp=1, tensor=1), grad_accum=1)
    cfg = cfg.replace(optimizer=dataclasses.replace(cfg.optimizer, lr=1e30, warmup_steps=0, clip_norm=0.0))
    with pytest.raises(NonFiniteLossError, match=r"step 2: non-finite loss .*train.nonfinite=skip"):
        train(cfg, str(tmp_path), handle_signals=False)
    recs = read_metrics(str(tmp_path))
    assert [r["finite"] for r in recs] == [True, False]


def test_nonfinite_skip_counts_and_keeps_params(tmp_path):
    cfg = _cfg(steps=8, mesh=MeshConfig(data=1, fsdp=1, tensor=1), grad_accum=1, nonfinite="skip",
               max_consecutive_skips=3)
    # lr 1e15: step 1 makes the weights ~1e15 (their norm stays finite), step 2's attention logits overflow
    cfg = cfg.replace(optimizer=dataclasses.replace(cfg.optimizer, lr=1e15, warmup_steps=0, clip_norm=0.0))
    with pytest.raises(NonFiniteLossError, match="3 non-finite steps in a row"):
        train(cfg, str(tmp_path), handle_signals=False)
    recs = read_metrics(str(tmp_path))
    assert [r["finite"] for r in recs] == [True, False, False, False]
    assert [r["nonfinite_total"] for r in recs] == [0, 1, 2, 3]
    # skipped updates leave the (huge but finite) weights of step 1 untouched
    norms = [r["param_norm"] for r in recs]
    assert math.isfinite(norms[0]) and norms[1] == norms[2] == norms[3] == norms[0]
    # optax's step counts advanced through the skipped step 2 (checkpointed), so the logged schedule by step
    # number is the one applied
    from mimesis_jax import sharding
    from mimesis_jax.train.state import state_shardings

    mesh = sharding.make_mesh(cfg.mesh.axes())
    mc = cfg.runtime_model()
    ab, sh = state_shardings(mc, make_optimizer(cfg.optimizer, cfg.train.steps, mc), mesh)
    ck = Checkpointer(str(tmp_path), read_only=True)
    state, _, _ = ck.restore(2, abstract_like(ab, sh))
    ck.close()
    counts = [int(x) for x in jax.tree.leaves(state["opt_state"]) if x.dtype == jnp.int32]
    assert counts and set(counts) == {2} and int(state["nonfinite"]) == 1
    sched = make_schedule(cfg.optimizer, cfg.train.steps)
    np.testing.assert_allclose([r["lr"] for r in recs], [float(sched(s)) for s in range(4)], rtol=1e-6)


def test_metrics_tensorboard_and_keep_n(tmp_path):
    cfg = _cfg(steps=6, tensorboard=True, log_every=3)
    cfg = cfg.replace(checkpoint=CheckpointConfig(every=1, keep=2, async_save=False))
    res = train(cfg, str(tmp_path), handle_signals=False)
    recs = read_metrics(str(tmp_path))
    assert [r["step"] for r in recs] == list(range(1, 7))
    for r in recs:
        for k in ("loss", "lr", "grad_norm", "tokens", "target_tokens", "tokens_per_s", "step_time_s"):
            assert isinstance(r[k], (int, float)) and math.isfinite(r[k]), (k, r)
        assert r["tokens"] > r["target_tokens"] > 0
    sched = make_schedule(cfg.optimizer, cfg.train.steps)
    np.testing.assert_allclose([r["lr"] for r in recs], [float(sched(s)) for s in range(6)], rtol=1e-6)
    assert os.listdir(tmp_path / "tensorboard")
    assert sorted(int(d) for d in os.listdir(tmp_path / "checkpoints") if d.isdigit()) == [5, 6]
    assert res.checkpoint_step == 6
    with open(tmp_path / "run_config.json") as f:
        assert json.load(f)["train"]["steps"] == 6
    again = train(cfg, str(tmp_path), handle_signals=False)  # finished run: nothing to do
    assert again.losses == {} and again.final_step == 6


def test_schedule_matches_its_formula():
    cfg = OptimizerConfig(lr=2.0, warmup_steps=3, schedule="cosine", min_lr_ratio=0.1)
    sched = make_schedule(cfg, 10)

    def ref(s):  # linear warmup (s+1)/W, then cosine from lr to lr*min over the remaining steps
        if s < 3:
            return 2.0 * (s + 1) / 3
        frac = (s - 3) / 7
        return 2.0 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
    np.testing.assert_allclose([float(sched(s)) for s in range(12)], [ref(min(s, 10)) for s in range(12)], rtol=1e-6)
    const = make_schedule(OptimizerConfig(lr=1e-7, schedule="constant"), 10)
    assert [float(const(s)) for s in (0, 5, 9)] == pytest.approx([1e-7] * 3)


def test_weight_decay_only_on_matrices():
    mask = decay_mask(MODEL)
    assert mask["embed"] and mask["layers"]["attn"]["q"] and mask["layers"]["mlp"]["down"]
    assert not mask["final_norm"] and not mask["layers"]["input_norm"] and not mask["layers"]["attn"]["q_norm"]


def test_bf16_compute_with_remat_keeps_fp32_state():
    """train.dtype=bfloat16 + remat: activations in bf16, weights and AdamW moments stay fp32, loss ~ fp32 loss."""
    mc32 = MODEL
    mc16 = MODEL.replace(dtype="bfloat16", remat="full")
    params = models.init_params(mc32, jax.random.key(0))
    tx = make_optimizer(OptimizerConfig(lr=1e-3), 10, mc32)
    batch = {k: jnp.asarray(v) for k, v in _random_batch().items()}
    new, m = jax.jit(lambda s, b: train_step(mc16, tx, s, b, grad_accum=2))(
        init_train_state(params, tx, jax.random.key(1)), batch)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new["params"]))
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(new["opt_state"]) if x.ndim)
    ref = float(lm_loss(mc32, params, batch))
    assert abs(float(m["loss"]) - ref) < 2e-2 * ref and bool(m["finite"])
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), new["params"], params)
    assert min(jax.tree.leaves(moved)) > 0  # a 1e-3 step is not lost to bf16 rounding of the weights
