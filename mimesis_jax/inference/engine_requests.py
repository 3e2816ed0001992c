"""The rollout engine's requests (inference/engine.py is the scheduler that runs them): its settings (`EngineConfig`),
one sampling request and its handle (`EngineRequest`), and the checks that turn a call's arguments into requests
(`make_requests`: errors name the request by its index and the argument or EngineConfig key)."""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from mimesis_jax.inference import sampler
from mimesis_jax.inference.protocol import derive_seed
from mimesis_jax.inference.page_pool import Dialogue, EngineError
from mimesis_jax.inference.sampler import Sample


CHECKPOINTS = ("turn", "prompt", "off")


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    slots: int = 16  # decode slots: requests decoded together
    page_size: int = 16  # tokens per cache page
    num_pages: int = 2048  # pages in the pool (page 0 is the trash page): memory = num_pages * page_size tokens
    max_pages_per_seq: int = 256  # page-table width: the longest dialogue is max_pages_per_seq * page_size tokens
    prefill_chunk: int = 64  # tokens per prefill row and round
    prefill_rows: int = 4  # requests prefilled together per round
    decode_steps: int = 16  # one-token steps per compiled decode call (it returns early when a slot frees)
    num_states: int = 0  # Qwen3.5: per-dialogue state slots (0 = 4 * slots); slot 0 is reserved
    # where a dialogue's prompt that does not extend its cached tokens resumes (inference/page_pool.py, rollback):
    # "turn" -- Qwen3.5 snapshots its state at the end of the prompt's last stop token (its last whole turn; a
    # chat template may render the generation header after it differently once the reply is in the history),
    # or at the prompt's end when it holds none; "prompt" -- at the prompt's end (no extra prefill round for the
    # header; enough when the next prompt extends the whole prompt, as Qwen3's thinking template does); pages
    # alone (Qwen3) resume from the longest common prefix under either. "off": recomputed from position 0.
    checkpoint: str = "turn"
    # compile every program (each page-table width and prefill row count) for a sampling filter the first time a
    # generate_tokens call needs it, so that later calls compile nothing (the RL loops: step 2 compiles nothing new)
    precompile: bool = False

    def validate(self) -> None:
        for name in ("slots", "page_size", "num_pages", "max_pages_per_seq", "prefill_chunk", "prefill_rows",
                     "decode_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"EngineConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_pages < 2:
            raise ValueError(f"EngineConfig.num_pages must be >= 2 (page 0 is the trash page), got {self.num_pages}")
        if self.checkpoint not in CHECKPOINTS:
            raise ValueError(f"EngineConfig.checkpoint must be one of {CHECKPOINTS}, got {self.checkpoint!r}")
        if self.num_states < 0 or self.num_states == 1:
            raise ValueError(f"EngineConfig.num_states must be 0 (auto) or >= 2 (slot 0 is reserved), "
                             f"got {self.num_states}")

    @property
    def states(self) -> int:
        return self.num_states or 4 * self.slots + 1


@dataclasses.dataclass(eq=False)
class EngineRequest:
    """One sampling request: the handle `RolloutEngine.submit` returns. Its fields fill in as the scheduler runs:
    `out` / `lps` (sampled ids and their log-probs), `finish` ("stop" | "length" | "cancelled" | "error") with
    `error` (a message) on the last, and `on_token(request, token, logprob)` (optional) is called from the thread
    that runs the scheduler right after each token is recorded (`finish` is already set on the last one); a
    request ended without a token (cancelled while waiting, a failed program) gets one call with token None."""

    index: int
    prompt: list[int]
    key: object
    max_new: int
    temperature: float
    lp_temperature: float
    top_k: int
    top_p: float
    seed: int
    salt: int
    stops: list[int]
    on_token: object = None
    serial: int = 0
    dialogue: Dialogue | None = None
    slot: int = -1
    pending: list[int] = dataclasses.field(default_factory=list)  # prompt tokens still to prefill
    pos: int = 0  # position of the next token fed to the model
    checkpoint: int = -1  # prompt position after which the dialogue's state is snapshotted (-1 = none)
    out: list[int] = dataclasses.field(default_factory=list)
    lps: list[float] = dataclasses.field(default_factory=list)
    finish: str | None = None
    error: str | None = None
    cancelled: bool = False  # set by RolloutEngine.cancel from any thread; the scheduler acts on it
    exception: BaseException | None = None  # why it ended with "error" when it was refused at admission

    @property
    def done(self) -> bool:
        return self.finish is not None

    def sample(self) -> Sample:
        return Sample(self.out, self.lps, self.finish, len(self.prompt))


def make_requests(prompts, keys, max_tokens, temperature, top_p, top_k, seed, stop_ids, logprob_temperature, *,
                  ec: EngineConfig, vocab_size: int, default_stops: Sequence[int], engine_seed: int, call: int,
                  next_serial: Callable[[], int], first_index: int = 0) -> list[EngineRequest]:
    """Validated requests of one call (settings as `RolloutEngine.generate_tokens`; errors name the request by its
    index in the call, first_index the first). stop_ids None: `default_stops`; seed None: derived from
    (engine_seed, call, the request's index); next_serial() numbers each request (admission order of anonymous
    dialogues)."""
    n = len(prompts)
    if n == 0:
        return []
    keys = [None] * n if keys is None else list(keys)
    if len(keys) != n:
        raise ValueError(f"keys: got {len(keys)} keys for {n} prompts")
    dup = [k for k in keys if k is not None]
    if len(set(dup)) != len(dup):
        raise ValueError("keys: a dialogue key appears twice in one call")
    V = vocab_size
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {first_index + i} is empty: every request needs at least one token")
        arr = np.asarray(p)
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() >= V:
            raise ValueError(f"prompt {first_index + i} must be a flat list of token ids in [0, {V})")
    per = sampler.per_request
    max_new = per("max_new_tokens", max_tokens, n, int)
    temps = per("temperature", temperature, n, float)
    tps, tks = per("top_p", top_p, n, float), per("top_k", top_k, n, int)
    stops = sampler.stop_lists(default_stops if stop_ids is None else stop_ids, n)
    if seed is None:
        seed = [derive_seed(engine_seed, call, i) for i in range(n)]
    if isinstance(seed, (list, tuple, np.ndarray)):
        seeds, salts = per("seed", seed, n, int), [0] * n
    else:
        seeds, salts = [int(seed)] * n, list(range(n))
    if logprob_temperature == "sampling":
        lp_temps = [t if t > 0 else 1.0 for t in temps]
    else:
        lp_temps = [float(logprob_temperature)] * n
    max_len = ec.max_pages_per_seq * ec.page_size
    reqs = []
    for i in range(n):
        j = first_index + i
        if max_new[i] < 1:
            raise ValueError(f"request {j}: max_tokens must be >= 1, got {max_new[i]}")
        if temps[i] < 0 or not 0.0 < tps[i] <= 1.0 or tks[i] < 0:
            raise ValueError(f"request {j}: need temperature >= 0, top_p in (0, 1], top_k >= 0")
        if len(prompts[i]) + max_new[i] - 1 > max_len:
            raise EngineError(f"request {j}: prompt ({len(prompts[i])}) + max_tokens ({max_new[i]}) exceeds the "
                              f"{max_len}-token page table; raise EngineConfig.max_pages_per_seq "
                              f"(now {ec.max_pages_per_seq})")
        reqs.append(EngineRequest(j, [int(t) for t in prompts[i]], keys[i], max_new[i], temps[i], lp_temps[i],
                                  tks[i], tps[i], seeds[i] % (1 << 32), salts[i], stops[i], serial=next_serial()))
    return reqs
