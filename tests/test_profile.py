"""The `profile` command (mimesis_jax/commands/profile.py) on the tiny Stage II configs, and the FLOP counts it uses."""

import argparse
import glob
import json
import math
import os
import re

import jax
import jax.numpy as jnp
import pytest

from mimesis_jax import profiling
from mimesis_jax.commands import profile as profile_cmd
from mimesis_jax.config import load_config
from mimesis_jax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = os.path.join(ROOT, "configs")
PEAK = 1e11
# one device (the tests run with 8 fake CPU devices), 2 tasks x 2 dialogues per update
SMALL = ["mesh.fsdp=1", "rollout.mini_batch_prompts=2", "rollout.group_size=2"]


def _args(*argv):
    p = argparse.ArgumentParser()
    profile_cmd.add_args(p)
    return p.parse_args(list(argv))


def _profile(tmp_path_factory, what, config):
    out = str(tmp_path_factory.mktemp(what))
    assert profile_cmd.run(_args("--config", os.path.join(CONFIGS, config), "--what", what, "--steps", "2",
                                 "--out", out, "--peak-flops", str(PEAK), "--set", *SMALL)) == 0
    with open(os.path.join(out, "summary.json")) as f:
        return out, json.load(f)


@pytest.fixture(scope="module")
def csd(tmp_path_factory):
    return _profile(tmp_path_factory, "csd_step", "tiny_agentrl.py:csd")


@pytest.fixture(scope="module")
def grpo(tmp_path_factory):
    return _profile(tmp_path_factory, "grpo_step", "tiny_agentrl.py:grpo")


STEP_SCOPES = ("trunk", "attention", "attention_core", "mlp", "logprob_head", "loss", "optimizer")


def test_trace_and_hlo_hold_the_named_scopes(csd, grpo):
    for (out, _), scopes, absent in ((csd, STEP_SCOPES + ("csd_branches",), ()),
                                     (grpo, STEP_SCOPES, ("csd_branches",))):
        traces = glob.glob(os.path.join(out, "plugins", "profile", "*", "*.xplane.pb"))
        assert len(traces) == 1
        data = open(traces[0], "rb").read()
        hlo = open(os.path.join(out, "program.hlo.txt")).read()
        op_names = "\n".join(re.findall(r'op_name="([^"]*)"', hlo))
        for s in scopes:
            assert s.encode() in data, (out, s)
            assert re.search(rf"(^|[/(]){s}[/)]", op_names, re.M), (out, s)
        for s in absent:  # alpha = 0 traces no teacher work at all (the trace holds every program of the process)
            assert f"/{s}/" not in op_names


def test_csd_summary_model_flops_by_hand(csd):
    _, s = csd
    # tiny Qwen3: L = 2, D = 64, H = 4, KVH = 2, Dh = 16, I = 128, V = 1024 (tokenizer size, multiple of 64)
    n_layers = 2 * (64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64 + 3 * 64 * 128)  # 73,728
    n_head = 1024 * 64
    attn = 4 * 4 * 16 * 2  # 4 H Dh L per (query, key) pair
    # 4 dialogues: prompt 64, 2 turns of (user 32, header 3, reply 24); a note of 16 before turn 0's header
    trunk = 4 * (64 + 2 * (32 + 3 + 24))  # 728 tokens, positions 0..181 per dialogue
    trunk_keys = 4 * 182 * 183 // 2
    agent, coached = 4 * 2 * 24, 4 * 24
    branch = 4 * (16 + 3 + 24)  # one branch per dialogue, positions 96..138 (after prompt + user message)
    branch_keys = 4 * sum(p + 1 for p in range(96, 139))
    want = (3 * (2 * n_layers * trunk + 2 * n_head * agent + attn * trunk_keys)
            + (2 * n_layers * branch + 2 * n_head * coached + attn * branch_keys))
    assert s["tokens_per_step"] == trunk and s["batch"]["teacher_tokens"] == branch
    assert s["batch"]["agent_tokens"] == agent and s["batch"]["coached_tokens"] == coached
    assert s["model_flops_per_step"] == want
    assert s["keys_per_token"] == trunk_keys / trunk == 91.5
    assert s["conventional_flops_per_token"] == 6 * (n_layers + n_head) + 3 * attn * 91.5
    med = s["step_time_s"]["median"]
    assert all(t > 0 and math.isfinite(t) for t in s["step_time_s"]["all"]) and len(s["step_time_s"]["all"]) == 2
    assert s["tokens_per_s"] == pytest.approx(trunk / med, rel=1e-12)
    assert s["achieved_flops_per_s"] == pytest.approx(want / med, rel=1e-12)
    assert s["mfu"] == pytest.approx(want / med / PEAK, rel=1e-12) and s["devices"] == 1
    # the trunk is trained (backward twice the forward), the branches run forward only
    mm = profiling.hlo_matmul_flops(open(os.path.join(csd[0], "program.hlo.txt")).read(), profile_cmd.SCOPES)
    assert mm["scopes"]["csd_branches"]["flops"] > 0 and mm["scopes"]["csd_branches"]["backward"] == 0
    assert s["hlo_matmul_flops_per_step"] == mm["total"] > 0
    cost = s["xla_cost_whole_program"]
    assert cost["flops"] > 0 and cost["bytes accessed"] > 0


