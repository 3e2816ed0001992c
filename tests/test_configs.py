"""Run configs: --set parsing and its named errors; the paper configs build abstractly (no arrays)."""

import dataclasses
import math
import os
import time

import jax
import numpy as np
import pytest

from mimesis_jax import models, sharding
from mimesis_jax.config import (ConfigError, OptimizerConfig, RunConfig, TrainConfig, apply_overrides, load_config,
                                parse_value, validate)
from mimesis_jax.models import ModelConfig
from mimesis_jax.train.synthetic import SyntheticData

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
PAPER = {  # Table 4: steps, LR, max length, devices
    "mimesis_midtrain.py:4b": dict(steps=5000, lr=3e-5, seq_len=24_576, devices=32, size=4.2e9),
    "mimesis_midtrain.py:9b": dict(steps=5000, lr=3e-5, seq_len=24_576, devices=32, size=8.9e9),
    "mimesis_sft.py:4b": dict(lr=1e-7, seq_len=32_768, devices=8, size=4.2e9, tokens=15.8e6),
    "mimesis_sft.py:9b": dict(lr=1e-7, seq_len=32_768, devices=8, size=8.9e9, tokens=15.8e6),
}

BASE = RunConfig(stage="midtrain", data=SyntheticData(),
                 model=ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8))


# ----------------------------------------------------------------------------------------- --set
def test_set_parses_to_the_field_types():
    cfg = apply_overrides(BASE, ["train.steps=7", "checkpoint.every=3", "optimizer.lr=1e-4", "train.tensorboard=false",
                                 "optimizer.schedule=constant", "model.hidden_size=48", "data.seq_len=16",
                                 "model.eos_token_id=[3, 4]", "init.from_workdir='runs/a b'", "mesh.fsdp=-1"])
    assert cfg.train.steps == 7 and cfg.checkpoint.every == 3 and cfg.optimizer.lr == 1e-4
    assert cfg.train.tensorboard is False and cfg.optimizer.schedule == "constant"
    assert cfg.model.hidden_size == 48 and cfg.data.seq_len == 16 and cfg.model.eos_token_id == (3, 4)
    assert cfg.init.from_workdir == "runs/a b" and cfg.mesh.fsdp == -1
    assert BASE.train.steps != 7  # frozen: overrides return a copy
    assert validate(cfg) is cfg


@pytest.mark.parametrize("item, message", [
    ("train.stepz=3", r"unknown key 'train.stepz'.*'steps'"),
    ("trian.steps=3", r"unknown key 'trian'"),
    ("train.steps=three", r"train.steps=three: not an integer"),
    ("train.steps=2.5", r"train.steps=2.5: not an integer"),
    ("optimizer.lr=fast", r"optimizer.lr=fast: not a number"),
    ("train.tensorboard=maybe", r"train.tensorboard=maybe: not a boolean"),
    ("optimizer.schedule=linear", r"optimizer.schedule=linear: must be one of \['cosine', 'constant'\]"),
    ("train.dtype=float16", r"train.dtype=float16: must be one of"),
    ("train=3", r"'train' is a section"),
    ("train.steps.x=3", r"'train.steps' is a value"),
    ("train.steps", r"expected key=value"),
    ("model.num_key_value_heads=3", r"model.num_key_value_heads=3: .*'num_key_value_heads'.*divide"),
    ("model.eos_token_id=[1, x]", r"model.eos_token_id"),
])
def test_set_errors_name_the_key(item, message):
    with pytest.raises(ConfigError, match=message):
        apply_overrides(BASE, [item])


