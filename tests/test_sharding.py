"""Sharded loss+grad on 8 fake CPU devices equals the single-device result; placements follow the rules."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from mimesis_jax import models, sharding
from mimesis_jax.models import ModelConfig
from mimesis_jax.train.step import make_grad_step

CFG = ModelConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, initializer_range=0.2, logits_vocab_chunk=64, logits_seq_chunk=8)

MESHES = {
    "data8": {"data": 8},
    "fsdp8": {"fsdp": 8},
    "fsdp4_tensor2": {"fsdp": 4, "tensor": 2},
    "data2_fsdp2_tensor2": {"data": 2, "fsdp": 2, "tensor": 2},
}


def _batch(B=8, T=16, seed=0):
    rng = np.random.RandomState(seed)
    tokens = rng.randint(0, CFG.vocab_size, (B, T)).astype(np.int32)
    # two packed segments per row with restarting positions, some padding at the end of odd rows
    cut = rng.randint(4, T - 4, B)
    seg = np.where(np.arange(T)[None] < cut[:, None], 1, 2).astype(np.int32)
    seg[1::2, -3:] = 0
    pos = np.zeros((B, T), np.int32)
    for b in range(B):
        pos[b] = np.where(seg[b] == 1, np.arange(T), np.arange(T) - cut[b])
    loss_mask = (rng.rand(B, T) > 0.3).astype(np.float32) * (seg != 0)
    return {"tokens": tokens, "positions": pos, "segment_ids": seg, "loss_mask": loss_mask}


@pytest.fixture(scope="module")
def reference():
    params = models.init_params(CFG, jax.random.key(0))
    batch = _batch()
    loss, grads = make_grad_step(CFG)(params, batch)
    return params, batch, float(loss), jax.tree.map(np.asarray, grads)


def _rel(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / (np.abs(np.asarray(b)).max() + 1e-30))


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_sharded_loss_and_grads_equal_single_device(reference, mesh_name):
    params, batch, loss_ref, grads_ref = reference
    mesh = sharding.make_mesh(MESHES[mesh_name])
    sp = models.shard_params(CFG, params, mesh)
    sb = sharding.shard_batch(batch, mesh)
    loss, grads = make_grad_step(CFG, mesh)(sp, sb)
    loss = jax.block_until_ready(loss)
    assert abs(float(loss) - loss_ref) / abs(loss_ref) <= 1e-5
    worst = max(_rel(g, r) for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_ref)))
    print(f"{mesh_name}: |dloss|/loss = {abs(float(loss) - loss_ref) / abs(loss_ref):.2e}, max rel grad diff {worst:.2e}")
    assert worst <= 1e-5
    # gradients come back laid out exactly like the parameters
    for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(sp)):
        assert g.sharding.is_equivalent_to(p.sharding, p.ndim)


def test_param_placements_follow_rules():
    params = models.init_params(CFG, jax.random.key(0))
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    sp = models.shard_params(CFG, params, mesh)
    assert sp["embed"].sharding.spec == P("tensor", "fsdp")
    assert sp["lm_head"].sharding.spec == P("tensor", "fsdp")
    assert sp["layers"]["attn"]["q"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert sp["layers"]["attn"]["k"].sharding.spec == P(None, "fsdp", "tensor", None)
    assert sp["layers"]["attn"]["o"].sharding.spec == P(None, "tensor", None, "fsdp")
    assert sp["layers"]["mlp"]["down"].sharding.spec == P(None, "tensor", "fsdp")
    assert sp["layers"]["input_norm"].sharding.spec == P(None, None)
    assert sp["final_norm"].sharding.spec == P(None)
    # each device holds 1/8 of q's elements
    q = sp["layers"]["attn"]["q"]
    assert q.addressable_shards[0].data.size * 8 == q.size


def test_indivisible_dims_fall_back_to_replication():
    cfg = CFG.replace(num_key_value_heads=1)
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    specs = models.param_shardings(cfg, mesh)
    assert specs["layers"]["attn"]["k"].spec == P(None, "fsdp", None, None)  # 1 kv head cannot split over tensor=2
    assert sharding.logical_to_spec(("act_batch", None), (2, 5), {"data": 2, "fsdp": 2}) == P("data", None)
    assert sharding.logical_to_spec(("act_batch", None), (8, 5), {"data": 2, "fsdp": 2}) == P(("data", "fsdp"), None)


def test_init_params_directly_sharded_matches_host_init():
    mesh = sharding.make_mesh({"fsdp": 4, "tensor": 2})
    a = models.init_params(CFG, jax.random.key(3))
    b = models.init_params(CFG, jax.random.key(3), mesh=mesh)
    assert b["layers"]["mlp"]["gate"].sharding.spec == P(None, "fsdp", "tensor")
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_activation_constraint_applies_under_mesh():
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    f = jax.jit(lambda x: sharding.constrain(x * 2, ("act_batch", "act_length", "act_embed")))
    with sharding.use_mesh(mesh):
        y = f(jnp.ones((8, 4, 6)))
    assert y.sharding.is_equivalent_to(jax.sharding.NamedSharding(mesh, P(("data", "fsdp"), None, None)), 3)
    # without a mesh it is the identity
    np.testing.assert_array_equal(np.asarray(f(jnp.ones((8, 4, 6)))), 2 * np.ones((8, 4, 6)))


def test_mesh_errors():
    with pytest.raises(ValueError, match="needs 16 devices"):
        sharding.make_mesh({"data": 16})
    with pytest.raises(ValueError, match="'pipeline'"):
        sharding.make_mesh({"pipeline": 2})
    m = sharding.make_mesh({"data": -1, "tensor": 2})
    assert dict(m.shape) == {"data": 4, "tensor": 2}
