"""The run timeline (mimesis_jax/timeline.py, issue #44 item 6): the recorder alone (tracks by thread, nesting,
the Chrome trace format, atomic writes, nothing recorded when off), then the tiny Stage II GRPO loop of
tests/test_async_rollouts.py for 2 steps with train.timeline=true: per step one "rollouts" span, one "update" span
per update the record counts, agent turns that sum to the agent segments of the step's trajectories, user waits
that sum to the simulator replies they asked for, updates that never overlap; with rl.max_staleness=1 a step's
rollouts run during an update (the point of it) and `groups_in_flight` is what the trace shows started; with the
key off (the default) no file."""

import json
import os
import threading
import time

import numpy as np
import pytest

from helpers import run_tiny_grpo, tiny_grpo_config
from mimesis_jax import timeline
from mimesis_jax.config import load_config
from mimesis_jax.errors import ConfigError
from mimesis_jax.train.rl.async_rollouts import Produced, RolloutProducer, StepRollouts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2
PROMPTS = 2  # rollout.prompts_per_step


# ------------------------------------------------------------------------------------------ the recorder alone
def _spans(trace, name=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and (name is None or e["name"] == name)]


def _tracks(trace) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}


def test_recorder_tracks_nesting_and_format(tmp_path):
    path = str(tmp_path / "t.json")
    with timeline.recording(path, process="p"):
        with timeline.track("main"), timeline.span("outer", step=1):
            with timeline.span("inner"):
                pass

        def worker():
            with timeline.span("in thread"):
                pass

        th = threading.Thread(target=worker, name="w0")
        th.start()
        th.join()
        timeline.flush()
        with open(path) as f:
            flushed = json.load(f)
        with timeline.track("main"), timeline.span("later"):
            pass
    with open(path) as f:
        trace = json.load(f)
    assert [e["name"] for e in _spans(flushed)] == ["inner", "outer", "in thread"]  # each span at its end
    assert [e["name"] for e in _spans(trace)] == ["inner", "outer", "in thread", "later"]
    tracks = _tracks(trace)
    by = {e["name"]: e for e in _spans(trace)}
    assert tracks[by["outer"]["tid"]] == tracks[by["inner"]["tid"]] == tracks[by["later"]["tid"]] == "main"
    assert tracks[by["in thread"]["tid"]] == "w0"  # a thread without a track block: its own name
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"} == {"p"}
    outer, inner = by["outer"], by["inner"]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3
    assert outer["args"] == {"step": 1} and inner["args"] == {}
    for e in _spans(trace):
        assert set(e) == {"name", "ph", "ts", "dur", "pid", "tid", "args"} and e["dur"] >= 0
    assert os.listdir(tmp_path) == ["t.json"]  # no temporary file left


def test_off_records_nothing_and_one_recording_at_a_time(tmp_path):
    assert timeline.span("x") is timeline.track("x")  # the one shared no-op
    with timeline.span("x"), timeline.track("y"):
        timeline.flush()
    with timeline.recording(None) as tl:
        assert tl is None and timeline.span("x") is timeline.track("x")
    with timeline.recording(str(tmp_path / "a.json")):
        with pytest.raises(RuntimeError, match="already being recorded"):
            with timeline.recording(str(tmp_path / "b.json")):
                pass
    assert os.listdir(tmp_path) == ["a.json"]


# ------------------------------------------------------------------------------------------ busy fractions
def _covered_cells(intervals, start, end):
    """Naive reference on integer marks: the unit cells [c, c + 1] of [start, end] that some interval covers."""
    return sum(any(a <= c and c + 1 <= b for a, b in intervals) for c in range(start, end))


def test_busy_fraction_is_the_union_against_a_cell_count():
    rng = np.random.RandomState(1)
    for _ in range(200):
        ivs = []
        for _ in range(int(rng.randint(0, 6))):
            a = int(rng.randint(-5, 30))
            ivs.append((a, a + int(rng.randint(0, 12))))
        start, end = sorted(int(x) for x in rng.randint(0, 25, size=2))
        want = _covered_cells(ivs, start, end) / (end - start) if end > start else 0.0
        assert timeline.busy_fraction(ivs, start, end) == pytest.approx(want, abs=1e-12), (ivs, start, end)
    # overlapping spans of two threads count once; a span across the window's edges counts its inside only
    assert timeline.busy_fraction([(0, 4), (2, 6), (8, 20)], 1, 11) == (5 + 3) / 10