@pytest.mark.parametrize("item, message", [
    ("train.steps=0", r"'train.steps': must be >= 1"),
    ("train.grad_accum=3", r"'train.grad_accum': must divide train.global_batch=8"),
    ("optimizer.lr=inf", r"'optimizer.lr': must be a finite number > 0"),
    ("optimizer.warmup_steps=500", r"'optimizer.warmup_steps': must be <= train.steps=100"),
    ("train.remat=some", r"'train.remat': must be one of"),
    ("mesh.tensor=0", r"'mesh.tensor'"),
    ("model.dtype=bfloat16", r"'model.dtype': a runtime field: set train.dtype"),
    ("data.alphabet=100", r"'data.alphabet'"),
    ("init.from_hf=x", None),  # valid alone
])
def test_validation_errors_name_the_key(item, message):
    cfg = apply_overrides(BASE, [item])
    if message is None:
        validate(cfg)
        cfg = apply_overrides(cfg, ["init.from_workdir=y"])
        message = r"'init.from_hf': set at most one"
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_parse_value_types():
    from typing import Literal, Optional

    assert parse_value("none", Optional[int], "k") is None and parse_value("3", Optional[int], "k") == 3
    assert parse_value("a, b", tuple[str, ...], "k") == ("a", "b")
    assert parse_value("[1, 2]", tuple[int, int], "k") == (1, 2)
    assert parse_value('{"x": 1}', dict, "k") == {"x": 1}
    assert parse_value("1_000", int, "k") == 1000 and parse_value("yes", bool, "k") is True
    with pytest.raises(ConfigError, match=r"k\[1\]=x: not an integer"):
        parse_value("[1, x]", tuple[int, ...], "k")
    with pytest.raises(ConfigError, match="expected 2 entries"):
        parse_value("[1, 2, 3]", tuple[int, int], "k")
    assert parse_value("b", Literal["a", "b"], "k") == "b"


def test_data_source_entries_are_addressable():
    cfg = load_config(os.path.join(CONFIGS, "tiny_midtrain.py"),
                      ["data.sources.1.weight=2.5", "data.sources.0.path=/x.jsonl"])
    assert cfg.data.sources[1].weight == 2.5 and cfg.data.sources[0].path == "/x.jsonl"
    with pytest.raises(ConfigError, match=r"data.sources.7.*list of 2 entries"):
        load_config(os.path.join(CONFIGS, "tiny_midtrain.py"), ["data.sources.7.weight=1"])
    with pytest.raises(ConfigError, match=r"data.sources.0.format=csv: must be one of"):
        load_config(os.path.join(CONFIGS, "tiny_midtrain.py"), ["data.sources.0.format=csv"])


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(str(tmp_path / "missing.py"))
    bad = tmp_path / "bad.py"
    bad.write_text("X = 1\n")
    with pytest.raises(ConfigError, match=r"bad.py: a config file must define get_config\(\)"):
        load_config(str(bad))
    syntax = tmp_path / "syntax.py"
    syntax.write_text("def get_config():\n    return (\n")
    with pytest.raises(ConfigError, match=r"syntax.py:2: syntax error: '\(' was never closed"):
        load_config(str(syntax))
    raises = tmp_path / "raises.py"
    raises.write_text("import os\n\n\ndef get_config():\n    return 1\n\n\nX = {}['missing']\n")
    with pytest.raises(ConfigError, match=r"raises.py:8: KeyError: 'missing'"):
        load_config(str(raises))


def test_negative_steps_blame_steps_and_warmup_says_which_key_to_set():
    with pytest.raises(ConfigError, match=r"'train.steps': must be >= 1 \(got -5\)"):
        validate(apply_overrides(BASE, ["train.steps=-5"]))
    cfg = load_config(os.path.join(CONFIGS, "tiny_midtrain.py"))
    assert cfg.optimizer.warmup_steps == 10
    with pytest.raises(ConfigError, match=r"optimizer.warmup_steps.*--set optimizer.warmup_steps=0"):
        load_config(os.path.join(CONFIGS, "tiny_midtrain.py"), ["train.steps=3"])


# ---------------------------------------------------------------------------------------- shipped configs
@pytest.mark.parametrize("name", ["tiny_midtrain", "tiny_sft"])
def test_tiny_configs_load(name):
    cfg = load_config(os.path.join(CONFIGS, f"{name}.py"))
    assert cfg.model.model_type == "qwen3_5_text" and cfg.tokenizer.set_model_vocab
    assert cfg.stage == name.split("_")[1]
    fmt = {"midtrain": "midtrain", "sft": "thoughttrace"}[cfg.stage]
    assert all(s.format == fmt and os.path.isfile(s.path) for s in cfg.data.sources)