def test_grpo_summary_counts_the_trunk_only(grpo):
    _, s = grpo
    n_layers, n_head, attn = 73_728, 1024 * 64, 4 * 4 * 16 * 2
    trunk, agent = 4 * (64 + 2 * (32 + 3 + 24)), 4 * 2 * 24
    assert s["batch"]["teacher_tokens"] == 0 and s["batch"]["teacher"] == "none"
    assert s["model_flops_per_step"] == 3 * (2 * n_layers * trunk + 2 * n_head * agent + attn * 4 * 182 * 183 // 2)
    assert s["mfu"] == pytest.approx(s["model_flops_per_step"] / s["step_time_s"]["median"] / PEAK, rel=1e-12)


def test_flops_per_token_formula_by_hand():
    qwen3 = load_config(os.path.join(CONFIGS, "tiny_agentrl.py:grpo"), kind=object).model  # V 1024
    n = 2 * (4096 + 2048 + 2048 + 4096 + 3 * 64 * 128) + 1024 * 64  # 139,264
    assert profiling.matmul_params(qwen3) == (73_728, 65_536)
    assert profiling.model_flops_per_token(qwen3, 100.0) == 6 * n + 12 * 2 * 4 * 16 * 100 == 989_184
    assert profiling.model_flops_per_token(qwen3, 100.0, train=False) == 2 * n + 4 * 2 * 4 * 16 * 100
    # tiny Qwen3.5: 3 DeltaNet layers + 1 attention layer; D 64, I 192, Hk 2, Hv 4, Dk = Dv = 16, conv 4
    q35 = load_config(os.path.join(CONFIGS, "tiny_midtrain.py")).model
    mlp = 3 * 64 * 192
    lin = 64 * 2 * 64 + 4 * 2 * 64 + 64 * 4 * 16 + 2 * 64 * 4 + 4 * 16 * 64 + mlp  # qkv, conv, z, b + a, out
    full = 64 * 4 * 32 + 2 * 64 * 2 * 16 + 4 * 16 * 64 + mlp  # q + gate, k, v, o
    assert profiling.matmul_params(q35) == (3 * lin + full, 1024 * 64) == (216_064, 65_536)
    assert profiling.attention_layers(q35) == 1
    assert profiling.model_flops_per_token(q35, 100.0) == 6 * (216_064 + 65_536) + 12 * 1 * 4 * 16 * 100


def test_hlo_matmul_flops_multiplies_loop_bodies():
    def f(w, x):
        def body(x, wi):
            with jax.named_scope("layer"):
                return jnp.tanh(x @ wi), None
        x, _ = jax.lax.scan(body, x, w)
        with jax.named_scope("head"):
            return (x @ jnp.ones((64, 10))).sum()

    hlo = jax.jit(jax.value_and_grad(f)).lower(jnp.ones((4, 64, 64)), jnp.ones((8, 64))).compile().as_text()
    got = profiling.hlo_matmul_flops(hlo, ["layer", "head"])
    one = 2 * 8 * 64 * 64  # one [8, 64] x [64, 64] product
    assert got["scopes"]["layer"] == {"flops": 3 * 4 * one, "backward": 2 * 4 * one}  # 4 trips, fwd + dx + dw
    assert got["scopes"]["head"] == {"flops": 2 * 2 * 8 * 64 * 10, "backward": 2 * 8 * 64 * 10}  # fwd + dx
    assert got["total"] == 12 * one + 4 * 8 * 64 * 10 and got["unscoped"] == 0 and got["unknown_trip_counts"] == 0


def test_device_peaks():
    assert profiling.device_for_kind("NVIDIA H100 80GB HBM3") == "h100-80g"
    assert profiling.device_for_kind("NVIDIA H100 PCIe") == "h100-pcie"
    assert profiling.device_for_kind("NVIDIA A100-SXM4-40GB") == "a100-40g"
    assert profiling.device_for_kind("TPU v5 lite") == "tpu-v5e"
    assert profiling.device_for_kind("cpu") is None
    assert profile_cmd.peak_flops(_args("--config", "x", "--what", "sampler", "--out", "x", "--device", "h200")) \
        == (989e12, "h200")


def test_bad_arguments_raise_a_config_error(tmp_path):
    base = ["--config", os.path.join(CONFIGS, "tiny_agentrl.py:grpo"), "--out", str(tmp_path)]
    with pytest.raises(ConfigError, match=r"--what 'train_step': expected one of grpo_step, csd_step"):
        profile_cmd.run(_args(*base, "--what", "train_step"))
    with pytest.raises(ConfigError, match=r"--device 'v100'"):
        profile_cmd.run(_args(*base, "--what", "grpo_step", "--device", "v100"))
    with pytest.raises(ConfigError, match=r"--steps must be >= 1"):
        profile_cmd.run(_args(*base, "--what", "grpo_step", "--steps", "0"))
    with pytest.raises(ConfigError, match=r"csd_step needs rl.alpha > 0 \(got 0.0\)"):
        profile_cmd.run(_args(*base, "--what", "csd_step"))
    with pytest.raises(ConfigError, match=r"get_config\(\) returned AgentRLConfig, expected RunConfig"):
        profile_cmd.run(_args(*base, "--what", "midtrain_step"))
