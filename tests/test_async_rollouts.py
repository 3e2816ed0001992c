"""Bounded-staleness rollouts (train/rl/async_rollouts.py, issue #44 items 1-2): the producer's admission rule
against a scripted loop (no JAX), the staleness metrics against a NumPy count written from their definition, the
config refusals, and the tiny Stage II GRPO loop with rl.max_staleness=1 (its resume: tests/test_async_resume.py).
Under the fixed lag
(rl.async_deterministic) the step trained by version s sampled all its tokens with version max(0, s - 1) and logs
staleness exactly 1 from its second step on; in flight every token's version lies in [s - 1, s]; with
max_staleness=0 every token is sampled by the version that trains it, and the first step (version 0 on every
schedule) logs the same record on both schedules, update metrics included. That the synchronous path is the loop of
before is the existing loop tests' (tests/test_agent_rl_loop.py, test_rl_schedule_metrics.py) and resume tests'.
With a rollout pool (rollout.devices=4 of the 8 fake devices) the fixed-lag run updates on devices 0-3 without the
device lock and samples on devices 4-7, sampling the same tokens and logging the same records (fp32 tolerance) as on
shared devices; the weights reach the pool with their values and the pool's layout; bad values are one-line
ConfigErrors naming the key. Through the rollout engine (rollout.engine=true): its programs hold the device lock,
new weights mid-dialogue re-prefill the dialogue whole (against the static sampler with the new weights), and the
fixed-lag engine run on a pool samples the static sampler's tokens with its arrays on the pool and no eviction.
Early updates (rl.async_early_updates, the default with N > 0): the producer hands a step's parts over before the
step ends; step 2's first update runs while its last group is still held in the producer; under the fixed lag
they make the whole-step loop's updates (same tokens, metrics and final weights, old log-probs recomputed); a
Stage I.3 step rolled in parts seeds its prompts as one batch does."""

import json
import os
import signal
import threading
import types

import jax
import numpy as np
import pytest

from helpers import run_tiny_grpo, tiny_grpo_config
from mimesis_jax import models, sharding
from mimesis_jax.config import tiny_qwen3
from mimesis_jax.data.trajectory import Segment, Trajectory
from mimesis_jax.envs.toy import ToyCoach, ToyUser
from mimesis_jax.episodes.simulator import SimRollout
from mimesis_jax.chat.base import SimulatorAsResponder
from mimesis_jax.checkpoints import load_trained
from mimesis_jax.errors import ConfigError
from mimesis_jax.inference import sampler as sampler_lib
from mimesis_jax.inference.protocol import Generator, Sample, Sampling
from mimesis_jax.train.rl import agent as A
from mimesis_jax.train.rl import distributed
from mimesis_jax.train.rl import learner as L
from mimesis_jax.train.rl.async_rollouts import Drawn, Guarded, Produced, RolloutProducer, staleness_record
from mimesis_jax.train.rl.learner import BUSY_KEYS, COMPILATION_KEYS
from mimesis_jax.train.state import make_mesh

STEPS = 3


# ------------------------------------------------------------------------------------------ the producer alone
def _schedule(n, fixed_lag, steps=6, concurrent=False):
    """Runs the producer against a loop that trains each step and publishes the next version; returns for every
    step the published version at its admission and the versions published while its rollouts ran. concurrent:
    every admitted step's rollouts at once (the producer's `draw`)."""
    published = {"v": 0}
    during: dict[int, set] = {}
    lock = threading.Lock()

    def produce(step, rid):
        with lock:
            during[step] = {published["v"]}
        for _ in range(20):  # a rollout long enough for a publication to land in it
            with lock:
                during[step].add(published["v"])
            threading.Event().wait(0.001)
        return Produced(step, [step], rid + 1)

    if concurrent:
        p = RolloutProducer(lambda d: produce(d.step, d.first_rid), start=0, stop=steps, first_rid=0,
                            max_staleness=n, fixed_lag=fixed_lag, draw=lambda s, rid: Drawn(s, [s], rid, rid + 1))
    else:
        p = RolloutProducer(produce, start=0, stop=steps, first_rid=0, max_staleness=n, fixed_lag=fixed_lag)
    try:
        for s in range(steps):
            assert p.take(s).outs == [s]

            def set_params(v=s + 1):
                with lock:
                    published["v"] = v

            p.publish(s + 1, set_params)
    finally:
        p.close()
    return p.admitted_at, during


@pytest.mark.parametrize("n", [1, 2])
def test_fixed_lag_samples_each_step_with_one_version(n):
    admitted, during = _schedule(n, fixed_lag=True)
    for s in range(6):
        assert admitted[s] == max(0, s - n) and during[s] == {max(0, s - n)}, (s, admitted, during)


