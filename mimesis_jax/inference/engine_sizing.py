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
(`max_context`) and a state slot per dialogue, one per decode slot (a stateless request, e.g. a gym's own call to
the simulator, holds one while it runs) and the trash slot: nothing is ever evicted. A budget smaller than that
caps it: the state slots (as many as without a budget) take at most half of it, the KV pages the rest. Dialogues
take pages for the tokens they really hold, not for the longest length, so the engine evicts only when the
dialogues in flight fill the pages (or outnumber the slots half the budget holds) -- and counts it
(`engine.stats["evictions"]`, logged per step as engine/evictions). `held_dialogues`: how many dialogues of the
longest length the pools hold at once.
"""

from __future__ import annotations

import dataclasses

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
    budget_bytes: int  # 0 = no cap

    @property
    def pool_bytes(self) -> int:
        """Bytes of the KV pages and state slots (what `init_paged_cache` allocates)."""
        return self.num_pages * self.page_bytes + self.num_states * self.state_bytes

    def engine_config(self):
        from mimesis_jax.inference.engine import EngineConfig
        return EngineConfig(slots=self.slots, page_size=self.page_size, num_pages=self.num_pages,
                            max_pages_per_seq=self.max_pages_per_seq, num_states=self.num_states)

    def describe(self) -> str:
        cap = f"budget {self.budget_bytes / GiB:.2f} GiB" if self.budget_bytes else "no budget"
        tokens = (self.num_pages - 1) * self.page_size
        states = f" + {self.num_states} state slots" if self.state_bytes else ""
        return (f"{self.num_pages} pages x {self.page_size} tokens{states} = "
                f"{self.pool_bytes / GiB:.2f} GiB ({cap}); {tokens} tokens = {tokens // self.dialogues} per "
                f"dialogue in flight ({self.dialogues}); {self.held_dialogues} dialogues of the longest "
                f"{self.max_pages_per_seq * self.page_size} tokens at once")


def engine_sizing(config: ModelConfig, *, dialogues: int, max_context: int, page_size: int, slots: int,
                  pages: int = 0, states: int = 0, memory_gib: float = 0.0, key: str = "rollout") -> EngineSizing:
    """The pools of an engine for `dialogues` in flight at once, each up to `max_context` tokens (see the module
    docstring). pages / states: `rollout.engine_pages` / `rollout.engine_states` (0 = derived); memory_gib:
    `rollout.engine_memory_gib` (0 = no cap). Errors name the `{key}.engine_*` key to change."""
    D = max(1, int(dialogues))
    per_seq = -(-int(max_context) // page_size)
    pb, sb = page_bytes(config, page_size), state_bytes(config)
    budget = int(float(memory_gib) * GiB)
    n_pages = pages or D * per_seq + 1  # + the trash page
    n_states = states or D + slots + 1  # + a stateless request per decode slot + the trash slot
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
    return EngineSizing(slots, page_size, int(n_pages), int(n_states), per_seq, pb, sb, int(held), D, budget)


def rollout_sizing(r, config: ModelConfig, dialogues: int) -> EngineSizing:
    """The pools of `r` (an RL stage's rollout config: its `rollout.engine*` keys) for `dialogues` in flight at
    once. The page table holds the longest dialogue: `rollout.max_context_tokens` (the runners end a dialogue
    before a prompt + max_tokens would pass it) or, without that limit, the model's max_position_embeddings."""
    longest = r.max_context_tokens or config.max_position_embeddings
    return engine_sizing(config, dialogues=dialogues, max_context=longest,
                         page_size=r.engine_page_size, slots=r.engine_slots, pages=r.engine_pages,
                         states=r.engine_states, memory_gib=r.engine_memory_gib)
