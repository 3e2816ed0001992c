"""Bounded-staleness rollouts (issue #44 items 1-2; docs/stage2.md): `rl.max_staleness` = N > 0 lets the rollouts
of the next steps run while the current step's update does.

Versions. The policy's version v is the number of RL steps whose update it has taken (the learner's step counter;
`Generator.set_params(params, v)`); every sampled token carries the version of the weights that sampled it
(`Sample.version` -> `Segment.version`). Step s trains with version s (the weights at the start of its updates), so
a token sampled by version v is trained with staleness s - v.

The bound. The rollouts of step j are admitted (their first dialogue starts) only once the generator holds a
version >= j - N; versions only grow, so every token of step j has staleness <= N. The bound is kept by holding
back admissions, never by dropping a finished rollout. N = 0 is the synchronous loop (`StepRollouts`: draw and
rollouts inline, exactly the code path of before); N > 0 runs them in a producer thread (`RolloutProducer`):
every admitted step's rollouts at once, up to N + 1 steps, each in a thread of its own, their draws still taken in
step order at admission, on shared devices and on a rollout pool (below) alike. Either way the
draws, rollout ids and seeds of every step are those of the synchronous run.

Two schedules. By default (`rl.async_deterministic=false`) new weights reach the generator as soon as an update
ends (in-flight: a dialogue's later turns sample with newer weights than its first). With
`rl.async_deterministic=true` the lag is fixed: version v is published only after every step admitted under v-1
has finished its rollouts, so step j samples all its tokens with version max(start, j - N) -- staleness exactly
min(N, j - start), whatever the timing.

Devices. On shared devices (`rollout.devices=0`, the default) the update's programs, the weight publication and
the sampler's programs take turns on the mesh (`sampler._MESH_LOCK`, the lock the sampler's threads already share):
two multi-device programs enqueued from two threads in different orders could wait on each other's collectives.
What overlaps is everything else: environment steps, user and judge replies of remote or rule-based sides, coach
notes, packing. The policy's generator is wrapped (`Guarded`) so that new weights never land between a call
reading the weights and stamping their version, and it holds its own copy of the weights (`own_copy`: the update
donates the training arrays).

Split device pools (`rollout.devices` = D > 0, train/rl/distributed.py "the rollout pool"): the training mesh is
built on each process's devices but its last D, and the policy's sampler and the in-process frozen models sample
on those D (replicas x the training tensor split, or `rollout.mesh`). The two sides' programs never share a
device, so the update holds no lock (the producer's `lock` is None) and runs while the sampler does; the sampler's
programs still take turns among themselves (the frozen models and the policy share the pool). After each update
the weights are copied into the pool device to device (`distributed.rollout_params`: laid out on the training
devices as the pool lays them out, then each shard copied to the pool devices that hold it); the copy is the
generator's own, so no `own_copy`, and the trainer does not wait for the agent turn in flight: the generator
(`Guarded`) takes the new weights at its next call. On either the producer keeps every admitted step in flight
(above): the user waits of several steps overlap one another as well as the update.

The rollout engine (`rollout.engine=true`) runs under the producer too. Its programs take the same device lock
(`RolloutEngine._on_mesh`), so on shared devices they take turns with the update's. Its `set_params` drops
every cached dialogue: a dialogue that spans versions is prefilled again whole at its first turn after new weights,
so each turn is sampled by one version on its whole prefix and its recorded behaviour log-probs are that
version's. On a pool its KV pool is sized for every step in flight there (`learner.steps_at_once`).

vLLM (`rollout.generator=vllm`, docs/vllm.md "Asynchronous rollouts") runs under the producer on shared devices
only: its child is a rollout pool of its own, so `rollout.devices` stays 0. Its decode takes no JAX device (no
device lock, `Guarded` with a null context for it); its own lock keeps one exchange at a time with the child, and
`Guarded` makes a sync wait for the call in flight. The generator holds no arrays (its `set_params` streams the
weights into the child before it returns), so it needs no `own_copy`.

Early updates (`rl.async_early_updates`, default on with N > 0; docs/stage2.md "Early updates"). The producer
rolls each step in parts, one per PPO mini-batch (its rollout.mini_batch_prompts groups, whole), all at once, and
`deliver`s each part in group order as soon as it is complete; the loop `take_part`s them and runs each
mini-batch's update as soon as its groups are in (train/rl/learner.py `learn_parts`), its old log-probs those of
the step's start weights. Under the fixed lag the loop defers each version's publication until the steps it waits
for have all their parts (`learn_parts` goes on meanwhile): the same versions per step, so the same updates as
the whole-step loop.

Resume. The steps past a checkpoint (after step s, versions up to s) were sampled by earlier versions: under the
fixed lag step j samples with version max(0, j - N), so steps s .. s + N - 1 (0-based) need versions
max(0, s - N) .. s - 1. The learner keeps a copy of each of the last N + 1 versions (the update donates the
training arrays) and the checkpoint saves the N before its own (`Checkpointer.save(lagged=...)`, the item
`lagged_params`, in the same atomic step directory). A resume restores them, starts the generator at version
max(0, s - N) (`RolloutProducer(published=...)`) and, before its first step, publishes the versions after it up to
s through the same `publish` the loop uses, so each waits, under the fixed lag, for the steps admitted under the
version before it: the in-flight steps are regenerated from their draws and seeds with the weights they had, and
the run goes on as the uninterrupted one (`rl.async_deterministic=true`: the same metrics and weights). In flight
(`false`) the replayed versions reach the generator as soon as they are published, as in the run, but which
version each turn samples with depends on timing in both runs: no group is lost or trained twice, the staleness
bound holds, exactness is not promised. A checkpoint without the versions (written with N = 0, or a larger N now)
resumes with the generator at version s, a new schedule from there (said in the log).

Several processes (jax.distributed). Each process runs its own producer over its share of each step's tasks
(distributed.process_share; in parts, its share of each part: task i of the step on process i % P whatever part
rolls it, a part with none of its tasks delivered empty), on its own devices: with a pool its last D devices, the training mesh spanning every
process's others; the weight copy after each update is the one above, the first part (the weight sync) a program
over every process's training devices, the second each process's own shard copies into its own pool, so no host
sees a weight. Everything that spans processes stays in the loop's thread, in the same order on every process:
the updates and weight syncs (programs), the gathers of the step's layouts and records (checkpoints.gather_json,
through the coordination service's key-value store: no device program beside the samplers'), the checkpoint's
barriers (programs over every device, so the save holds DEVICE_LOCK). The producers' threads never wait on
another process, so a process that waits in a collective waits only for the other processes' loops. Admission
reads each process's own published version; every process publishes the same versions after the same updates,
so under the fixed lag every process samples a step with the same version, as on one process.

Not yet (issue #44): partial rollouts, more than one step in flight on shared devices. The stale tokens'
off-policy correction is `rl.behavior_is_cap` (train/rl/step.py).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
from typing import Any, Callable

import jax
import jax.numpy as jnp

from mimesis_jax.data.trajectory import Segment
from mimesis_jax.inference import sampler as sampler_lib
from mimesis_jax.inference.protocol import Generator

DEVICE_LOCK = sampler_lib._MESH_LOCK  # one multi-device program at a time across threads (module docstring)


@dataclasses.dataclass
class Produced:
    """One step's rollouts: the outcomes, the next rollout id after them, the data sampler's state right after the
    step's draw (async only: what a checkpoint after this step keeps) and the producer's wall-clock marks."""

    step: int
    outs: list
    next_rid: int
    sampler_state: Any = None
    started: float = 0.0
    ended: float = 0.0


@dataclasses.dataclass
class Drawn:
    """One step's draw, ahead of its rollouts: the drawn items, its first rollout id and the next one after it, and
    the data sampler's state right after the draw."""

    step: int
    items: list
    first_rid: int
    next_rid: int
    sampler_state: Any = None