@pytest.mark.parametrize("n", [1, 2])
def test_in_flight_admission_keeps_the_bound(n):
    admitted, during = _schedule(n, fixed_lag=False)
    for s in range(6):
        assert admitted[s] >= s - n and min(during[s]) >= s - n and max(during[s]) <= s, (s, admitted, during)


@pytest.mark.parametrize("n", [1, 2])
def test_every_admitted_step_at_once_keeps_both_schedules(n):
    admitted, during = _schedule(n, fixed_lag=True, concurrent=True)
    for s in range(6):
        assert admitted[s] == max(0, s - n) and during[s] == {max(0, s - n)}, (s, admitted, during)
    admitted, during = _schedule(n, fixed_lag=False, concurrent=True)
    for s in range(6):
        assert admitted[s] >= s - n and min(during[s]) >= s - n and max(during[s]) <= s, (s, admitted, during)


def test_the_producer_runs_every_admitted_step_at_once():
    """N = 2, version 0: steps 0, 1 and 2 roll at the same time (a barrier only three steps in flight at once
    pass), drawn in step order with consecutive rollout ids; step 3 waits for version 1."""
    started, passed, release = threading.Barrier(3, timeout=10), threading.Semaphore(0), threading.Event()
    draws = []

    def draw(step, rid):
        draws.append((step, rid))
        return Drawn(step, [step], rid, rid + 10)

    def produce(d):
        if d.step < 3:
            started.wait()
            passed.release()
            release.wait(10)
        return Produced(d.step, [d.step], d.next_rid)

    p = RolloutProducer(produce, start=0, stop=4, first_rid=5, max_staleness=2, fixed_lag=False, draw=draw)
    try:
        assert all(passed.acquire(timeout=10) for _ in range(3))
        assert sorted(p.admitted_at) == [0, 1, 2] and draws == [(0, 5), (1, 15), (2, 25)]
        release.set()
        assert [p.take(s).outs for s in range(3)] == [[0], [1], [2]] and 3 not in p.admitted_at
        p.publish(1, lambda: None)
        assert p.take(3).next_rid == 45 and p.admitted_at[3] == 1 and draws[-1] == (3, 35)
    finally:
        release.set()
        p.close()


def test_an_error_in_a_step_of_its_own_reaches_the_loop():
    def produce(d):
        raise RuntimeError(f"rollout {d.step} failed")

    p = RolloutProducer(produce, start=0, stop=2, first_rid=0, max_staleness=1, fixed_lag=False,
                        draw=lambda s, rid: Drawn(s, [], rid, rid))
    with pytest.raises(RuntimeError, match=r"rollout [01] failed"):
        p.take(0)
    p.close()


def test_parts_reach_the_loop_before_their_step_ends():
    """In parts (rl.async_early_updates): the loop takes step 0's first part while its second is still rolling
    (held until the loop has the first), then the second, then the step's Produced with every outcome; an error
    after a part reaches the loop's next take_part."""
    release = threading.Event()

    def produce(step, rid, deliver):
        deliver(step, 0, ["g0"], False)
        assert release.wait(10)
        deliver(step, 1, ["g1"], True)
        return Produced(step, ["g0", "g1"], rid + 2)

    p = RolloutProducer(produce, start=0, stop=1, first_rid=0, max_staleness=1, fixed_lag=True, parts=True)
    try:
        assert p.take_part(0, 0) == (["g0"], False) and not release.is_set()
        release.set()
        assert p.take_part(0, 1) == (["g1"], True)
        got = p.take(0)
        assert got.outs == ["g0", "g1"] and got.next_rid == 2
    finally:
        release.set()
        p.close()

    def failing(step, rid, deliver):
        deliver(step, 0, ["g0"], False)
        raise RuntimeError("part 1 failed")

    p = RolloutProducer(failing, start=0, stop=1, first_rid=0, max_staleness=1, fixed_lag=False, parts=True)
    with pytest.raises(RuntimeError, match="part 1 failed"):
        p.take_part(0, 1)
    p.close()


def test_a_producer_error_reaches_the_loop():
    def produce(step, rid):
        raise RuntimeError(f"rollout {step} failed")

    p = RolloutProducer(produce, start=0, stop=2, first_rid=0, max_staleness=1, fixed_lag=False)
    with pytest.raises(RuntimeError, match="rollout 0 failed"):
        p.take(0)
    p.close()


class _Gate(Generator):
    """A generator whose weights are an int and whose `generate` returns them (the weights it read at its start,
    stamped with its version at its end) once `go` is set; `entered` is set while a call is in flight."""

    def __init__(self):
        self.params, self.version = 0, 0
        self.entered, self.go = threading.Event(), threading.Event()

    def generate(self, prompts, sampling, *, keys=None, cancel=None):
        read = self.params
        self.entered.set()
        assert self.go.wait(10)
        return [Sample([read], None, "stop", version=self.version)]

    def set_params(self, params, version):
        self.params, self.version = params, version


