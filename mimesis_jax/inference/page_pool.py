"""The rollout engine's page pool: the paged KV cache (models/paged_cache.py), its free pages, the Qwen3.5 state
slots and the cached dialogues, least recently used first.

A dialogue (identified by its key) keeps the tokens the model has consumed, the pages holding their keys/values
and, for Qwen3.5, a state slot (each linear layer's conv window and DeltaNet state). A request reserves, when it
is admitted, the pages for its prompt plus max_tokens new tokens; when it finishes, the pages beyond the
dialogue's consumed tokens are returned. When a request cannot get its pages (or a state slot) the pool evicts
the least-recently-used idle dialogue; if nothing is left to evict and nothing is running, `EngineError` names
the EngineConfig key to raise.

**Rollback.** A prompt that extends the dialogue's consumed tokens prefills only its suffix. One that does not
(a chat template re-rendered the turn's end: Qwen3 drops the empty think block, or the thought, that closed the
previous prompt once the reply is in the history) resumes from an earlier point instead of position 0
(`EngineConfig.checkpoint`; "off": position 0). Pages alone (Qwen3) resume from the longest common prefix: the
keys/values before it are the same, those after it are rewritten. A recurrent state cannot be rolled back, so a
Qwen3.5 dialogue keeps a *snapshot*: a second state slot of its replica (`Dialogue.snap`), copied from its state
slot when a request's prefill reaches its checkpoint (the end of the prompt's last stop token -- its last whole
turn -- or the prompt's end), together with the tokens it holds (`snap_tokens`; the pages up to there stay
valid, later writes land beyond them). A prompt that extends the snapshot's tokens restores it (the copy back into
the state slot runs before the request's prefill) and prefills the rest; the reused tokens count in
`stats["reused_tokens"]` as any, the resumed dialogue in `stats["rolled_back"]`, one resumed from position 0 in
`stats["recomputed"]`. The copies are queued here (`copies`) and run by the engine in batches of one compiled
shape (engine_programs.copy_state_program). A snapshot slot is taken only when one is free and is given up
(uncounted; the least recently used idle dialogue's first) before a dialogue's state would wait or be evicted
for want of a slot, so snapshots never cost a dialogue its place; the RL sizing counts two slots per dialogue
(inference/engine_sizing.py), so a step that fits keeps them all.

**Replicas.** On a mesh with batch axes (inference/engine_programs.py `replica_axes`) the pool is `replicas`
blocks, one per data-parallel replica, each of `ec.num_pages` pages and `ec.states` state slots (page ids and slot
ids are local to the block; its page 0 and slot 0 are its trash), the blocks split over the batch axes and each
block's heads over tensor. A dialogue is assigned to a replica when it first arrives (`home`: the replica with
the fewest dialogues, the lowest index on a tie: deterministic for a given order of arrival) and stays there until
released, even when evicted; its pages and state slot come from its replica's block only.

**Admission control.** A request that cannot get its pages (or a state slot) while requests are running on its
replica waits for them to finish (they return the pages reserved beyond their dialogue's tokens); only when
nothing is running there, i.e. the replica's budget cannot hold the dialogues it already caches plus this one,
the least-recently-used idle dialogue of that replica is evicted (counted in `stats["evictions"]`). A turn loop
whose dialogues fit the pool therefore never evicts, however its requests are interleaved.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict

import jax
import numpy as np

from mimesis_jax import models, sharding
from mimesis_jax.models import paged_cache
from mimesis_jax.models.config import ModelConfig
from mimesis_jax.models.paged_cache import TRASH_PAGE


class EngineError(RuntimeError):
    """A request the engine's configured pools cannot hold (the message names the EngineConfig key)."""


@dataclasses.dataclass(eq=False)
class Dialogue:
    key: object
    tokens: list[int] = dataclasses.field(default_factory=list)  # consumed by the model (in the cache)
    pages: list[int] = dataclasses.field(default_factory=list)
    state: int = 0  # Qwen3.5 state slot (0 = none)
    snap: int = 0  # Qwen3.5 snapshot slot: the state as it stood after `snap_tokens` (0 = none; module docstring)
    snap_tokens: list[int] = dataclasses.field(default_factory=list)
    restore: bool = False  # `tokens` were set back to `snap_tokens`: the state slot is loaded from the snapshot
    rolled_back: bool = False  # the last `open` resumed from an earlier point (counted when admitted)
    busy: bool = False
    last_used: int = 0
    replica: int = 0  # the data-parallel replica whose pages and slot it holds (PagePool.replica_of)