def _bytes_per_device(abstract, shardings, mesh_shape) -> float:
    total = 0.0
    for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)):
        split = 1
        for entry in s.spec:
            for ax in (entry if isinstance(entry, tuple) else (entry,)):
                split *= mesh_shape.get(ax, 1) if ax else 1
        total += np.prod(x.shape) * x.dtype.itemsize / split
    return total


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_config_builds_abstractly(name):
    """Table 4 settings; params, optimizer state and shardings on an abstract mesh of the config's size."""
    from mimesis_jax.train.loop import state_shardings
    from mimesis_jax.train.optim import make_optimizer
    from mimesis_jax.train.step import split_micro_batches, train_step

    want = PAPER[name]
    cfg = load_config(os.path.join(CONFIGS, name))
    assert cfg.optimizer.lr == want["lr"] and cfg.data.seq_len == want["seq_len"]
    if "steps" in want:
        assert cfg.train.steps == want["steps"]
    if "tokens" in want:  # 3 epochs of ThoughtTrace ~ 15.8M tokens processed
        slots = cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len
        assert abs(slots / want["tokens"] - 1) < 0.05, slots
    mc = cfg.runtime_model()
    assert (mc.model_type, mc.dtype, mc.param_dtype) == ("qwen3_5_text", "bfloat16", "float32")
    assert mc.attention_impl == "blockwise"  # 24K-32K rows: no [B, H, T, T] scores
    mesh_shape = {k: v for k, v in cfg.mesh.axes().items()}
    assert -1 not in mesh_shape.values() and math.prod(mesh_shape.values()) == want["devices"]
    mesh = jax.sharding.AbstractMesh(tuple(mesh_shape.values()), tuple(mesh_shape))

    abstract = models.abstract_params(mc)
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract))
    assert abs(n / want["size"] - 1) < 0.15, f"{n / 1e9:.2f}B parameters"
    tx = make_optimizer(cfg.optimizer, cfg.train.steps, mc)
    abs_state, sh = state_shardings(mc, tx, mesh)
    assert all(x.dtype == np.float32 for x in jax.tree.leaves(abs_state["opt_state"]) if x.ndim)

    # every dim is split over mesh axes that divide it, and big matrices over every device
    specs = models.param_specs(mc)
    flat_specs = jax.tree.leaves(specs, is_leaf=models.is_spec)
    for spec, s in zip(flat_specs, jax.tree.leaves(sh["params"])):
        assert s.spec == sharding.logical_to_spec(spec.axes, spec.shape, mesh_shape)
        used = 1
        for dim, entry in zip(spec.shape, tuple(s.spec) + (None,) * (len(spec.shape) - len(s.spec))):
            axes = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
            k = math.prod(mesh_shape[a] for a in axes)
            assert dim % k == 0
            used *= k
        if np.prod(spec.shape) >= 2**24:  # embeddings, MLP and projection stacks
            assert used == want["devices"], (spec.axes, s.spec)
    # optimizer moments are placed like their parameters
    adam = abs_state["opt_state"][1][0]
    adam_sh = sh["opt_state"][1][0]
    for moment in ("mu", "nu"):
        for p, m in zip(jax.tree.leaves(sh["params"]), jax.tree.leaves(getattr(adam_sh, moment))):
            assert p.spec == m.spec
    assert jax.tree.structure(adam.mu) == jax.tree.structure(abs_state["params"])
    # fp32 weights + two Adam moments + fp32 grads per device: what the config comments promise
    per_device = 4 / 3 * (_bytes_per_device(abs_state["params"], sh["params"], mesh_shape)
                          + _bytes_per_device(adam.mu, adam_sh.mu, mesh_shape)
                          + _bytes_per_device(adam.nu, adam_sh.nu, mesh_shape))
    assert per_device < {32: 5e9, 8: 20e9}[want["devices"]], per_device / 1e9

    # the batch splits evenly: global batch and each micro-batch over the batch axes
    shards = mesh_shape["data"] * mesh_shape["fsdp"]
    micro = cfg.train.global_batch // cfg.train.grad_accum
    assert cfg.train.global_batch % cfg.train.grad_accum == 0 and micro % shards == 0

    # the whole train step traces at the paper's shapes (shape evaluation only)
    t0 = time.perf_counter()
    B, T = cfg.train.global_batch, cfg.data.seq_len
    batch = {k: jax.ShapeDtypeStruct((B, T), np.float32 if k == "loss_mask" else np.int32)
             for k in ("tokens", "positions", "segment_ids", "loss_mask")}
    new_state, metrics = jax.eval_shape(
        lambda s, b: train_step(mc, tx, s, b, grad_accum=cfg.train.grad_accum), abs_state, batch)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), new_state) == jax.tree.map(lambda a: (a.shape, a.dtype),
                                                                                   abs_state)
    assert metrics["loss"].shape == () and split_micro_batches is not None
    print(f"{name}: {n / 1e9:.2f}B params, {per_device / 1e9:.2f} GB/device state, "
          f"traced in {time.perf_counter() - t0:.1f} s")