def test_a_pool_generator_takes_new_weights_at_its_next_call_without_holding_the_trainer():
    """Guarded on a pool (no device lock): set_params while a call is in flight returns before the call ends; the
    call keeps the weights it started with and their version; the next call samples the new ones."""
    inner = _Gate()
    g = Guarded(inner, device_lock=None)
    out = []
    call = threading.Thread(target=lambda: out.extend(g.generate([[1]], Sampling())))
    call.start()
    assert inner.entered.wait(10)
    setter = threading.Thread(target=g.set_params, args=(7, 1))
    setter.start()
    setter.join(10)
    assert not setter.is_alive() and call.is_alive()  # handed over without waiting for the call in flight
    assert (g.version, g.params) == (1, 7) and (inner.version, inner.params) == (0, 0)
    inner.go.set()
    call.join(10)
    assert [(s.tokens, s.version) for s in out] == [([0], 0)]
    assert [(s.tokens, s.version) for s in g.generate([[1]], Sampling())] == [([7], 1)]
    g.set_params(9, 2)  # no call in flight: at once
    assert (inner.version, inner.params) == (2, 9)


# ------------------------------------------------------------------------------------------ the metrics
def test_staleness_record_against_a_numpy_count():
    rng = np.random.RandomState(0)
    trajs, lags = [], []
    for _ in range(5):
        segs = [Segment("public", [1, 2])]
        for _ in range(3):
            v, n = int(rng.randint(3, 7)), int(rng.randint(1, 9))
            segs += [Segment("public", [3]), Segment("agent", list(range(1, n + 1)), version=v)]
            lags += [7 - v] * n
        trajs.append(Trajectory(segs))
    rec = staleness_record(trajs, 7)
    assert rec["staleness_max"] == max(lags)
    assert rec["staleness_mean"] == pytest.approx(np.mean(lags), rel=1e-12)
    tokens_at = [lags.count(k) for k in range(max(lags) + 1)]  # tokens per staleness, up to the largest
    assert [rec[f"staleness_hist/{k}"] for k in range(len(tokens_at))] == tokens_at
    assert f"staleness_hist/{len(tokens_at)}" not in rec
    assert staleness_record([Trajectory([Segment("agent", [1, 2])])], 3) == {}  # no version: nothing logged
    # Stage I.3: a rollout holds one Trajectory per policy turn
    sim = SimRollout(segments=[Trajectory([Segment("public", [1]), Segment("agent", [2, 3, 4], version=5)]),
                     Trajectory([Segment("public", [1]), Segment("agent", [5], version=6)])],
                     domain="d", group_id=0, rollout_id=0)
    assert staleness_record([sim], 7) == {"staleness_max": 2, "staleness_mean": (3 * 2 + 1 * 1) / 4,
                                          "staleness_hist/0": 0, "staleness_hist/1": 1, "staleness_hist/2": 3}


@pytest.mark.parametrize("sets, msg", [
    (["rl.max_staleness=-1"], "must be an int >= 0")])
def test_config_errors_name_rl_max_staleness(sets, msg):
    with pytest.raises(ConfigError, match=rf"^config key 'rl.max_staleness': {msg}"):
        _cfg(*sets)


def test_the_rollout_engine_may_run_asynchronously():
    r = _cfg("rl.max_staleness=1", "rollout.engine=true").rollout  # refused before the engine ran under the producer
    assert r.engine and _cfg("rl.max_staleness=1", "rollout.engine=true").rl.max_staleness == 1


# ------------------------------------------------------------------------------------------ the Stage II loop
def _cfg(*sets):
    return tiny_grpo_config(STEPS, *sets)


def _run(workdir, *sets):
    return run_tiny_grpo(workdir, STEPS, *sets)


def _versions(trajs):
    return [s.version for t in trajs if t.status == "ok" for s in t.segments if s.kind == "agent"]


@pytest.fixture(scope="module")
def fixed_lag(tmp_path_factory):
    wd = tmp_path_factory.mktemp("lag")
    return wd, *_run(wd, "rl.max_staleness=1", "rl.async_deterministic=true")


def test_fixed_lag_trains_each_token_one_version_late(fixed_lag):
    _, res, seen = fixed_lag
    assert sorted(res.metrics) == [1, 2, 3] and res.final_step == STEPS
    for step in (1, 2, 3):  # step s (1-based) trains with version s - 1; its rollouts sampled version max(0, s - 2)
        vs = _versions(seen[step])
        assert vs and set(vs) == {max(0, step - 2)}, (step, vs)
        rec = res.metrics[step]
        assert rec["staleness_max"] == (step - 1) - max(0, step - 2) == rec["staleness_mean"]
        # the TensorBoard histogram's counts: every trained agent token at that one staleness
        tokens = sum(len(s.tokens) for t in seen[step] if t.status == "ok" for s in t.segments if s.kind == "agent")
        hist = [rec[f"staleness_hist/{k}"] for k in range(rec["staleness_max"] + 1)]
        assert rec["skipped_groups"] == 0 and hist == [0] * rec["staleness_max"] + [tokens]
        assert rec["step_s"] > 0
    ids = [t.rollout_id for s in seen.values() for t in s]
    assert sorted(ids) == list(range(len(ids)))  # every rollout id once, in the synchronous run's order