def snapshot(state):
    """A copy of a data sampler's state that later draws cannot change."""
    return copy.deepcopy(state)


class StepRollouts:
    """N = 0: each step's rollouts run inline when the loop takes them, the weights are published after each step --
    the synchronous loop."""

    lock = None  # nothing runs beside the update
    beside = False

    def __init__(self, produce: Callable[[int, int], Produced], first_rid: int):
        self.produce, self.next_rid = produce, first_rid

    def take(self, step: int) -> Produced:
        got = self.produce(step, self.next_rid)
        self.next_rid = got.next_rid
        return got

    def publish(self, version: int, set_params: Callable[[], None]) -> None:
        set_params()

    def started_after(self, step: int) -> int:
        """Steps after `step` whose rollouts have started: none, they run when the loop takes them."""
        return 0

    def close(self) -> None:
        pass


class RolloutProducer:
    """N > 0: a thread producing the rollouts of steps [start, stop) in step order, step j admitted once the
    published version is >= j - N (module docstring). The loop `take`s each step's rollouts and `publish`es each
    new version; an error in a producing thread is raised by the next `take` / `publish`; `close` stops admitting
    and waits for the steps in flight. lock: what the update holds around its programs (DEVICE_LOCK: the rollouts
    sample on the same devices; None: on a rollout pool of their own, `rollout.devices`).

    Two ways to produce. `produce(step, rid) -> Produced` alone: one step's rollouts at a time, in the producer's
    thread. With `draw` as well: every admitted step's rollouts at once, up to N + 1 of them (the bound admits no
    more): at admission, in the producer's thread and so in step order, `draw(step, rid)` takes the step's draw
    (anything with the `next_rid` after it); then `produce(drawn) -> Produced` runs the rollouts in a thread of
    the step's own.

    In parts (`parts=True`, rl.async_early_updates): `produce` gets `deliver` as its last argument and hands each
    part of a step's rollouts (whole groups) over with it as soon as the part is complete, in part order; the loop
    `take_part`s them, then `take`s the step's Produced (all its outcomes) as before."""

    beside = True  # the rollouts run beside the updates

    def __init__(self, produce: Callable, *, start: int, stop: int, first_rid: int, max_staleness: int,
                 fixed_lag: bool, lock=DEVICE_LOCK, draw: Callable | None = None, published: int | None = None,
                 parts: bool = False):
        self.produce, self.start, self.stop, self.first_rid = produce, start, stop, first_rid
        self._extra = (self.deliver,) if parts else ()  # produce's last argument in parts
        self.max_staleness, self.fixed_lag = max_staleness, fixed_lag
        self.lock, self.draw = lock, draw
        self._cv = threading.Condition()
        # the generator's version: `start`, or an earlier one on a resume that replays the versions up to it
        self._published = start if published is None else published
        self._done: dict[int, Produced] = {}
        self._parts: dict[tuple[int, int], tuple[list, bool]] = {}  # (step, part) -> (outcomes, last), `deliver`
        self._complete: set[int] = set()  # steps whose rollouts are done, taken or not
        self._finished = start - 1  # the last step whose rollouts, and every earlier step's, are done
        self._error: BaseException | None = None
        self._closing = False
        self._workers: list[threading.Thread] = []
        self.admitted_at: dict[int, int] = {}  # step -> the published version when it was admitted
        self._thread = threading.Thread(target=self._loop, name="rollout-producer", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        rid = self.first_rid
        try:
            for j in range(self.start, self.stop):
                with self._cv:
                    self._cv.wait_for(lambda: self._closing or self._published >= j - self.max_staleness)
                    if self._closing:
                        return
                    self.admitted_at[j] = self._published
                if self.draw is None:
                    got = self.produce(j, rid, *self._extra)
                    rid = got.next_rid
                    self._finish(j, got)
                    continue
                drawn = self.draw(j, rid)
                rid = drawn.next_rid
                worker = threading.Thread(target=self._run, args=(j, drawn), name=f"rollouts-{j + 1}", daemon=True)
                self._workers.append(worker)
                worker.start()
        except BaseException as e:  # raised again in the loop's thread by take / publish
            self._fail(e)

    def _run(self, step: int, drawn) -> None:
        try:
            self._finish(step, self.produce(drawn, *self._extra))
        except BaseException as e:
            self._fail(e)

    def deliver(self, step: int, part: int, outs: list, last: bool) -> None:
        """Part `part` of step `step`'s rollouts (whole groups: rl.async_early_updates, one PPO mini-batch's),
        handed over before the step's rollouts end; `last`: the step's last part. Called by `produce` in part
        order."""
        with self._cv:
            self._parts[(step, part)] = (outs, last)
            self._cv.notify_all()

    def take_part(self, step: int, part: int) -> tuple[list, bool]:
        """Waits for part `part` of step `step` (`deliver`): (its outcomes, whether it is the step's last)."""
        with self._cv:
            self._cv.wait_for(lambda: (step, part) in self._parts or self._error is not None)
            self._raise()
            return self._parts.pop((step, part))

    def _finish(self, step: int, got: Produced) -> None:
        with self._cv:
            self._done[step] = got
            self._complete.add(step)
            while self._finished + 1 in self._complete:
                self._finished += 1
            self._cv.notify_all()

    def _fail(self, e: BaseException) -> None:
        with self._cv:
            if self._error is None:
                self._error = e
            self._cv.notify_all()

    def started_after(self, step: int) -> int:
        """Steps after `step` whose rollouts have started (admitted), finished or not."""
        with self._cv:
            return sum(j > step for j in self.admitted_at)

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def take(self, step: int) -> Produced:
        with self._cv:
            self._cv.wait_for(lambda: step in self._done or self._error is not None)
            self._raise()
            return self._done.pop(step)

    def publish(self, version: int, set_params: Callable[[], None]) -> None:
        """`set_params()` puts the weights of `version` in the generator; then steps up to version + N are
        admitted. With the fixed lag, first waits for every step admitted under the previous version."""
        if self.fixed_lag:
            last = min(version - 1 + self.max_staleness, self.stop - 1)
            with self._cv:
                self._cv.wait_for(lambda: self._finished >= last or self._error is not None)
                self._raise()
        set_params()
        with self._cv:
            self._published = version
            self._cv.notify_all()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join()
        for w in self._workers:
            w.join()


class Guarded(Generator):
    """A generator whose weights never change during a `generate`: a sample's version is that of the weights it
    was sampled with (the generator reads its weights when a call starts and stamps the version when it ends).

    On shared devices (device_lock = DEVICE_LOCK, held while the generator takes the weights: it may lay them out
    on its mesh) `set_params` waits for the call in flight. On a rollout pool (device_lock None: the weights arrive
    placed) it does not wait: the weights are handed over at once when no call is in flight, else kept and taken by
    the next call before it samples, so the trainer goes on with its next update while the turn in flight ends with
    the weights it started with; `version` and `params` are then those the next call samples with. vLLM's
    generator, whose decode takes no JAX device, is guarded with a null context as its device_lock: a sync waits
    for the call in flight and holds nothing else."""

    def __init__(self, inner: Generator, device_lock=DEVICE_LOCK):
        self.inner, self.device_lock = inner, device_lock
        self._lock = threading.Lock()  # held by the call in flight
        self._pending_lock = threading.Lock()
        self._pending: tuple | None = None  # (params, version) handed over at the next call (a pool's)

    @property
    def version(self) -> int:
        with self._pending_lock:
            return self.inner.version if self._pending is None else self._pending[1]

    @property
    def params(self):
        with self._pending_lock:
            return self.inner.params if self._pending is None else self._pending[0]

    def _take_pending(self) -> None:
        """The kept weights into the inner generator; call with `_lock` held."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self.inner.set_params(*pending)
            jax.block_until_ready(self.inner.params)

    def generate(self, prompts, sampling, *, keys=None, cancel=None):
        with self._lock:
            self._take_pending()
            return self.inner.generate(prompts, sampling, keys=keys, cancel=cancel)

    def set_params(self, params, version: int) -> None:
        if self.device_lock is not None:
            with self._lock, self.device_lock:
                self.inner.set_params(params, version)
                jax.block_until_ready(self.inner.params)
            return
        with self._pending_lock:
            self._pending = (params, version)
        if self._lock.acquire(blocking=False):  # no call in flight: hand them over now
            try:
                self._take_pending()
            finally:
                self._lock.release()

    def release(self, keys) -> None:
        with self._lock:
            self.inner.release(keys)

    def close(self) -> None:
        self.inner.close()


def own_copy(placed):
    """The rollout weights `placed` as arrays of their own: the update donates the training arrays, which the
    generator holds itself when it samples in the training layout; rollouts running beside the update need their
    weights to outlive it (one copy of the weights more, whatever the layout). Call with the device lock held."""
    return jax.block_until_ready(_copy(placed))


_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))  # one program for the whole tree, new buffers


def agent_segments(rollouts) -> list[Segment]:
    """The agent segments of `rollouts`: Stage II dialogues (Trajectory: segments) or Stage I.3 rollouts (SimRollout:
    one Trajectory per policy turn)."""
    out = []
    for r in rollouts:
        for s in r.segments:
            if isinstance(s, Segment):
                if s.kind == "agent":
                    out.append(s)
            else:
                out.extend(agent_segments([s]))
    return out


def staleness_counts(trained: list, step: int) -> dict[int, int]:
    """{k: the number of agent tokens at staleness k} of the `trained` rollouts, trained by version `step`; tokens
    of segments that carry no version (a scripted stage's hand-made segments) are not counted."""
    counts: dict[int, int] = {}
    for s in agent_segments(trained):
        if s.version is not None and s.tokens:
            lag = step - int(s.version)
            counts[lag] = counts.get(lag, 0) + len(s.tokens)
    return counts


def staleness_summary(counts: dict[int, int]) -> dict:
    """`staleness_max`, `staleness_mean` (per token) and `staleness_hist/<k>` for k = 0 .. max from
    `staleness_counts` (summed over the processes on several); {} when no token is counted."""
    if not counts:
        return {}
    top = max(counts)
    return {"staleness_max": int(top),
            "staleness_mean": float(sum(k * c for k, c in counts.items()) / float(sum(counts.values()))),
            **{f"staleness_hist/{k}": int(counts.get(k, 0)) for k in range(top + 1)}}


def staleness_record(trained: list, step: int) -> dict:
    """`staleness_max` and `staleness_mean` (per token) of the agent tokens of the `trained` rollouts, trained
    by version `step`, and `staleness_hist/<k>`, the number of those tokens at staleness k, for k = 0 .. max (the
    metrics logger writes them to TensorBoard as one histogram); {} when none carries a version (a scripted stage's
    hand-made segments). One process's rollouts; the learner sums `staleness_counts` over the processes."""
    return staleness_summary(staleness_counts(trained, step))