def test_model_vocab_from_tokenizer():
    from mimesis_jax.train.loop import model_config_for

    class Tok:
        vocab_size, eos_id, pad_id = 1000, 7, 1

    cfg = apply_overrides(BASE, ["tokenizer.set_model_vocab=true", "tokenizer.vocab_multiple=64"])
    mc = model_config_for(cfg, Tok())
    assert (mc.vocab_size, mc.eos_token_id, mc.pad_token_id) == (1024, 7, 1)
    with pytest.raises(ConfigError, match=r"'model.vocab_size': 64 is smaller than tokenizer"):
        model_config_for(BASE, Tok())


def test_optimizer_and_train_defaults_are_valid():
    validate(RunConfig(stage="sft", model=BASE.model, data=SyntheticData(), optimizer=OptimizerConfig(),
                       train=TrainConfig()))


def test_agent_rl_paper_configs_follow_table_13():
    """configs/qwen3_8b_agentrl.py:{grpo,csd}: Table 13 and UserRL's inherited settings; an ~8.2B Qwen3 agent."""
    from mimesis_jax.train import agent_rl_loop

    grpo_cfg = agent_rl_loop.load(os.path.join(CONFIGS, "qwen3_8b_agentrl.py:grpo"))
    csd_cfg = agent_rl_loop.load(os.path.join(CONFIGS, "qwen3_8b_agentrl.py:csd"))
    for c in (grpo_cfg, csd_cfg):
        assert c.train.steps == 100 and c.rollout.group_size == 8 and c.rollout.max_turns == 16
        assert c.optimizer.lr == 1e-6 and c.rl.gamma == 0.8 and c.rl.beta == 5.0
        assert c.rollout.temperature == 1.0 and c.validation.temperature == 0.0
        assert c.train.dtype == "bfloat16" and c.train.remat == "full" and c.model.attention_impl == "blockwise"
        assert c.gyms.max_prompt_tokens == 1152 and c.rollout.max_context_tokens == 1152 + 8192
        assert (c.rollout.prompts_per_step, c.rollout.mini_batch_prompts, c.updates_per_step()) == (128, 16, 8)
        assert (c.rl.eps_low, c.rl.eps_high, c.rl.loss_agg) == (0.2, 0.2, "token-mean")
        assert math.prod(v for v in c.mesh.axes().values()) == 16
    assert grpo_cfg.rl.alpha == 0.0 and csd_cfg.rl.alpha == 0.01
    assert dataclasses.replace(csd_cfg.rl, alpha=0.0) == grpo_cfg.rl
    n = sum(math.prod(x.shape) for x in jax.tree.leaves(models.abstract_params(grpo_cfg.model)))
    assert 8.1e9 < n < 8.3e9, n