TIMING = ("rollout_s", "coach_s", "train_s", "rollout_tokens_per_s", "train_tokens_per_s", "step_s",
          "rollout_wait_s", "groups_in_flight") + COMPILATION_KEYS + BUSY_KEYS  # groups_in_flight: when the producer woke


def test_synchronous_run_has_no_staleness_and_the_first_step_of_both(fixed_lag, tmp_path):
    """max_staleness=0: every token sampled by the version that trains it; step 1 (version 0 on both schedules)
    logs the same record, update metrics included, in both runs."""
    _, lag, _ = fixed_lag
    sync, seen = _run(tmp_path)
    for step in (1, 2, 3):
        assert set(_versions(seen[step])) == {step - 1}
        assert sync.metrics[step]["staleness_max"] == 0 == sync.metrics[step]["staleness_mean"]
        # the loop's wall clock per step in both schedules; the wait for the producer only where there is one
        assert "rollout_wait_s" not in sync.metrics[step] and "rollout_wait_s" in lag.metrics[step]
        assert sync.metrics[step]["step_s"] >= sync.metrics[step]["train_s"] and lag.metrics[step]["step_s"] > 0
        # synchronous: updates and generations take turns, so the two pools' busy fractions share one wall clock
        assert sync.metrics[step]["pool_busy/train"] + sync.metrics[step]["pool_busy/rollout"] <= 1
    strip = lambda rec: {k: v for k, v in rec.items() if k not in TIMING}  # noqa: E731
    assert strip(sync.metrics[1]) == strip(lag.metrics[1])
    assert strip(sync.metrics[2]) != strip(lag.metrics[2])  # step 2 sampled other weights


def test_a_checkpoint_keeps_the_data_state_of_its_own_step(fixed_lag, tmp_path):
    """SIGTERM during step 2 of the fixed-lag run: step 3 is drawn already (its rollouts ran beside step 2's
    update), yet the checkpoint holds the task sampler and rollout id after step 2, so the synchronous resume
    draws step 3's tasks and ids again."""
    _, _, lag_seen = fixed_lag

    def stop_at_2(step, trajs):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    user = ToyUser()
    side = A.UserSide(user, SimulatorAsResponder(user), user, ToyCoach())
    first = A.run(_cfg("rl.max_staleness=1", "rl.async_deterministic=true"), str(tmp_path), user_side=side,
                  on_rollouts=stop_at_2, log=lambda *a: None)
    assert first.preempted and first.checkpoint_step == 2
    _, seen = _run(tmp_path, "rl.max_staleness=0")
    key = lambda trajs: [(t.group_id, t.rollout_id, t.task) for t in trajs]  # noqa: E731
    assert sorted(seen) == [3] and key(seen[3]) == key(lag_seen[3])


def test_in_flight_tokens_stay_within_the_bound(tmp_path):
    res, seen = _run(tmp_path, "rl.max_staleness=1")
    for step in (1, 2, 3):
        assert res.metrics[step]["invalid"] == 0 == res.metrics[step]["skipped_groups"]  # every dialogue trained
        vs = _versions(seen[step])
        assert vs and all(step - 2 <= v <= step - 1 for v in vs), (step, vs)
        lags = [(step - 1) - v for t in seen[step] if t.status == "ok" for s in t.segments if s.kind == "agent"
                for v in [s.version] * len(s.tokens)]
        assert res.metrics[step]["staleness_max"] == max(lags) <= 1
        assert res.metrics[step]["staleness_mean"] == pytest.approx(np.mean(lags), rel=1e-12)


# ------------------------------------------------------------------------------------------ early updates
PROMPTS = 2  # rollout.prompts_per_step of the tiny config; rollout.mini_batch_prompts=1: a part per group
RECOMPUTE = ("rl.max_staleness=1", "rl.async_deterministic=true", "rl.old_logprobs=recompute")


@pytest.fixture(scope="module")
def early(tmp_path_factory):
    """The fixed-lag run with the old log-probs recomputed, its updates taken mini-batch by mini-batch (the
    default), with a timeline; step 2's last group is held (up to 60 s) after its rollouts until step 2's first
    update has ended: `held` records whether that end came."""
    wd, held = tmp_path_factory.mktemp("early"), []
    first_update = threading.Event()
    real_rollouts, real_updates = A.AgentWorld.rollouts, L.ppo_updates

    def rollouts(self, model, items, **kw):
        outs = real_rollouts(self, model, items, **kw)
        if kw["first_group"] == 2 * PROMPTS - 1:  # step 2's last group (group ids count from 0)
            held.append(first_update.wait(60))
        return outs

    def updates(run, chunks, **kw):
        out = real_updates(run, chunks, **kw)
        if kw.get("step") == 2 and kw.get("first") == 0:
            first_update.set()
        return out

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(A.AgentWorld, "rollouts", rollouts)
        mp.setattr(L, "ppo_updates", updates)
        res, seen = _run(wd, *RECOMPUTE, "train.timeline=true")
    return wd, res, seen, held


