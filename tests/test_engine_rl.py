"""rollout.engine=true in the RL stages (train/rl/agent.py, train/rl/simulator.py): the rollout engine
(inference/engine.py) replaces the static sampler -- in agentrl for the agent and the in-process user simulator --
and must not change the run. Two steps of the tiny configs with the engine on and off, same seed: the same sampled
tokens, user turns and rewards per episode (log-probs within fp32 rounding), the same step metrics and the same
updated parameters. The runs use rl.old_logprobs=recompute, so the update reads only the sampled tokens and equal
tokens must give equal parameters (with the sampler's log-probs as pi_old, their fp32 rounding differences reach
the parameters through Adam's normalisation of near-zero gradients: ~2e-4 relative). The engines really served
the dialogues (the agent's suffix prefills reused cached tokens), released them, and the agent's followed every
update (set_params) while the frozen simulator's never changed. Plus the rollout.engine* config errors and the
pool sizing (the agent's and the simulator's)."""

import dataclasses
import os
from unittest import mock

import jax
import numpy as np
import pytest

from rl_helpers import tree_rel_err
from mimesis_jax import checkpoints
from mimesis_jax.envs.toy import ToyCoach, ToyUser
from mimesis_jax.errors import ConfigError
from mimesis_jax.chat import local
from mimesis_jax.inference.generators import EngineGenerator
from mimesis_jax.chat.base import SimulatorAsResponder
from mimesis_jax.train.rl import agent as L
from mimesis_jax.train.rl import chat_models as C
from mimesis_jax.train.rl import simulator as S
from mimesis_jax.checkpoints import load_trained
from mimesis_jax.train.rl.learner import BUSY_KEYS, COMPILATION_KEYS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# compilation counts differ by construction: the engine run compiles engine programs, the other sampler ones
TIMING = ("rollout_s", "coach_s", "train_s", "rollout_tokens_per_s", "train_tokens_per_s",
          "step_s") + COMPILATION_KEYS + BUSY_KEYS


class _Recording(EngineGenerator):
    """EngineGenerator that remembers its instances and counts parameter swaps."""

    made: list = []

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.swaps = 0
        _Recording.made.append(self)

    def set_params(self, params, version):
        self.swaps += 1
        super().set_params(params, version)


@pytest.fixture
def recording(monkeypatch):
    _Recording.made = []
    monkeypatch.setattr(C, "EngineGenerator", _Recording)  # the policy's
    monkeypatch.setattr(local, "EngineGenerator", _Recording)  # an in-process simulator's (LocalChatModel's)
    return _Recording.made


def _agent_cfg(*sets):
    base = ["train.progress_bar=false", "train.tensorboard=false", "train.steps=2", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.agent_max_tokens=8",
            "rollout.max_context_tokens=256", "rollout.row_len=256", "rollout.engine_slots=4",
            "checkpoint.async_save=false", "rl.old_logprobs=recompute"]
    return L.load(os.path.join(ROOT, "configs", "tiny_agentrl.py:grpo"), base + list(sets))


def _sim_params(config, seed: int):
    """Random weights for `config` drawn in NumPy (std 0.1, norms 1): no init program to compile."""
    from mimesis_jax import models

    rng = np.random.RandomState(seed)

    def draw(path, leaf):
        if "norm" in jax.tree_util.keystr(path):
            return np.ones(leaf.shape, leaf.dtype)
        return (0.1 * rng.standard_normal(leaf.shape)).astype(leaf.dtype)
    return jax.device_put(jax.tree_util.tree_map_with_path(draw, models.abstract_params(config)))


def _tiny_simulator(tmp_path):
    """(users.* overrides, loader) for an in-process tiny random simulator, loaded the way a trained one is
    (a workdir through checkpoints.load_trained, which `loader` stands in for). It has the agent's architecture, so the two share compiled programs
    (test_engine.py runs a Qwen3.5 simulator on the engine), and large weights: at init scale a tied random model
    greedily repeats the prompt's last token (the newline after the user header), which leaves no utterance. It
    writes the runner's user turns greedily and without a thought block; the judge / coach are unused (alpha = 0)."""
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.train.state import model_config_for

    config = model_config_for(_agent_cfg(), load_tokenizer("tiny"))
    params = _sim_params(config, seed=2)
    workdir = tmp_path / "sim"
    (workdir / "checkpoints").mkdir(parents=True)

    def loader(path, step):
        assert path == str(workdir)
        return config, params, 0, "tiny"
    sets = (f"users.simulator={workdir}", "users.simulator_thinking=false", "users.simulator_max_tokens=8",
            "users.coach=")
    return sets, loader


