"""A broken checkpoint gets an error that names the tensor or config key (no torch needed)."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from helpers import assert_trees_equal
from mimesis_jax import models
from mimesis_jax.errors import ConfigError
from mimesis_jax.models import ModelConfig
from mimesis_jax.models.hf import CheckpointError

CFG = ModelConfig(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=8)


@pytest.fixture(scope="module")
def _pristine(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("pristine") / "ok")
    models.save_hf(path, CFG, models.init_params(CFG, jax.random.key(0)))
    return path


@pytest.fixture()
def ckpt(tmp_path, _pristine):
    path = str(tmp_path / "ok")
    shutil.copytree(_pristine, path)
    return path


def _edit_tensors(path, fn):
    f = os.path.join(path, "model.safetensors")
    t = load_file(f)
    fn(t)
    save_file(t, f, metadata={"format": "pt"})


def _edit_config(path, fn):
    f = os.path.join(path, "config.json")
    with open(f) as fh:
        d = json.load(fh)
    fn(d)
    with open(f, "w") as fh:
        json.dump(d, fh)


def test_ok_checkpoint_loads(ckpt):
    config, params = models.load_hf(ckpt)
    assert config.replace() == CFG


def test_missing_tensor_is_named(ckpt):
    _edit_tensors(ckpt, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        models.load_hf(ckpt)


def test_wrong_shape_is_named(ckpt):
    def bad(t):
        t["model.layers.0.self_attn.k_proj.weight"] = np.zeros((16, 16), np.float32)
    _edit_tensors(ckpt, bad)
    with pytest.raises(CheckpointError, match=r"'model\.layers\.0\.self_attn\.k_proj\.weight' has shape \(16, 16\), "
                                              r"expected \(8, 16\)"):
        models.load_hf(ckpt)


def test_unexpected_tensor_is_named(ckpt):
    def extra(t):
        t["model.layers.0.mystery.weight"] = np.zeros((3,), np.float32)
    _edit_tensors(ckpt, extra)
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mystery\.weight"):
        models.load_hf(ckpt)


def test_unknown_model_type_is_named(ckpt):
    _edit_config(ckpt, lambda d: d.update(model_type="llama7"))
    with pytest.raises(ConfigError, match=r"config\.json: config key 'model_type': unsupported value 'llama7'"):
        models.load_hf(ckpt)


@pytest.mark.parametrize("key,value,pattern", [
    ("num_key_value_heads", 3, r"'num_key_value_heads': must divide num_attention_heads"),
    ("hidden_size", -4, r"'hidden_size': must be a positive integer"),
    ("rms_norm_eps", 0.0, r"'rms_norm_eps': must be > 0"),
    ("hidden_act", "gelu", r"'hidden_act': only 'silu'"),
    ("layer_types", ["full_attention"], r"'layer_types': must have num_hidden_layers=2 entries"),
])
def test_bad_config_value_is_named(ckpt, key, value, pattern):
    _edit_config(ckpt, lambda d: d.update({key: value}))
    with pytest.raises(ConfigError, match=pattern):
        models.load_hf(ckpt)


def test_missing_config_key_is_named(ckpt):
    _edit_config(ckpt, lambda d: d.pop("vocab_size"))
    with pytest.raises(ConfigError, match=r"missing config key 'vocab_size'"):
        models.load_hf(ckpt)


def test_unsupported_rope_is_named(ckpt):
    _edit_config(ckpt, lambda d: d.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}))
    with pytest.raises(ConfigError, match=r"'rope_parameters\.rope_type': unsupported value 'yarn'"):
        models.load_hf(ckpt)


def test_missing_files_are_named(tmp_path, ckpt):
    os.remove(os.path.join(ckpt, "model.safetensors"))
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        models.load_hf(ckpt)
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.load_hf(empty)


def test_corrupt_safetensors_is_named(ckpt):
    with open(os.path.join(ckpt, "model.safetensors"), "wb") as f:
        f.write(b"\x00garbage")
    with pytest.raises(CheckpointError, match=r"model\.safetensors: cannot read safetensors file"):
        models.load_hf(ckpt)


def test_sharded_index_roundtrip(tmp_path):
    params = models.init_params(CFG, jax.random.key(1))
    path = str(tmp_path / "sharded")
    models.save_hf(path, CFG, params, max_shard_bytes=4000)
    assert os.path.exists(os.path.join(path, "model.safetensors.index.json"))
    assert len([f for f in os.listdir(path) if f.endswith(".safetensors")]) > 1
    _, loaded = models.load_hf(path)
    assert_trees_equal(params, loaded)
    # a shard listed in the index but missing is named
    victim = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))[-1]
    os.remove(os.path.join(path, victim))
    with pytest.raises(CheckpointError, match=victim):
        models.load_hf(path)


def test_bf16_checkpoint_loads(tmp_path):
    params = models.init_params(CFG, jax.random.key(2))
    cfg16 = CFG.replace(param_dtype="bfloat16", dtype="bfloat16")
    path = str(tmp_path / "bf16")
    models.save_hf(path, cfg16, params)
    config, loaded = models.load_hf(path, dtype="bfloat16")
    assert loaded["embed"].dtype == jax.numpy.bfloat16
    np.testing.assert_allclose(np.asarray(loaded["embed"], np.float32), np.asarray(params["embed"]), rtol=1e-2)
    _, as32 = models.load_hf(path)  # bf16 on disk, fp32 in memory
    assert as32["embed"].dtype == jax.numpy.float32


def test_runtime_config_errors():
    with pytest.raises(ConfigError, match="'remat'"):
        CFG.replace(remat="sometimes")
    with pytest.raises(ConfigError, match="'dtype'"):
        CFG.replace(dtype="float8")
    with pytest.raises(ConfigError, match="load_hf: dtype"):
        models.load_hf("/nonexistent", dtype="int8")