def test_a_mini_batch_trains_before_its_steps_last_group_is_in(early):
    """Step 2's first update ran while its last group was still held in the producer (a long dialogue): on the
    timeline the update (step 2, mini-batch 0) ends before that group's part does; the whole-step loop would have
    waited for that part first (and `held` would be [False])."""
    wd, res, _, held = early
    assert held == [True]
    with open(os.path.join(wd, "timeline.json")) as f:
        spans = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
    update = [e for e in spans if e["name"] == "update" and e["args"].get("step") == 2]
    parts = [e for e in spans if e["name"] == "groups" and e["args"]["step"] == 2]
    assert [e["args"]["minibatch"] for e in update] == [0, 1] == [e["args"]["part"] for e in parts]
    assert update[0]["ts"] + update[0]["dur"] < parts[1]["ts"] + parts[1]["dur"]
    assert res.metrics[2]["updates"] == PROMPTS


def test_early_updates_make_the_whole_steps_updates(early, tmp_path):
    """Under the fixed lag, updates taken as the groups come in make the updates of the same run whose updates
    wait for the whole step: the same groups in the same mini-batches, sampled by the same versions, the old
    log-probs recomputed with the step's start weights for every mini-batch. So the same tokens, every
    non-timing metric the same and the same final weights."""
    wd, res, seen, _ = early
    whole, whole_seen = _run(tmp_path, *RECOMPUTE, "rl.async_early_updates=false")
    toks = lambda trajs: [[s.tokens for s in t.segments] for t in trajs]  # noqa: E731
    strip = lambda rec: {k: v for k, v in rec.items() if k not in TIMING}  # noqa: E731
    for step in (1, 2, 3):
        assert toks(seen[step]) == toks(whole_seen[step])
        assert strip(res.metrics[step]) == strip(whole.metrics[step]), step
    _, got, _, _ = load_trained(str(wd))
    _, want, _, _ = load_trained(str(tmp_path))
    assert all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip(jax.tree.leaves(got),
                                                                            jax.tree.leaves(want)))


def test_a_stage_i3_step_in_parts_seeds_its_prompts_as_one_batch(monkeypatch):
    """Stage I.3 (train/rl/simulator.py `SimWorld.rollouts`): a step rolled in parts (early updates: each part its
    own first_group) gives every prompt the group id, rollout ids and env seed of the step rolled as one batch, the
    env seed that of the prompt's place in its step, SeedSequence([seed, place])."""
    from mimesis_jax.train.rl import simulator as S

    monkeypatch.setattr(S, "make_domain_env", lambda d, record, sides, seed, **kw: types.SimpleNamespace(seed=seed))
    monkeypatch.setattr(S, "run_sim_episodes",
                        lambda model, tasks, ec, **kw: [(t.group_id, t.rollout_id, t.env.seed) for t in tasks])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cfg = S.load(os.path.join(root, "configs", "tiny_simrl.py"), ["rollout.prompts_per_step=4"])
    learner = types.SimpleNamespace(cfg=cfg, cluster=types.SimpleNamespace(sides=None), tok=None,
                                    progress=lambda label: None)
    world = S.SimWorld().bind(learner)
    world.records = {S.BEHAVIOUR: [{}] * 4}
    items = [(S.BEHAVIOUR, i) for i in range(4)]
    kw = dict(group_size=2, temperature=1.0, seed=7, label="step 3")
    whole = world.rollouts(None, items, first_group=8, first_rid=16, **kw)  # step 3 (0-based 2) of 4 prompts
    parts = (world.rollouts(None, items[:2], first_group=8, first_rid=16, **kw)
             + world.rollouts(None, items[2:], first_group=10, first_rid=20, **kw))
    seeds = [int(np.random.SeedSequence([7, p]).generate_state(1)[0]) for p in range(4)]
    assert whole == [(8 + p, 16 + 2 * p + k, seeds[p]) for p in range(4) for k in range(2)]
    assert parts == whole


# ------------------------------------------------------------------------------------------ a rollout pool
POOL = 4  # rollout.devices: the last 4 of the 8 fake devices sample, the first 4 train