def test_busy_keeps_its_kinds_counts_open_spans_and_forgets_past_windows():
    busy = timeline.Busy(["update", "agent turn"])
    busy.begin("update", 1.0, 1)
    busy.end(1, 3.0)
    busy.begin("agent turn", 2.0, 2)
    busy.end(2, 5.0)
    busy.begin("agent turn", 4.0, 3)  # still open at the window's end: counts up to it
    busy.begin("update", 9.0, 4)
    busy.end(4, 12.0)
    assert busy.fractions(0.0, 10.0) == {"update": (2 + 1) / 10, "agent turn": 8 / 10}
    busy.end(3, 11.0)
    assert busy.fractions(10.0, 14.0) == {"update": 2 / 4, "agent turn": 1 / 4}
    assert busy.fractions(14.0, 16.0) == {"update": 0.0, "agent turn": 0.0}
    assert [len(v) for v in busy._done.values()] == [0, 0]  # spans that ended by the window's start: forgotten


def test_measuring_takes_the_named_spans_only_timeline_on_or_off(tmp_path):
    with timeline.measuring(["update"]) as busy:
        assert timeline.span("pack") is timeline.track("x")  # not a measured kind, no timeline: the no-op
        t0 = time.perf_counter()
        with timeline.span("update"):
            time.sleep(0.01)
        with timeline.span("pack"):
            time.sleep(0.01)
        t1 = time.perf_counter()
        (a, b), = busy._done["update"]
        assert t0 <= a < b <= t1 and busy.fractions(t0, t1)["update"] == (b - a) / (t1 - t0)
        with timeline.recording(str(tmp_path / "t.json")):
            with timeline.span("update"):
                pass
        assert len(busy._done["update"]) == 2
        with pytest.raises(RuntimeError, match="already being measured"):
            with timeline.measuring(["update"]):
                pass
    assert [e["name"] for e in _spans(_load(tmp_path, "t.json"))] == ["update"]


# ------------------------------------------------------------------------------------------ the Stage II loop
def _cfg(*sets):
    return tiny_grpo_config(STEPS, *sets)


def _run(workdir, *sets):
    return run_tiny_grpo(workdir, STEPS, *sets)


def _load(workdir, name="timeline.json"):
    with open(os.path.join(workdir, name)) as f:
        return json.load(f)


def _on(trace, track):
    tid = {v: k for k, v in _tracks(trace).items()}[track]
    return [e for e in _spans(trace) if e["tid"] == tid]


def _within(inner, outer):
    return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def _overlap(a, b):
    return a["ts"] < b["ts"] + b["dur"] and b["ts"] < a["ts"] + a["dur"]


def _replies_asked(trajs):
    """The simulator replies the step's dialogues asked for: openings and turns whose env addressed the user and
    went on (episodes/agent.py `_user_turns`)."""
    opening = sum("opening_utterance" in t.meta for t in trajs)
    later = sum(1 for t in trajs for e in t.env_info
                if e.get("to_user") is not None and not e["terminated"] and not e["truncated"])
    return opening, later


@pytest.fixture(scope="module")
def synchronous(tmp_path_factory):
    wd = tmp_path_factory.mktemp("sync")
    return wd, *_run(wd, "train.timeline=true")


