"""rollout.engine=true in the RL stages (train/agent_rl_loop.py, train/simulator_rl.py): the rollout engine
(rollout/engine.py) replaces the static sampler and must not change the run. Two steps of the tiny configs with the
engine on and off, same seed: the same sampled tokens and rewards per episode (log-probs within fp32 rounding), the
same step metrics and the same updated parameters. The runs use rl.old_logprobs=recompute, so the update reads only
the sampled tokens and equal tokens must give equal parameters (with the sampler's log-probs as pi_old, their fp32
rounding differences reach the parameters through Adam's normalisation of near-zero gradients: ~2e-4 relative).
The engine really served the multi-turn dialogues (suffix prefills reused cached tokens), released them, and
followed every update (set_params). Plus the rollout.engine* config errors and the pool sizing."""

import dataclasses
import os

import jax
import numpy as np
import pytest

from rl_helpers import tree_rel_err
from mimesis_jax.envs.toy import ToyCoach, ToyUser
from mimesis_jax.models.config import ConfigError
from mimesis_jax.rollout import engine as engine_lib
from mimesis_jax.rollout.base import SimulatorAsResponder
from mimesis_jax.train import agent_rl_loop as L
from mimesis_jax.train import simulator_rl as S
from mimesis_jax.train.export import load_trained

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING = ("rollout_s", "coach_s", "train_s", "rollout_tokens_per_s", "train_tokens_per_s")


class _Recording(engine_lib.EngineChatModel):
    """EngineChatModel that remembers its instances and counts parameter swaps."""

    made: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.swaps = 0
        _Recording.made.append(self)

    def set_params(self, params):
        self.swaps += 1
        super().set_params(params)


@pytest.fixture
def recording(monkeypatch):
    _Recording.made = []
    monkeypatch.setattr(engine_lib, "EngineChatModel", _Recording)
    return _Recording.made


def _agent_cfg(*sets):
    base = ["train.progress_bar=false", "train.tensorboard=false", "train.steps=2", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.agent_max_tokens=8",
            "rollout.max_context_tokens=256", "rollout.row_len=256", "rollout.engine_slots=4",
            "checkpoint.async_save=false", "rl.old_logprobs=recompute"]
    return L.load(os.path.join(ROOT, "configs", "tiny_agentrl_grpo.py"), base + list(sets))


def _agent_run(wd, *sets):
    seen = {}
    user = ToyUser()
    side = L.UserSide(user, SimulatorAsResponder(user), user, ToyCoach())
    res = L.run(_agent_cfg(*sets), str(wd), user_side=side, handle_signals=False, log=lambda *a: None,
                on_rollouts=lambda step, trajs: seen.__setitem__(step, trajs))
    return res, seen, load_trained(str(wd))[1]


def _metrics_close(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        if k in TIMING:
            continue
        if isinstance(a[k], float):
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5, err_msg=k)
        else:
            assert a[k] == b[k], k


def test_agentrl_engine_equals_the_static_sampler(tmp_path, recording):
    off, seen_off, p_off = _agent_run(tmp_path / "off")
    assert recording == []  # the default keeps the static sampler
    on, seen_on, p_on = _agent_run(tmp_path / "on", "rollout.engine=true")
    (eng,) = recording
    assert eng.swaps == 2  # one set_params after each step's updates
    assert eng.engine.stats["reused_tokens"] > 0  # later turns prefilled only their new suffix
    assert eng.engine.pages_in_use() == 0  # every dialogue was released when its episode ended
    for step in (1, 2):
        a, b = seen_off[step], seen_on[step]
        assert [t.rollout_id for t in a] == [t.rollout_id for t in b]
        for ta, tb in zip(a, b):
            assert ta.status == tb.status and ta.turn_rewards == tb.turn_rewards
            sa = [s for s in ta.segments if s.kind == "agent"]
            sb = [s for s in tb.segments if s.kind == "agent"]
            assert [s.tokens for s in sa] == [s.tokens for s in sb]
            for x, y in zip(sa, sb):
                np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=1e-4, atol=1e-4)
        _metrics_close(off.metrics[step], on.metrics[step])
    assert sum(len(s.tokens) for t in seen_on[2] for s in t.segments if s.kind == "agent") > 0
    assert all(off.metrics[s]["updates"] == 2 for s in (1, 2))  # the parameters compared were trained
    assert tree_rel_err(p_on, p_off) < 1e-6