def _device_ids(tree) -> set:
    return {d.id for leaf in jax.tree.leaves(tree) for d in leaf.devices()}


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """The fixed-lag run of `fixed_lag` with a rollout pool of the last 4 devices; spies record the devices of the
    parameters each update reads and writes, and of the parameters and mesh each sampler call uses."""
    seen_dev = {"update": [], "sample": []}
    real_updates, real_generate = L.ppo_updates, sampler_lib.generate

    def updates(run, chunks, **kw):
        before = _device_ids(run.state["params"])  # read before the update donates them
        state, ms = real_updates(run, chunks, **kw)
        seen_dev["update"].append((before, _device_ids(state["params"]), kw["lock"]))
        return state, ms

    def generate(config, params, prompts, **kw):
        seen_dev["sample"].append((_device_ids(params), {d.id for d in kw["mesh"].devices.flat}))
        return real_generate(config, params, prompts, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(L, "ppo_updates", updates)
        mp.setattr(sampler_lib, "generate", generate)
        res, seen = _run(tmp_path_factory.mktemp("pool"), "rl.max_staleness=1", "rl.async_deterministic=true",
                         f"rollout.devices={POOL}")
    return res, seen, seen_dev


def test_a_rollout_pool_trains_on_the_first_devices_and_samples_on_the_last(pooled):
    res, seen, dev = pooled
    train, pool = set(range(8 - POOL)), set(range(8 - POOL, 8))
    # one ppo_updates call per mini-batch (rl.async_early_updates: each as its groups come in); the sampler calls
    assert len(dev["update"]) == sum(res.metrics[s]["updates"] for s in (1, 2, 3)) and len(dev["sample"]) >= STEPS
    assert all(before == after == train and lock is None for before, after, lock in dev["update"])  # no turns
    assert all(params == mesh == pool for params, mesh in dev["sample"])
    for step in (1, 2, 3):  # the fixed lag's versions and staleness, as without the pool
        assert set(_versions(seen[step])) == {max(0, step - 2)}
        assert res.metrics[step]["staleness_max"] == min(1, step - 1) == res.metrics[step]["staleness_mean"]


def test_a_rollout_pool_changes_where_programs_run_not_what_they_compute(pooled, fixed_lag):
    """The pool run against the same run on shared devices (`fixed_lag`): the same tokens sampled, the same
    records at fp32-summation tolerance (the update's batch is split 4 ways instead of 8), but the padding (rows
    are padded to a multiple of the training mesh's batch shards: 4 instead of 8)."""
    res, seen, _ = pooled
    _, lag, lag_seen = fixed_lag
    toks = lambda trajs: [[s.tokens for s in t.segments] for t in trajs]  # noqa: E731
    for step in (1, 2, 3):
        assert toks(seen[step]) == toks(lag_seen[step])
        a, b = res.metrics[step], lag.metrics[step]
        assert set(a) == set(b)
        for k in a:
            if k not in TIMING and not k.startswith("pad/"):
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (step, k)
        assert a["pad/row_fraction"] < b["pad/row_fraction"]


def test_a_rollout_pool_in_flight_keeps_the_bound(tmp_path):
    """max_staleness=2 on a pool: every step is admitted under version 0 (all three in flight at once), new weights
    land in flight; every token of the step trained by version s has a version in [s - 2, s] and the logged
    staleness is the tokens' own. On the timeline each step's rollouts are on its slot's track."""
    res, seen = _run(tmp_path, "rl.max_staleness=2", f"rollout.devices={POOL}", "train.timeline=true")
    with open(os.path.join(tmp_path, "timeline.json")) as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    on = {e["args"]["step"]: tracks[e["tid"]] for e in events if e["ph"] == "X" and e["name"] == "rollouts"}
    assert on == {1: "rollouts", 2: "rollouts 2", 3: "rollouts 3"}
    for step in (1, 2, 3):
        assert res.metrics[step]["invalid"] == 0 == res.metrics[step]["skipped_groups"]
        lags = [(step - 1) - s.version for t in seen[step] if t.status == "ok" for s in t.segments
                if s.kind == "agent" for _ in s.tokens]
        assert lags and 0 <= min(lags) and max(lags) <= min(2, step - 1), (step, lags)
        assert res.metrics[step]["staleness_max"] == max(lags)
        assert res.metrics[step]["staleness_mean"] == pytest.approx(np.mean(lags), rel=1e-12)


def test_weights_reach_the_pool_device_to_device_in_its_layout():
    """The training parameters (fsdp=2 x tensor=2 on devices 0-3) copied into a pool of devices 4-7 laid out as
    2 replicas x the training tensor split: the same values, each leaf on the pool in the pool's sharding."""
    mc = tiny_qwen3()
    r = tiny_grpo_config(STEPS, "rl.max_staleness=1", "rollout.devices=4").rollout
    mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 2}, distributed.training_devices(r))
    params = models.init_params(mc, jax.random.key(0), mesh)
    on = distributed.rollout_mesh(mesh, r)
    assert dict(on.shape) == {"data": 2, "fsdp": 1, "tensor": 2} and {d.id for d in on.devices.flat} == {4, 5, 6, 7}
    copy = distributed.rollout_params(mc, params, mesh, r)
    want = models.param_shardings(mc, on)
    for x, y, s in zip(jax.tree.leaves(params), jax.tree.leaves(copy), jax.tree.leaves(want)):
        assert y.sharding == s and np.array_equal(np.asarray(x), np.asarray(y))
    assert _device_ids(params) == {0, 1, 2, 3}