def test_synchronous_timeline_counts_every_span(synchronous):
    wd, res, seen = synchronous
    trace = _load(wd)
    assert set(_tracks(trace).values()) == {"rollouts", "trainer"}
    rollouts = sorted(_on(trace, "rollouts"), key=lambda e: e["ts"])
    steps = [e for e in rollouts if e["name"] == "rollouts"]
    assert [e["args"]["step"] for e in steps] == [1, 2]  # one per step, in order
    updates = _on(trace, "trainer")
    assert [e["name"] for e in updates if e["name"] == "update"] == ["update"] * sum(
        res.metrics[s]["updates"] for s in (1, 2))
    assert sum(res.metrics[s]["updates"] for s in (1, 2)) == STEPS * PROMPTS  # one mini-batch per group
    assert [e["args"]["version"] for e in updates if e["name"] == "weight sync"] == [1, 2]
    for step_span in steps:
        s = step_span["args"]["step"]
        inside = [e for e in rollouts if e is not step_span and _within(e, step_span)]
        agent_segments = sum(1 for t in seen[s] for seg in t.segments if seg.kind == "agent")
        turns = [e for e in inside if e["name"] == "agent turn"]
        assert agent_segments > 0 and sum(e["args"]["dialogues"] for e in turns) == agent_segments
        waits = [e for e in inside if e["name"] == "user wait"]
        opening, later = _replies_asked(seen[s])
        assert sum(e["args"]["dialogues"] for e in waits if e["args"]["opening"]) == opening
        assert sum(e["args"]["dialogues"] for e in waits if not e["args"]["opening"]) == later
        assert opening + later > 0
        assert res.metrics[s]["groups_in_flight"] == 0  # synchronous: nothing starts before the update
    # one track's updates never overlap, and the synchronous loop's rollouts never overlap its updates
    only = sorted((e for e in updates if e["name"] == "update"), key=lambda e: e["ts"])
    assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(only, only[1:]))
    assert not any(_overlap(r, u) for r in steps for u in only)


def test_asynchronous_rollouts_overlap_an_update(tmp_path):
    res, _ = _run(tmp_path, "train.timeline=true", "rl.max_staleness=1")
    trace = _load(tmp_path)
    # up to max_staleness + 1 steps in flight, step j's rollouts on the track of its slot j % 2
    steps = [e for track in ("rollouts", "rollouts 2") for e in _on(trace, track) if e["name"] == "rollouts"]
    updates = [e for e in _on(trace, "trainer") if e["name"] == "update"]
    assert sorted(e["args"]["step"] for e in steps) == [1, 2] and len(updates) == STEPS * PROMPTS
    # step 2's rollouts start before step 1's training ends (they may end first too: both steps are admitted at
    # once and take turns on the shared devices, so "overlaps an update" is a race; this ordering is not, and the
    # synchronous loop breaks it: there step 2 is drawn only after step 1's last update)
    step2 = next(e for e in steps if e["args"]["step"] == 2)
    step1_trained = max(u["ts"] + u["dur"] for u in updates if u["args"]["step"] == 1)
    assert step2["ts"] < step1_trained
    # groups_in_flight (exact against the producer below): step 2's groups at most, none after the last step
    assert res.metrics[1]["groups_in_flight"] in (0, PROMPTS) and res.metrics[2]["groups_in_flight"] == 0


def test_groups_in_flight_counts_the_started_steps():
    """The producer with max_staleness=1 and version 0 published: step 0 done, step 1 admitted and running (held
    inside its rollouts), step 2 held back by the bound. The loop training step 0 sees step 1 in flight only."""
    running, release = threading.Event(), threading.Event()

    def produce(step, rid):
        if step == 1:
            running.set()
            release.wait(10)
        return Produced(step, [step], rid + 1)

    p = RolloutProducer(produce, start=0, stop=3, first_rid=0, max_staleness=1, fixed_lag=False)
    try:
        p.take(0)
        assert running.wait(10)
        assert (p.started_after(0), p.started_after(1)) == (1, 0)
        assert StepRollouts(lambda s, rid: Produced(s, [], rid), 0).started_after(0) == 0
    finally:
        release.set()
        p.publish(1, lambda: None)
        p.close()


def test_off_writes_no_timeline(synchronous, tmp_path):
    _run(tmp_path)
    assert not os.path.exists(os.path.join(tmp_path, "timeline.json"))
    assert os.path.exists(os.path.join(tmp_path, "metrics.jsonl"))


def test_the_key_is_the_rl_stages_only():
    with pytest.raises(ConfigError, match=r"^config key 'train.timeline': applies to the RL stages only"):
        load_config(os.path.join(ROOT, "configs", "tiny_midtrain.py"), ["train.timeline=true"])
    assert _cfg("train.timeline=true").train.timeline is True and _cfg().train.timeline is False
