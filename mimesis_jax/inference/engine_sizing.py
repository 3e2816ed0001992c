"""How big a rollout engine's pools are (inference/engine.py): the bytes of one KV page and one Qwen3.5 state slot
of a model, and the EngineConfig of an RL stage's rollout for a number of dialogues in flight.

    sizing = engine_sizing(model_config, dialogues=1024, max_context=9344, page_size=16, slots=16,
                           memory_gib=24.0)       # the `rollout.engine*` keys
    sizing = rollout_sizing(cfg.rollout, model_config, dialogues=1024)    # the same, from a rollout config
    sizing.engine_config(), sizing.pool_bytes, sizing.held_dialogues

A page holds `page_size` tokens of every full-attention layer's keys and values (compute dtype); a state slot holds
every gated-DeltaNet layer's conv window (compute dtype) and recurrent state (fp32) -- the arrays
`init_paged_cache` allocates (models/qwen3_paged.py, models/qwen3_5_paged.py).

Without a budget (`rollout.engine_memory_gib` = 0) the pool holds every dialogue in flight at the longest length
(`max_context`) and two state slots per dialogue (its state and its snapshot: inference/page_pool.py, rollback),
one per decode slot (a stateless request, e.g. a gym's own call to the simulator, holds one while it runs) and the
trash slot: nothing is ever evicted. A budget smaller than that caps it: the state slots (as many as without a
budget) take at most half of it, the KV pages the rest. Dialogues take pages for the tokens they really hold, not
for the longest length, so the engine evicts only when the dialogues in flight fill the pages (or outnumber the
slots half the budget holds; a snapshot gives its slot up first, uncounted) -- and counts it
(`engine.stats["evictions"]`, logged per step as engine/evictions). `held_dialogues`: how many dialogues of the
longest length the pools hold at once (snapshots given up).

On a mesh (`mesh`: the engine's axis sizes) the engine is one replica per device block of the batch axes
(inference/page_pool.py): every figure above is per replica -- its share of the dialogues (ceil(dialogues /
replicas)), its pages and state slots -- and the budget is per device: a replica's pool is split over the tensor
axis by heads (paged_cache.pool_axes), so a device holds `device_page_bytes` of each page and `device_state_bytes`
of each slot, and the budget caps their sum. The total capacity grows with the replicas.
"""

from __future__ import annotations

import dataclasses
import math

from mimesis_jax.errors import ConfigError
from mimesis_jax.models.config import ModelConfig

GiB = 2 ** 30


def _leaf_bytes(config: ModelConfig, page_size: int, *, pages: int, states: int, names) -> int:
    """Bytes of the named leaves of the cache the engine allocates (`init_paged_cache` of the model's family,
    evaluated for its shapes only) with `pages` KV pages and `states` state slots."""
    import jax

    from mimesis_jax import models

    init = models.family(config, "paged").init_paged_cache
    shapes = jax.eval_shape(lambda: init(config, pages, page_size, states))
    return sum(v.size * v.dtype.itemsize for k, v in shapes.items() if k in names)


def device_bytes(config: ModelConfig, page_size: int, mesh) -> tuple[int, int]:
    """(bytes of one KV page, of one state slot) that one device of `mesh` (axis sizes; None = one device) holds:
    each leaf divided by the heads split paged_cache.pool_axes gives it (1 where tensor does not divide the
    heads)."""
    import jax

    from mimesis_jax import models, sharding
    from mimesis_jax.models import paged_cache

    init = models.family(config, "paged").init_paged_cache
    shapes = jax.eval_shape(lambda: init(config, 1, page_size, 1))
    axes, shape = paged_cache.pool_axes(shapes), dict(mesh or {})
    out = {}
    for k, v in shapes.items():
        spec = sharding.logical_to_spec(axes[k], v.shape, shape, config)
        split = math.prod(shape[a] for e in spec if e for a in ((e,) if isinstance(e, str) else e))
        out[k] = v.size * v.dtype.itemsize // split
    kv = out.get("k", 0) + out.get("v", 0)
    return kv, (out.get("conv", 0) + out.get("state", 0)) if config.model_type == "qwen3_5_text" else 0


def page_bytes(config: ModelConfig, page_size: int) -> int:
    """Bytes of one KV page: 2 (K, V) x full-attention layers x KV heads x page_size x head_dim x compute dtype."""
    return _leaf_bytes(config, page_size, pages=1, states=0, names=("k", "v"))


def state_bytes(config: ModelConfig) -> int:
    """Bytes of one Qwen3.5 state slot, over every linear layer: the conv window [K-1, Hk, 2 Dk + (Hv/Hk) Dv]
    in the compute dtype + the DeltaNet state [Hv, Dk, Dv] in fp32. 0 for a model without recurrent state."""
    if config.model_type != "qwen3_5_text":
        return 0
    return _leaf_bytes(config, 1, pages=1, states=1, names=("conv", "state"))