@pytest.mark.parametrize("sets, msg", [
    (["rollout.devices=-1", "rl.max_staleness=1"], r"must be an int >= 0 .* \(got -1\)"),
    (["rollout.devices=4"], r"> 0 needs rl.max_staleness >= 1: .* \(got 4\)"),
    (["rollout.devices=4", "rl.max_staleness=1", "rollout.mesh=replica=2,tensor=1"],
     r"must equal the devices rollout.mesh='replica=2,tensor=1' lays out \(replica x tensor\) \(got 4\)"),
    (["rollout.devices=4", "rl.max_staleness=1", "rollout.mesh=tensor=3"],
     r"must be divisible by each axis of rollout.mesh='tensor=3' \(got 4\)")])
def test_config_errors_name_rollout_devices(sets, msg):
    with pytest.raises(ConfigError, match=rf"^config key 'rollout.devices': {msg}$"):
        _cfg(*sets)


def test_a_pool_must_fit_the_devices():
    def rollout(*sets):
        return _cfg("rl.max_staleness=1", *sets).rollout

    with pytest.raises(ConfigError, match=r"^config key 'rollout.devices': 8 leaves no device to train on a process "
                                          r"of 8 devices; use 1 to 7, or 0 \(.*\)$"):
        distributed.training_devices(rollout("rollout.devices=8"))
    r = rollout("rollout.devices=3", "rollout.mesh=tensor=3")
    train = sharding.make_mesh({"fsdp": -1}, distributed.training_devices(r))
    with pytest.raises(ConfigError, match=r"^config key 'rollout.devices': a pool of 3 devices beside 5 training "
                                          r"devices per process cannot both split tensor=3 ways .*$"):
        distributed.rollout_mesh(train, r)
    cfg = _cfg("rl.max_staleness=1", "rollout.devices=4", "mesh.fsdp=8")
    with pytest.raises(ConfigError, match=r"^config section 'mesh': .* \(the 4 devices rollout.devices leaves to "
                                          r"train on\)$"):
        make_mesh(cfg, distributed.training_devices(cfg.rollout))


# ------------------------------------------------------------------------------------------ the rollout engine
# rollout.engine=true under the producer: its programs take turns with the update's, new weights drop its cached
# dialogues (the next turn prefills the whole dialogue again with the weights that sample it), and its pool lives
# on the rollout pool's devices, sized for every step in flight there.
ENGINE = ("rollout.engine=true", "rollout.engine_slots=4", "rollout.max_context_tokens=128")  # one table width
ENGINE_EC = dict(slots=2, page_size=4, num_pages=64, max_pages_per_seq=16, prefill_chunk=8, prefill_rows=2,
                 decode_steps=4, num_states=8)


def _tiny_engine_model():
    from mimesis_jax.models.config import ModelConfig
    from test_sampler import QWEN3  # the sampler tests' tiny model

    config = ModelConfig(**QWEN3)
    return config, models.init_params(config, jax.random.key(1)), models.init_params(config, jax.random.key(2))


def test_the_engines_programs_hold_the_device_lock_on_a_mesh(monkeypatch):
    """Every prefill and decode program of an engine on a mesh is dispatched and fetched with the device lock held
    (the lock the update takes beside the producer on shared devices), and the lock is free between calls."""
    from mimesis_jax.inference import engine_programs
    from mimesis_jax.inference.engine import EngineConfig
    from mimesis_jax.inference.generators import EngineGenerator

    config, p1, _ = _tiny_engine_model()
    mesh = sharding.make_mesh({"data": 2, "tensor": 1}, jax.devices()[:2])
    held = []
    for name in ("prefill_program", "decode_program"):
        real = getattr(engine_programs, name)

        def spy(*a, _real=real, _name=name, **kw):
            held.append((_name, sampler_lib._MESH_LOCK.locked()))
            return _real(*a, **kw)
        monkeypatch.setattr(engine_programs, name, spy)
    gen = EngineGenerator(config, models.shard_params(config, p1, mesh), EngineConfig(**ENGINE_EC),
                          stop_ids=(1, 2), mesh=mesh)
    gen.generate([[5, 6, 7], [8, 9]], Sampling(max_tokens=6, temperature=1.0), keys=["a", "b"])
    assert {n for n, _ in held} == {"prefill_program", "decode_program"}
    assert all(h for _, h in held), held
    assert not sampler_lib._MESH_LOCK.locked()