def _agent_run(wd, *sets, loader=None):
    """Two tiny agentrl steps; the toy user unless `sets` name a model simulator (then read through `loader`)."""
    seen = {}
    side = None
    if loader is None:
        user = ToyUser()
        side = L.UserSide(user, SimulatorAsResponder(user), user, ToyCoach())
    with mock.patch.object(checkpoints, "load_trained", loader or checkpoints.load_trained):
        res = L.run(_agent_cfg(*sets), str(wd), user_side=side, handle_signals=False, log=lambda *a: None,
                    on_rollouts=lambda step, trajs: seen.__setitem__(step, trajs))
    return res, seen, load_trained(str(wd))[1]


ENGINE_KEYS = ("engine/", "sim_engine/")  # the engine's own counters: logged only with rollout.engine=true


def _metrics_close(a: dict, b: dict):
    b = {k: v for k, v in b.items() if not k.startswith(ENGINE_KEYS)}
    assert a.keys() == b.keys()
    for k in a:
        if k in TIMING:
            continue
        if isinstance(a[k], float):
            np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-5, err_msg=k)
        else:
            assert a[k] == b[k], k


def test_agentrl_engine_equals_the_static_sampler(tmp_path, recording):
    """Agent AND in-process simulator on their engines vs both on the static sampler (issue #16)."""
    sim_sets, loader = _tiny_simulator(tmp_path)
    off, seen_off, p_off = _agent_run(tmp_path / "off", *sim_sets, loader=loader)
    assert recording == []  # the default keeps the static sampler
    # one pool size for both engines: their programs (same architecture, same shapes) compile once
    on, seen_on, p_on = _agent_run(tmp_path / "on", "rollout.engine=true", "rollout.engine_pages=70", *sim_sets,
                                   loader=loader)
    sim, eng = recording  # the simulator's engine is built with the user side, before the agent's
    assert eng.swaps == 2 and sim.swaps == 0  # the agent follows each step's updates; the simulator is frozen
    assert (eng.version, sim.version) == (2, 0)  # the policy's samples carry the update count
    assert eng.engine.stats["reused_tokens"] > 0  # later turns prefilled only their new suffix
    assert sim.engine.stats["prefill_tokens"] > 0  # the runner's user turns went through the simulator's engine
    for e in (eng, sim):
        assert e.engine.pages_in_use() == 0  # every dialogue was released when its episode ended
    for e, prefix in ((eng, "engine"), (sim, "sim_engine")):  # each step logs its share of the engines' counters
        for k in ("evictions", "reused_tokens", "recomputed", "prefill_tokens"):
            assert on.metrics[1][f"{prefix}/{k}"] + on.metrics[2][f"{prefix}/{k}"] == e.engine.stats[k], (prefix, k)
        total = 69 * e.engine.replicas  # engine_pages=70 per replica, less its trash page
        assert on.metrics[2][f"{prefix}/pages"] == total and 0 < on.metrics[2][f"{prefix}/pages_peak"] <= total
    assert not any(k.startswith(ENGINE_KEYS) for k in off.metrics[1])
    for step in (1, 2):
        a, b = seen_off[step], seen_on[step]
        assert [t.rollout_id for t in a] == [t.rollout_id for t in b]
        for ta, tb in zip(a, b):
            assert ta.status == tb.status and ta.turn_rewards == tb.turn_rewards
            assert ta.user_utterances == tb.user_utterances and ta.user_thoughts == tb.user_thoughts
            sa = [s for s in ta.segments if s.kind == "agent"]
            sb = [s for s in tb.segments if s.kind == "agent"]
            assert [s.tokens for s in sa] == [s.tokens for s in sb]
            for x, y in zip(sa, sb):
                np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=1e-4, atol=1e-4)
        _metrics_close(off.metrics[step], on.metrics[step])
    assert sum(len(s.tokens) for t in seen_on[2] for s in t.segments if s.kind == "agent") > 0
    assert all(t.status == "ok" and any(t.user_utterances) for s in (1, 2) for t in seen_on[s])  # the sim spoke
    assert all(off.metrics[s]["updates"] == 2 for s in (1, 2))  # the parameters compared were trained
    assert tree_rel_err(p_on, p_off) < 1e-6