@pytest.mark.slow  # ~140 s on 2 CPU cores (the tiny Qwen3.5 simulator's compilations)
def test_simrl_engine_equals_the_static_sampler(tmp_path, recording):
    base = ["train.progress_bar=false", "train.tensorboard=false", "train.steps=1", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.max_tokens=8",
            "rollout.engine_slots=4", "checkpoint.async_save=false", "rl.old_logprobs=recompute"]
    path = os.path.join(ROOT, "configs", "tiny_simrl.py")
    runs = {}
    for name, extra in (("off", []), ("on", ["rollout.engine=true"])):
        seen = {}
        res = S.run(S.load(path, base + extra), str(tmp_path / name), handle_signals=False, log=lambda *a: None,
                    on_rollouts=lambda step, outs, seen=seen: seen.__setitem__(step, outs))
        runs[name] = (res, seen, load_trained(str(tmp_path / name))[1])
    (eng,) = recording
    assert eng.swaps == 1
    (r_off, s_off, p_off), (r_on, s_on, p_on) = runs["off"], runs["on"]
    a, b = s_off[1], s_on[1]
    assert [o.rollout_id for o in a] == [o.rollout_id for o in b]
    for oa, ob in zip(a, b):
        assert oa.status == ob.status and oa.reward == ob.reward
        sa = [s for t in oa.segments for s in t.segments]  # each simulator turn is a Trajectory of segments
        sb = [s for t in ob.segments for s in t.segments]
        assert [(s.kind, s.tokens) for s in sa] == [(s.kind, s.tokens) for s in sb]
        for x, y in zip(sa, sb):
            if x.logprobs is not None:
                np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=1e-4, atol=1e-4)
    _metrics_close(r_off.metrics[1], r_on.metrics[1])
    assert tree_rel_err(p_on, p_off) < 1e-6


@pytest.mark.parametrize("key,value,needle", [
    ("rollout.engine_slots", "0", "rollout.engine_slots"),
    ("rollout.engine_page_size", "0", "rollout.engine_page_size"),
    ("rollout.engine_pages", "1", "rollout.engine_pages"),
    ("rollout.engine_pages", "-3", "rollout.engine_pages"),
])
def test_engine_keys_are_validated_by_name(key, value, needle):
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        _agent_cfg(f"{key}={value}").validate()
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        S.load(os.path.join(ROOT, "configs", "tiny_simrl.py"), [f"{key}={value}"]).validate()


def test_engine_with_max_batch_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"rollout\.max_batch"):
        _agent_cfg("rollout.engine=true", "rollout.max_batch=4").validate()


def test_engine_config_sized_from_the_rollout():
    r = _agent_cfg().rollout
    mc = _agent_cfg().model
    ec = L.rollout_engine_config(dataclasses.replace(r, engine_page_size=16), mc, dialogues=6)
    assert ec.max_pages_per_seq == 16  # 256-token dialogues in 16-token pages
    assert ec.num_pages == 6 * 16 + 1  # + the trash page
    ec = L.rollout_engine_config(dataclasses.replace(r, max_context_tokens=0, engine_pages=40), mc, dialogues=6)
    assert ec.max_pages_per_seq == -(-mc.max_position_embeddings // 16) and ec.num_pages == 40
    ec.validate()
    assert jax.local_devices()[0] in L.engine_params({"w": np.ones(2, np.float32)})["w"].devices()