def test_new_weights_mid_dialogue_prefill_the_whole_dialogue_again():
    """A dialogue's second turn after new weights (a pool's Guarded generator, as in flight): the engine dropped
    the cached pages of the old weights, prefills the whole prompt and samples exactly what the static sampler
    samples from it with the new weights and the same seed (no token of the old weights' cache is reused); the
    turn carries the new version."""
    from mimesis_jax.inference.engine import EngineConfig
    from mimesis_jax.inference.generators import EngineGenerator

    config, p1, p2 = _tiny_engine_model()
    gen = Guarded(EngineGenerator(config, p1, EngineConfig(**ENGINE_EC), stop_ids=(1, 2), version=0),
                  device_lock=None)
    eng = gen.inner.engine
    prompts = [[5, 6, 7, 9, 11], [8, 9, 4]]
    first = gen.generate(prompts, Sampling(max_tokens=5, temperature=1.0, seed=3), keys=["a", "b"])
    longer = [p + s.tokens + [12, 13] for p, s in zip(prompts, first)]
    gen.set_params(p2, 1)
    before = dict(eng.stats)
    second = gen.generate(longer, Sampling(max_tokens=5, temperature=1.0, seed=4), keys=["a", "b"])
    want = sampler_lib.generate(config, p2, longer, stop_ids=(1, 2), seed=[4, 4], max_new_tokens=5,
                                temperature=1.0)
    assert [s.tokens for s in second] == [w.tokens for w in want]
    np.testing.assert_allclose(np.concatenate([s.logprobs for s in second]),
                               np.concatenate([w.logprobs for w in want]), atol=1e-5)
    assert [s.version for s in first] == [0, 0] and [s.version for s in second] == [1, 1]
    assert eng.stats["reused_tokens"] == before["reused_tokens"]  # nothing of the old weights' cache
    assert eng.stats["prefill_tokens"] - before["prefill_tokens"] == sum(len(p) for p in longer)


@pytest.fixture(scope="module")
def engine_pool(tmp_path_factory):
    """The fixed-lag run of `fixed_lag` sampling through the rollout engine on a pool of the last 4 devices; a spy
    keeps the policy's engine."""
    made = []
    real = L.policy_model

    def policy_model(*a, **kw):
        m = real(*a, **kw)
        made.append(m)
        return m
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(L, "policy_model", policy_model)
        res, seen = _run(tmp_path_factory.mktemp("engine_pool"), "rl.max_staleness=1", "rl.async_deterministic=true",
                         f"rollout.devices={POOL}", *ENGINE)
    return res, seen, made


def test_the_engine_on_a_pool_samples_the_static_samplers_tokens_on_the_pool(engine_pool, fixed_lag):
    """Engine + rollout pool + max_staleness=1 (fixed lag) against the static sampler's fixed-lag run on shared
    devices: the same tokens every step (the engine draws the sampler's tokens from the same per-request keys),
    the fixed lag's staleness, no eviction (the pool holds both steps in flight); the engine's weights and KV
    pool are on the pool's devices."""
    res, seen, made = engine_pool
    _, _, lag_seen = fixed_lag
    toks = lambda trajs: [[s.tokens for s in t.segments] for t in trajs]  # noqa: E731
    for step in (1, 2, 3):
        assert toks(seen[step]) == toks(lag_seen[step])
        assert set(_versions(seen[step])) == {max(0, step - 2)}
        assert res.metrics[step]["staleness_max"] == min(1, step - 1) == res.metrics[step]["staleness_mean"]
        assert res.metrics[step]["engine/evictions"] == 0
    (policy,) = made
    eng = policy.generator.inner.engine  # Guarded(EngineGenerator)
    pool = set(range(8 - POOL, 8))
    assert _device_ids(eng.params) == pool and _device_ids(eng.pool.cache) == pool
    assert not eng.pool.dialogues  # every dialogue released at its end


def test_the_engine_in_flight_on_shared_devices_keeps_the_bound(tmp_path):
    """The in-flight schedule through the engine on shared devices: its programs take turns with the update's
    (the device lock), new weights land in flight (each drops the cached dialogues), every dialogue is trained,
    nothing is evicted and every token's staleness is within the bound."""
    res, seen = _run(tmp_path, "rl.max_staleness=1", *ENGINE)
    for step in (1, 2, 3):
        assert res.metrics[step]["invalid"] == 0 == res.metrics[step]["skipped_groups"]
        assert res.metrics[step]["engine/evictions"] == 0
        lags = [(step - 1) - s.version for t in seen[step] if t.status == "ok" for s in t.segments
                if s.kind == "agent" for _ in s.tokens]
        assert lags and 0 <= min(lags) and max(lags) <= min(1, step - 1), (step, lags)
        assert res.metrics[step]["staleness_max"] == max(lags)
