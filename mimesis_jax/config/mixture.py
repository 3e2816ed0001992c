"""The gym mixture of Stage II and of the `rollout` command (envs/userrl/mixture.py samples from it): which task
files, which gyms in which proportions, the prompt-length filter and the agent turns per episode."""

from __future__ import annotations

import dataclasses

from mimesis_jax.config.checks import need

USERRL_TRAIN_ROWS = {"TravelGym": 925, "TauGym": 500, "TurtleGym": 423, "PersuadeGym": 378, "FunctionGym": 200}
MAX_PROMPT_TOKENS = 1152  # UserRL drops prompts of this many tokens or more
# the eight UserRL gyms (envs/userrl/<name without "Gym", lower case>.py implements each)
USERRL_GYMS = ("TravelGym", "TurtleGym", "FunctionGym", "TauGym", "PersuadeGym", "IntentionGym", "TelepathyGym",
               "SearchGym")


@dataclasses.dataclass(frozen=True)
class MixtureConfig:
    sources: tuple[str, ...] = ("shipped:train",)  # task files/folders, shipped:train / shipped:test, or toy:N
    weights: tuple[tuple[str, float], ...] = tuple(USERRL_TRAIN_ROWS.items())  # gym -> weight; () = by row count
    gyms: tuple[str, ...] = ()  # keep only these gyms (() = every gym with weight > 0, or all when weights=())
    max_prompt_tokens: int = MAX_PROMPT_TOKENS  # drop prompts with at least this many tokens (0 = keep all)
    max_turns: int = 16  # agent turns per episode (paper Table 13)

    def weight_map(self) -> dict[str, float]:
        return {g: float(w) for g, w in self.weights}

    def validate(self) -> "MixtureConfig":
        """Checks every key a `--set` can reach; errors name the key (config.load_config calls this)."""
        known = set(USERRL_GYMS) | {"ToyKeyword"}
        bad = sorted({g for g, _ in self.weights} - known) + sorted(set(self.gyms) - known)
        need(not bad, "weights'/'gyms", f"unknown gyms {bad}; known: {sorted(known)}")
        need(not any(float(w) < 0 for _, w in self.weights), "weights", "weights must be >= 0", got=self.weights)
        need(bool(self.sources), "sources", "at least one task source is needed")
        need(self.max_prompt_tokens >= 0, "max_prompt_tokens", "must be >= 0", got=self.max_prompt_tokens)
        need(self.max_turns >= 1, "max_turns", "must be >= 1", got=self.max_turns)
        return self
