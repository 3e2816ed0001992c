"""The rollout engine's page pool: the paged KV cache (models/paged_cache.py), its free pages, the Qwen3.5 state
slots and the cached dialogues, least recently used first.

A dialogue (identified by its key) keeps the tokens the model has consumed, the pages holding their keys/values
and, for Qwen3.5, a state slot (each linear layer's conv window and DeltaNet state). A request reserves, when it
is admitted, the pages for its prompt plus max_tokens new tokens; when it finishes, the pages beyond the
dialogue's consumed tokens are returned. When a request cannot get its pages (or a state slot) the pool evicts
the least-recently-used idle dialogue; if nothing is left to evict and nothing is running, `EngineError` names
the EngineConfig key to raise.
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
    busy: bool = False
    last_used: int = 0


class PagePool:
    """Pages and state slots of one EngineConfig (`ec`: num_pages, page_size, states), and the dialogues holding
    them. `stats` is the engine's counter dict (reused_tokens, recomputed, evictions and pages_peak -- the most
    pages in use at once -- are kept here). With a `mesh` the buffers are created sharded as
    `paged_cache.pool_axes` says (`shardings`), each device allocating only its heads' part."""

    def __init__(self, config: ModelConfig, ec, stats: dict, mesh=None):
        self.config, self.ec, self.stats, self.mesh = config, ec, stats, mesh
        self.shardings = None
        self.has_state = config.model_type == "qwen3_5_text"
        self._clock = 0
        self.cache = None
        self.reset()

    def reset(self) -> None:
        """A fresh KV pool (and Qwen3.5 state slots), every page and slot free, no dialogue cached."""
        self.cache = None  # the old buffers go first: a rebuild after an OOM needs their memory
        init = functools.partial(models.family(self.config, "paged").init_paged_cache, self.config,
                                 self.ec.num_pages, self.ec.page_size, self.ec.states)
        if self.mesh is None:
            self.cache = init()
        else:
            if self.shardings is None:
                shapes = jax.eval_shape(init)
                self.shardings = sharding.tree_shardings(self.mesh, paged_cache.pool_axes(shapes), shapes,
                                                         self.config)
            self.cache = jax.jit(init, out_shardings=self.shardings)()
        self.free_pages = list(range(self.ec.num_pages - 1, TRASH_PAGE, -1))  # pop() hands out low pages first
        self.free_states = list(range(self.ec.states - 1, 0, -1))
        self.dialogues: OrderedDict = OrderedDict()  # key -> Dialogue, least recently used first

    def lost(self) -> bool:
        """Whether the pool's buffers are gone: a program that failed after taking its donated cache."""
        return self.cache is None or any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(self.cache))

    def pages_in_use(self) -> int:
        return self.ec.num_pages - 1 - len(self.free_pages)

    def free(self, d: Dialogue) -> None:
        self.free_pages.extend(reversed(d.pages))
        d.pages, d.tokens = [], []
        if d.state:
            self.free_states.append(d.state)
            d.state = 0

    def release(self, key) -> None:
        d = self.dialogues.get(key)
        if d is None:
            return
        if d.busy:
            raise EngineError(f"release({key!r}): the dialogue has a request in flight")
        self.free(d)
        del self.dialogues[key]

    def evict_one(self, protect: Dialogue) -> bool:
        for key, d in self.dialogues.items():  # least recently used first
            if not d.busy and d is not protect and (d.pages or d.state):
                self.free(d)
                del self.dialogues[key]
                self.stats["evictions"] += 1
                return True
        return False

    def open(self, key, prompt: list[int], index: int) -> Dialogue:
        """The dialogue of `key` for a request whose prompt is `prompt`: its cached tokens are kept when the prompt
        extends them, else dropped (the dialogue is recomputed from position 0)."""
        d = self.dialogues.get(key)
        if d is None:
            d = Dialogue(key)
            self.dialogues[key] = d
        elif d.busy:
            raise ValueError(f"request {index}: dialogue {key!r} already has a request in flight")
        n = len(d.tokens)
        if n and n < len(prompt) and prompt[:n] == d.tokens:
            self.stats["reused_tokens"] += n
        else:
            if n:
                self.stats["recomputed"] += 1
            d.tokens = []
        return d

    def reserve(self, d: Dialogue, tokens: int, index: int, anything_running: bool) -> bool:
        """Gives d the pages (and state slot) for `tokens` positions; False = wait for running requests."""
        ps = self.ec.page_size
        need = math.ceil(tokens / ps) - len(d.pages)
        while len(self.free_pages) < need or (self.has_state and not d.state and not self.free_states):
            if self.evict_one(d):
                continue
            if anything_running:
                return False
            if len(self.free_pages) < need:
                raise EngineError(f"request {index}: needs {need} more cache pages of {ps} tokens but the pool has "
                                  f"{len(self.free_pages)} free with nothing left to evict; raise "
                                  f"EngineConfig.num_pages (RL: rollout.engine_pages / engine_memory_gib; now "
                                  f"{self.ec.num_pages})")
            raise EngineError(f"request {index}: no free state slot and nothing to evict; raise "
                              f"EngineConfig.num_states (RL: rollout.engine_states / engine_memory_gib; now "
                              f"{self.ec.states})")
        for _ in range(max(need, 0)):
            d.pages.append(self.free_pages.pop())
        if self.has_state and not d.state:
            d.state = self.free_states.pop()
        self.stats["pages_peak"] = max(self.stats.get("pages_peak", 0), self.pages_in_use())
        return True

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
        self.free_pages.extend(reversed(d.pages[keep:]))
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
