"""The rollout engine's replica layout in the RL loops (docs/engine.md, "The RL loops' layout"): with
`rollout.engine` and `rollout.mesh` unset the engine decodes in `replica=<rest>,tensor=<training tensor>` (fsdp 1,
config/layout.py engine_layout), its weights resharded into it once per update by the weight sync with the
matrices in the compute dtype (WeightSync(exact=True), models.compute_cast_mask). On 8 fake devices with the
tiny Qwen3 and Qwen3.5 in bfloat16 compute: the layout, the cast mask by hand, and an engine on the synced bf16
copy drawing exactly (bit for bit) the tokens and log-probs of the same engine on the float32 training arrays."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mimesis_jax import models, sharding
from mimesis_jax.config import tiny_qwen3, tiny_qwen3_5
from mimesis_jax.config.layout import decode_layout, layout_text
from mimesis_jax.inference import weight_sync
from mimesis_jax.inference.engine import EngineConfig, RolloutEngine
from mimesis_jax.train.rl import chat_models, distributed

TRAIN = {"data": 1, "fsdp": 4, "tensor": 2}  # the learner's layout: weights split over fsdp
EC = EngineConfig(slots=2, page_size=4, num_pages=32, max_pages_per_seq=8, prefill_chunk=8, prefill_rows=1,
                  decode_steps=4, num_states=6)


def _rollout(engine=True, mesh=""):
    return types.SimpleNamespace(engine=engine, mesh=mesh)  # the RolloutConfig fields layout_of reads


def test_the_engine_decodes_in_its_replica_layout_unless_rollout_mesh_says_otherwise():
    mesh = sharding.make_mesh(TRAIN)
    assert distributed.layout_of(_rollout(), mesh) == {"replica": -1, "tensor": 2}
    assert dict(distributed.rollout_mesh(mesh, _rollout()).shape) == {"data": 4, "fsdp": 1, "tensor": 2}
    # the static sampler keeps the training layout; an explicit rollout.mesh wins for both
    assert distributed.layout_of(_rollout(engine=False), mesh) is None
    assert distributed.rollout_mesh(mesh, _rollout(engine=False)) is mesh
    assert dict(distributed.rollout_mesh(mesh, _rollout(mesh="replica=2,tensor=4")).shape) == {
        "data": 2, "fsdp": 1, "tensor": 4}
    assert layout_text(decode_layout("", True, 2)) == "tensor=2" and decode_layout("", False, 2) is None


def test_the_cast_mask_is_the_matrices_and_the_embedding_but_not_the_lm_head():
    config = tiny_qwen3().replace(tie_word_embeddings=False)
    flat = jax.tree_util.tree_flatten_with_path(models.compute_cast_mask(config))[0]
    got = {jax.tree_util.keystr(p): v for p, v in flat}
    cast = {"['embed']", "['layers']['attn']['q']", "['layers']['attn']['k']", "['layers']['attn']['v']",
            "['layers']['attn']['o']", "['layers']['mlp']['gate']", "['layers']['mlp']['up']",
            "['layers']['mlp']['down']"}
    assert {k for k, v in got.items() if v} == cast
    assert not got["['lm_head']"] and not got["['final_norm']"] and not got["['layers']['input_norm']"]
    # tied: the one table is also the LM head, read in float32
    tied = tiny_qwen3().replace(tie_word_embeddings=True)
    assert not dict((jax.tree_util.keystr(p), v) for p, v in
                    jax.tree_util.tree_flatten_with_path(models.compute_cast_mask(tied))[0])["['embed']"]


CONFIGS = {"qwen3": lambda: tiny_qwen3().replace(dtype="bfloat16", tie_word_embeddings=False),
           "qwen3_5": lambda: tiny_qwen3_5().replace(dtype="bfloat16", num_hidden_layers=2,
                                                     layer_types=("linear_attention", "full_attention"))}


def _turns(eng, vocab):
    rng = np.random.RandomState(0)
    ctx = [list(rng.randint(0, vocab, size=n)) for n in (5, 9, 3, 7)]
    out = []
    for turn in range(2):
        samples = eng.generate_tokens(ctx, keys="abcd", max_tokens=[5, 3, 6, 4], temperature=[0.0, 1.0, 1.0, 0.7],
                                      seed=[7 + turn, 8 + turn, 9 + turn, 3 + turn])
        out.append([(s.tokens, s.logprobs) for s in samples])
        ctx = [c + s.tokens + list(rng.randint(0, vocab, size=3)) for c, s in zip(ctx, samples)]
    return out


@pytest.mark.parametrize("name", ["qwen3", "qwen3_5"])
def test_the_synced_bf16_copy_samples_bit_for_bit_as_the_training_arrays(name):
    config = CONFIGS[name]()
    train = sharding.make_mesh(TRAIN)
    params = models.init_params(config, jax.random.key(1), train)
    assert weight_sync.engine_dtype(config) == jnp.bfloat16
    copy = chat_models.engine_params(params, config, train, _rollout())
    on = distributed.rollout_mesh(train, _rollout())
    mask = jax.tree.leaves(models.compute_cast_mask(config))
    for x, y, cast in zip(jax.tree.leaves(params), jax.tree.leaves(copy), mask):
        assert y.dtype == (jnp.bfloat16 if cast else x.dtype)
        np.testing.assert_array_equal(np.asarray(y), np.asarray(x).astype(y.dtype))
        assert y.sharding.mesh.shape == on.shape and "fsdp" not in str(y.sharding.spec)
    # the same engine (same layout) on the float32 arrays and on the copy: identical draws
    ref = _turns(RolloutEngine(config, params, EC, mesh=on), config.vocab_size)
    got = _turns(RolloutEngine(config, copy, EC, mesh=on), config.vocab_size)
    assert got == ref