@dataclasses.dataclass(frozen=True)
class EngineSizing:
    slots: int
    page_size: int
    num_pages: int
    num_states: int  # state slots including the trash slot 0
    max_pages_per_seq: int
    page_bytes: int
    state_bytes: int
    held_dialogues: int  # longest dialogues the pool holds at once (with their state slots)
    dialogues: int  # dialogues in flight the rollout asked for
    budget_bytes: int  # 0 = no cap; per device
    replicas: int = 1  # data-parallel replicas of the engine (each with these pages, slots and dialogues)
    device_page_bytes: int = 0  # of one page, on one device (its heads' part); 0 = page_bytes
    device_state_bytes: int = 0  # of one state slot, on one device; 0 = state_bytes

    @property
    def pool_bytes(self) -> int:
        """Bytes of one replica's KV pages and state slots (what `init_paged_cache` allocates per replica)."""
        return self.num_pages * self.page_bytes + self.num_states * self.state_bytes

    @property
    def device_pool_bytes(self) -> int:
        """Bytes of the pool on one device: its replica's pages and slots, its heads' part (what the budget caps)."""
        return (self.num_pages * (self.device_page_bytes or self.page_bytes)
                + self.num_states * (self.device_state_bytes or self.state_bytes))

    def engine_config(self):
        """The EngineConfig of these pools; it compiles every program up front (`precompile`: an RL step after
        the first compiles nothing new)."""
        from mimesis_jax.inference.engine import EngineConfig
        return EngineConfig(slots=self.slots, page_size=self.page_size, num_pages=self.num_pages,
                            max_pages_per_seq=self.max_pages_per_seq, num_states=self.num_states, precompile=True)

    def describe(self) -> str:
        cap = f"budget {self.budget_bytes / GiB:.2f} GiB" if self.budget_bytes else "no budget"
        tokens = (self.num_pages - 1) * self.page_size
        states = f" + {self.num_states} state slots" if self.state_bytes else ""
        where = f" per replica x {self.replicas} replicas" if self.replicas > 1 else ""
        return (f"{self.num_pages} pages x {self.page_size} tokens{states}{where} = "
                f"{self.device_pool_bytes / GiB:.2f} GiB per device ({cap}); {tokens} tokens = "
                f"{tokens // self.dialogues} per dialogue in flight ({self.dialogues}{where}); "
                f"{self.held_dialogues} dialogues of the longest {self.max_pages_per_seq * self.page_size} tokens "
                f"at once{where}")


def engine_sizing(config: ModelConfig, *, dialogues: int, max_context: int, page_size: int, slots: int,
                  pages: int = 0, states: int = 0, memory_gib: float = 0.0, key: str = "rollout",
                  mesh=None) -> EngineSizing:
    """The pools of an engine for `dialogues` in flight at once, each up to `max_context` tokens (see the module
    docstring). pages / states: `rollout.engine_pages` / `rollout.engine_states` (0 = derived); memory_gib:
    `rollout.engine_memory_gib` (0 = no cap; per device); mesh: the engine's mesh axis sizes (None = one
    device): the figures are then per replica. Errors name the `{key}.engine_*` key to change."""
    from mimesis_jax.inference.engine_programs import replica_count

    replicas = replica_count(mesh, config)
    D = -(-max(1, int(dialogues)) // replicas)
    per_seq = -(-int(max_context) // page_size)
    whole = page_bytes(config, page_size), state_bytes(config)
    pb, sb = device_bytes(config, page_size, mesh)  # what the per-device budget counts
    budget = int(float(memory_gib) * GiB)
    n_pages = pages or D * per_seq + 1  # + the trash page
    # a state and a snapshot per dialogue + a stateless request per decode slot + the trash slot
    n_states = states or 2 * D + slots + 1
    if budget and n_pages * pb + n_states * sb > budget:
        least = (per_seq + 1) * pb + (slots + 2) * sb  # one longest dialogue + the slots' and the trash state
        if budget < least:
            raise ConfigError(f"config key '{key}.engine_memory_gib': {memory_gib} GiB cannot hold one dialogue "
                              f"of {max_context} tokens ({per_seq + 1} pages of {pb} bytes with the trash page, "
                              f"{slots + 2} state slots of {sb} bytes: {least / GiB:.4f} GiB)")
        if pages and (states or not sb):
            raise ConfigError(f"config key '{key}.engine_memory_gib': {memory_gib} GiB is less than the "
                              f"{(n_pages * pb + n_states * sb) / GiB:.3f} GiB of {key}.engine_pages={pages}"
                              + (f" and {key}.engine_states={states}" if states else ""))
        if pages:  # explicit pages: the state slots take what the budget leaves
            n_states = (budget - n_pages * pb) // sb
        else:
            if not states and sb:  # a slot per dialogue in flight, in at most half the budget
                n_states = max(slots + 2, min(n_states, budget // 2 // sb))
            n_pages = min(n_pages, (budget - n_states * sb) // pb)  # the pages take the rest
        if n_pages < per_seq + 1 or n_states < 2:
            raise ConfigError(f"config key '{key}.engine_memory_gib': {memory_gib} GiB leaves {n_pages} pages and "
                              f"{n_states} state slots: less than one dialogue of {max_context} tokens")
    held = min(D, (n_pages - 1) // per_seq, max(1, n_states - slots - 1) if sb else D)
    return EngineSizing(slots, page_size, int(n_pages), int(n_states), per_seq, *whole, int(held), D, budget,
                        replicas, pb, sb)


def rollout_sizing(r, config: ModelConfig, dialogues: int, mesh=None) -> EngineSizing:
    """The pools of `r` (an RL stage's rollout config: its `rollout.engine*` keys) for `dialogues` in flight at
    once. The page table holds the longest dialogue: `rollout.max_context_tokens` (the runners end a dialogue
    before a prompt + max_tokens would pass it) or, without that limit, the model's max_position_embeddings.
    mesh: the engine's mesh (a Mesh or its axis sizes; None = one device): per replica, budget per device."""
    longest = r.max_context_tokens or config.max_position_embeddings
    if mesh is not None and not isinstance(mesh, dict):
        mesh = dict(mesh.shape)
    return engine_sizing(config, dialogues=dialogues, max_context=longest,
                         page_size=r.engine_page_size, slots=r.engine_slots, pages=r.engine_pages,
                         states=r.engine_states, memory_gib=r.engine_memory_gib, mesh=mesh)