@pytest.mark.slow  # ~140 s on 2 CPU cores (the tiny Qwen3.5 simulator's compilations)
def test_simrl_engine_equals_the_static_sampler(tmp_path, recording):
    base = ["train.progress_bar=false", "train.tensorboard=false", "train.steps=1", "rollout.prompts_per_step=2",
            "rollout.group_size=2", "rollout.mini_batch_prompts=1", "rollout.max_tokens=8",
            "rollout.engine_slots=4", "checkpoint.async_save=false", "rl.old_logprobs=recompute",
            # one device, as test_simulator_rl.py: the 8 fake devices only add compile time (the agentrl test above
            # keeps the default 8-device mesh, so the sharded parameters -> one-device engine hand-off stays covered)
            "mesh.fsdp=1",
            # rows of 1,536 = the context budget, as tests/test_simulator_rl.py: the sampled dialogues reach 1,338
            # tokens, and the config's 2,048 cost ~1.8x the attention work in both runs
            "rollout.row_len=1536", "rollout.max_context_tokens=1536"]
    path = os.path.join(ROOT, "configs", "tiny_simrl.py")
    runs = {}
    # 64-token KV pages: the engine precompiles every program for each page-table width up to the 1,536-token
    # context (inference/engine_sizing.py), fewer widths than 16-token pages' 6 (8, 16, 32, 48, 64, 96); the
    # comparison with the static sampler does not depend on the page size
    for name, extra in (("off", []), ("on", ["rollout.engine=true", "rollout.engine_page_size=64"])):
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
    ec = C.rollout_engine_config(dataclasses.replace(r, engine_page_size=16), mc, dialogues=6)
    assert ec.max_pages_per_seq == 16  # 256-token dialogues in 16-token pages
    assert ec.num_pages == 6 * 16 + 1  # + the trash page
    ec = C.rollout_engine_config(dataclasses.replace(r, max_context_tokens=0, engine_pages=40), mc, dialogues=6)
    assert ec.max_pages_per_seq == -(-mc.max_position_embeddings // 16) and ec.num_pages == 40
    ec.validate()
    assert jax.local_devices()[0] in C.engine_params({"w": np.ones(2, np.float32)})["w"].devices()


def test_simulator_engine_sized_for_its_longer_view():
    """The in-process simulator's view = its instructions (<= gyms.max_prompt_tokens) + what the agent's context
    holds (<= rollout.max_context_tokens) + one thought-bearing turn (<= users.simulator_max_tokens) per agent
    turn; capped by the simulator's positions, which alone bound it without rollout.max_context_tokens."""
    cfg = _agent_cfg("gyms.max_prompt_tokens=64", "users.simulator_max_tokens=10")  # 256-token dialogues, 2 turns
    sim_mc = cfg.model.replace(max_position_embeddings=8192)  # the simulator's own positions
    assert C.simulator_context_tokens(cfg, sim_mc) == 64 + 256 + 2 * 10
    ec = C.simulator_engine_config(cfg, sim_mc, dialogues=3)
    assert ec.max_pages_per_seq == 22 and ec.num_pages == 3 * 22 + 1  # ceil(340 / 16) pages, + the trash page
    assert ec.slots == cfg.rollout.engine_slots
    assert C.simulator_context_tokens(cfg, sim_mc.replace(max_position_embeddings=300)) == 300
    unbounded = _agent_cfg("rollout.max_context_tokens=0", "rollout.row_len=0")
    assert C.simulator_context_tokens(unbounded, sim_mc) == 8192
    explicit = C.simulator_engine_config(_agent_cfg("rollout.engine_pages=50"), sim_mc, dialogues=3)
    assert explicit.num_pages == 50 and explicit.max_pages_per_seq == -(-(256 + 2 * 512) // 16)