class PagePool:
    """Pages and state slots of one EngineConfig (`ec`: num_pages, page_size, states; per replica), and the
    dialogues holding them. `stats` is the engine's counter dict (reused_tokens, recomputed, evictions and
    pages_peak -- the most pages in use at once over all replicas -- are kept here). With a `mesh` the buffers
    are created sharded as `paged_cache.pool_axes(replicas=True)` says (`shardings`): each device allocates only
    its replica's block of pages and slots, and of those only its heads' part."""

    def __init__(self, config: ModelConfig, ec, stats: dict, mesh=None):
        from mimesis_jax.inference.engine_programs import replica_count
        self.config, self.ec, self.stats, self.mesh = config, ec, stats, mesh
        self.replicas = replica_count(mesh, config)
        self.shardings = None
        self.has_state = config.model_type == "qwen3_5_text"
        self.rollback = ec.checkpoint != "off"  # resume a diverged prompt from its common prefix / a snapshot
        self.copies: list[tuple[int, int, int]] = []  # state-slot copies to run: (replica, from slot, to slot)
        self._clock = 0
        self.cache = None
        self.home: dict = {}  # dialogue key -> its replica, from its first request until release
        self.reset()

    def init_fn(self):
        """The cache's initialiser: every replica's block of pages and slots, stacked on the page / slot dims."""
        return functools.partial(models.family(self.config, "paged").init_paged_cache, self.config,
                                 self.replicas * self.ec.num_pages, self.ec.page_size,
                                 self.replicas * self.ec.states)

    def layout(self):
        """(abstract cache, its shardings on the mesh): what `reset` allocates (plan/compiled.py lowers the
        programs on it)."""
        shapes = jax.eval_shape(self.init_fn())
        return shapes, sharding.tree_shardings(self.mesh, paged_cache.pool_axes(shapes, replicas=True), shapes,
                                               self.config)

    def reset(self) -> None:
        """A fresh KV pool (and Qwen3.5 state slots), every page and slot free, no dialogue cached."""
        self.cache = None  # the old buffers go first: a rebuild after an OOM needs their memory
        init = self.init_fn()
        if self.mesh is None:
            self.cache = init()
        else:
            if self.shardings is None:
                self.shardings = self.layout()[1]
            self.cache = jax.jit(init, out_shardings=self.shardings)()
        # per replica; pop() hands out low pages first
        self.free_by_replica = [list(range(self.ec.num_pages - 1, TRASH_PAGE, -1)) for _ in range(self.replicas)]
        self.states_by_replica = [list(range(self.ec.states - 1, 0, -1)) for _ in range(self.replicas)]
        self.dialogues: OrderedDict = OrderedDict()  # key -> Dialogue, least recently used first
        self.home = {}
        self.copies = []

    @property
    def free_pages(self) -> list[int]:
        """Every replica's free pages (a copy; local ids)."""
        return [p for free in self.free_by_replica for p in free]

    @property
    def free_states(self) -> list[int]:
        return [s for free in self.states_by_replica for s in free]

    def replica_of(self, key) -> int:
        """The replica of dialogue `key`: where it was assigned, else (a new dialogue) the one with the fewest
        dialogues assigned, the lowest index on a tie."""
        if key not in self.home:
            load = [0] * self.replicas
            for k in self.home.values():
                load[k] += 1
            self.home[key] = load.index(min(load))
        return self.home[key]

    def lost(self) -> bool:
        """Whether the pool's buffers are gone: a program that failed after taking its donated cache."""
        return self.cache is None or any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(self.cache))

    def pages_in_use(self) -> int:
        return sum(self.ec.num_pages - 1 - len(free) for free in self.free_by_replica)

    def free(self, d: Dialogue) -> None:
        self.free_by_replica[d.replica].extend(reversed(d.pages))
        d.pages, d.tokens = [], []
        self.drop_snapshot(d)
        if d.state:
            self.states_by_replica[d.replica].append(d.state)
            d.state = 0

    def drop_snapshot(self, d: Dialogue) -> None:
        """Returns d's snapshot slot to its replica; a dialogue waiting to be restored from it starts over."""
        if d.snap:
            self.states_by_replica[d.replica].append(d.snap)
            d.snap = 0
        if d.restore:
            d.tokens, d.restore, d.rolled_back = [], False, False
        d.snap_tokens = []

    def _drop_a_snapshot(self, protect: Dialogue) -> bool:
        """Frees a snapshot slot of `protect`'s replica for its state: the least recently used idle dialogue's,
        else a running one's (not an eviction: the dialogue keeps its pages and state; a running request whose
        snapshot is gone takes none). So snapshots never cost a dialogue its place in the pool."""
        mine = [d for d in self.dialogues.values() if d.replica == protect.replica and d.snap and d is not protect]
        for d in [d for d in mine if not d.busy] + [d for d in mine if d.busy]:
            self.drop_snapshot(d)
            return True
        return False

    def release(self, key) -> None:
        """Forgets dialogue `key`: its pages and slot are freed and its replica assignment ends (an evicted one's
        too)."""
        d = self.dialogues.get(key)
        if d is None:
            self.home.pop(key, None)
            return
        if d.busy:
            raise EngineError(f"release({key!r}): the dialogue has a request in flight")
        self.free(d)
        del self.dialogues[key]
        self.home.pop(key, None)

    def evict_one(self, protect: Dialogue) -> bool:
        """Evicts the least recently used idle dialogue of `protect`'s replica (it keeps its replica)."""
        for key, d in self.dialogues.items():  # least recently used first
            if not d.busy and d is not protect and d.replica == protect.replica and (d.pages or d.state):
                self.free(d)
                del self.dialogues[key]
                self.stats["evictions"] += 1
                return True
        return False

    def open(self, key, prompt: list[int], index: int) -> Dialogue:
        """The dialogue of `key` for a request whose prompt is `prompt`: its cached tokens are kept when the prompt
        extends them, else set back to where it can resume (`_resume_point`: module docstring, rollback) or
        dropped (the dialogue is recomputed from position 0)."""
        d = self.dialogues.get(key)
        if d is None:
            d = Dialogue(key, replica=self.replica_of(key))
            self.dialogues[key] = d
        elif d.busy:
            raise ValueError(f"request {index}: dialogue {key!r} already has a request in flight")
        n = len(d.tokens)
        if n and n < len(prompt) and prompt[:n] == d.tokens:  # reused: counted when admitted (engine)
            return d
        keep = self._resume_point(d, prompt)
        if keep:
            d.rolled_back = True
            d.tokens = list(d.snap_tokens) if self.has_state else d.tokens[:keep]
            d.restore = self.has_state
        else:
            if n:
                self.stats["recomputed"] += 1
            d.tokens, d.snap_tokens = [], []
        return d

    def _resume_point(self, d: Dialogue, prompt: list[int]) -> int:
        """How many of `prompt`'s tokens d can resume from when the prompt does not extend its cached tokens
        (module docstring: rollback); 0 = recompute from position 0."""
        if not self.rollback:
            return 0
        if not self.has_state:  # pages alone: the longest common prefix, at least one token left to prefill
            n = min(len(d.tokens), len(prompt) - 1)
            diff = np.flatnonzero(np.asarray(d.tokens[:n]) != np.asarray(prompt[:n]))
            return int(diff[0]) if diff.size else n
        c = len(d.snap_tokens)
        return c if d.snap and 0 < c < len(prompt) and prompt[:c] == d.snap_tokens else 0

    def reserve(self, d: Dialogue, tokens: int, index: int, running_here: bool) -> bool:
        """Gives d the pages (and state slot) for `tokens` positions from its replica; False = wait for the
        requests running on that replica (`running_here`) to return pages. Only with none running is the
        replica's least recently used idle dialogue evicted (module docstring: admission control)."""
        ps = self.ec.page_size
        need = math.ceil(tokens / ps) - len(d.pages)
        free, states = self.free_by_replica[d.replica], self.states_by_replica[d.replica]
        while len(free) < need or (self.has_state and not d.state and not states):
            if len(free) >= need and self._drop_a_snapshot(d):
                continue
            if running_here:
                return False
            if self.evict_one(d):
                continue
            if len(free) < need:
                raise EngineError(f"request {index}: needs {need} more cache pages of {ps} tokens but the pool has "
                                  f"{len(free)} free with nothing left to evict; raise "
                                  f"EngineConfig.num_pages (RL: rollout.engine_pages / engine_memory_gib; now "
                                  f"{self.ec.num_pages})")
            raise EngineError(f"request {index}: no free state slot and nothing to evict; raise "
                              f"EngineConfig.num_states (RL: rollout.engine_states / engine_memory_gib; now "
                              f"{self.ec.states})")
        for _ in range(max(need, 0)):
            d.pages.append(free.pop())
        if self.has_state and not d.state:
            d.state = states.pop()
        self.stats["pages_peak"] = max(self.stats.get("pages_peak", 0), self.pages_in_use())
        return True

    def take_snapshot_slot(self, d: Dialogue) -> bool:
        """Gives d a snapshot slot if its replica has a free one (a snapshot never waits or evicts)."""
        states = self.states_by_replica[d.replica]
        if not d.snap and states:
            d.snap = states.pop()
        return bool(d.snap)

    def snapshot(self, d: Dialogue, tokens: list[int]) -> None:
        """Queues the copy of d's state slot (as it stands after `tokens`) into its snapshot slot, if it still
        has one."""
        if d.snap:
            self.copies.append((d.replica, d.state, d.snap))
            d.snap_tokens = list(tokens)

    def restore_if_due(self, d: Dialogue) -> None:
        """Queues the copy of d's snapshot into its state slot when `open` set d back to the snapshot."""
        if d.restore:
            self.copies.append((d.replica, d.snap, d.state))
            d.restore = False

    def copy_rows(self, rows_per_replica: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The queued copies as (from, to) slot arrays of `replicas * rows_per_replica` rows, replica-major,
        idle rows copying trash slot 0 onto itself; several calls' worth if a replica queued more."""
        per = [[(a, b) for k, a, b in self.copies if k == r] for r in range(self.replicas)]
        self.copies = []
        calls = []
        for i in range(0, max(len(p) for p in per), rows_per_replica):
            src = np.zeros((self.replicas, rows_per_replica), np.int32)
            dst = np.zeros_like(src)
            for r, p in enumerate(per):
                for j, (a, b) in enumerate(p[i:i + rows_per_replica]):
                    src[r, j], dst[r, j] = a, b
            calls.append((src.reshape(-1), dst.reshape(-1)))
        return calls

    def drop_if_empty(self, key) -> None:
        d = self.dialogues.get(key)
        if d is not None and not d.tokens and not d.pages and not d.state:
            del self.dialogues[key]

    def touch(self, key) -> Dialogue:
        """Marks the dialogue busy and most recently used."""
        d = self.dialogues[key]
        d.busy = True
        self._clock += 1
        d.last_used = self._clock
        self.dialogues.move_to_end(key)
        return d

    def keep(self, d: Dialogue, tokens: list[int]) -> None:
        """The dialogue's request ended having fed `tokens`: the pages beyond them go back to the pool."""
        d.tokens = tokens
        keep = math.ceil(len(d.tokens) / self.ec.page_size)
        self.free_by_replica[d.replica].extend(reversed(d.pages[keep:]))
        d.pages = d.pages[:keep]
        d.busy = False

    def table(self, pages: list[list[int] | None], widths: list[int]):
        """Page tables of a batch (None = an idle row), as wide as the smallest of `widths` holding its longest
        row (attention gathers the whole width, so short dialogues do not pay for the longest one the pool
        allows)."""
        most = max([len(p) for p in pages if p is not None] + [1])
        width = next(w for w in widths if w >= most)
        t = np.full((len(pages), width), TRASH_PAGE, np.int32)
        for i, p in enumerate(pages):
            if p is not None:
                t[i, :len(p)] = p
        return t
