"""The 24 domains of Stage I's joint RL (docs/reference/paper.md 3.3, Eq 4): max_phi E_{d ~ p(d)} E_{(c,tau) ~ P^d_phi}[r_d(c, tau)].

One place lists every domain -- the ABCD realistic-behaviour task (``abcd_behaviour``, envs/abcd/env.py) and the
23 SOUL tasks (envs/soul) -- with its protocol family, whether it is multi-turn, its reward r_d in [0, 1], its
record format, the fixed sides it needs, how to load its records, and how to build an environment for a record.
The RL stage draws d ~ p(d) with `DomainSampler` and gets a `SimEnv` from `make_domain_env`, whatever the domain.

p(d): `DomainSampler` takes {domain: weight} (normalised; a domain with weight 0 is never drawn). The paper does
not print its mixture, so the default (`default_weights`) is uniform over the 24 domains; configs override it.

Fixed sides (`SideModels`): ``judge`` (SOUL judge tasks, the ABCD judge), ``partner`` (multi-turn SOUL tasks'
interlocutor), ``support_agent`` (the ABCD support agent). A domain whose side is missing is an error naming it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Mapping

import numpy as np

from mimesis_jax.envs import soul
from mimesis_jax.envs.abcd import dataset as abcd
from mimesis_jax.envs.abcd import env as abcd_env
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.sim_env import SimEnv

BEHAVIOUR_DOMAIN = "abcd_behaviour"


@dataclasses.dataclass
class SideModels:
    """The fixed ChatModels a domain's environment calls."""

    judge: Any = None
    partner: Any = None
    support_agent: Any = None


@dataclasses.dataclass(frozen=True)
class Domain:
    name: str
    family: str  # behaviour | choice | judge
    multi_turn: bool
    protocol: str
    reward: str
    record_format: str
    real_format: bool
    sides: tuple[str, ...]  # SideModels fields the env needs
    load: Callable[[str | os.PathLike], list]  # records of a file in the domain's format
    samples: Callable[[], list]  # the shipped invented records
    build: Callable[..., SimEnv]  # build(record, sides: SideModels, seed) -> SimEnv


def _behaviour_domain() -> Domain:
    def build(record, sides: SideModels, seed, **options):
        return abcd_env.make_behaviour_env(record, agent=sides.support_agent, judge=sides.judge, seed=seed, **options)
    return Domain(
        BEHAVIOUR_DOMAIN, "behaviour", True,
        "the simulator plays the ABCD customer (assigned one of 13 behaviours or neutral) against a fixed support "
        "agent for at most 8 user turns, after the identity-verification replay",
        "Eq 12-13: judged {e, p, n, c} weighted (2.0, 1.5, 0.75, 0.75) / 5.0; meta-narration zeroes e and p",
        "ABCD release conversations (abcd_v1.1.json {train, dev, test} or a plain list; .json / .json.gz)",
        True, ("support_agent", "judge"), abcd.load_conversations,
        lambda: abcd.load_conversations(abcd.SAMPLE_PATH), build)


def _soul_domain(name: str) -> Domain:
    info = soul.task_info(name)
    sides = ("judge",) if info.family == "judge" else ()
    if info.multi_turn:
        sides += ("partner",)

    def build(record, s: SideModels, seed, **options):
        return soul.make_env(name, record, judge=s.judge, partner=s.partner, seed=seed, **options)
    return Domain(name, info.family, info.multi_turn, info.protocol, info.reward, info.record_format,
                  info.real_format, sides, lambda path: soul.load_records(name, path),
                  lambda: soul.sample_records(name), build)


def domains() -> dict[str, Domain]:
    """Every domain by name: abcd_behaviour first, then the SOUL tasks in name order."""
    out = {BEHAVIOUR_DOMAIN: _behaviour_domain()}
    for name in soul.task_names():
        out[name] = _soul_domain(name)
    return out


def domain(name: str) -> Domain:
    """The domain `name`; OdysSim's own task keys (``behavior_chain``, ``sim_arena_math``, ``humanual-book``, ...,
    `soul.ODYSSIM_ALIASES`) name the same domains as this project's names."""
    if name == BEHAVIOUR_DOMAIN:
        return _behaviour_domain()
    name = soul.ODYSSIM_ALIASES.get(name, name)
    try:
        soul.task_info(name)
    except EnvError:
        raise EnvError(f"unknown domain {name!r}; domains: {[BEHAVIOUR_DOMAIN] + soul.task_names()}") from None
    return _soul_domain(name)


def load_mixed(path: str | os.PathLike) -> dict[str, list]:
    """The records of a file that mixes SOUL tasks (e.g. an OdysSim verl parquet), routed to their domains by each
    row's ``data_source`` (OdysSim's keys accepted): {domain: [record, ...]}. A row without one, or naming no
    task, is an error naming the row (`soul.load_mixed`)."""
    return soul.load_mixed(path)


def default_weights() -> dict[str, float]:
    """p(d) when a config gives none: uniform over the 24 domains (the paper does not print its mixture)."""
    return {name: 1.0 for name in domains()}


def make_domain_env(name: str, record, sides: SideModels, *, seed: int | None = None, **options) -> SimEnv:
    """A fresh environment of domain `name` for one record; a missing fixed side is an error naming it."""
    d = domain(name)
    missing = [s for s in d.sides if getattr(sides, s) is None]
    if missing:
        raise EnvError(f"domain {name!r} needs the fixed side(s) {missing} (SideModels fields)")
    return d.build(record, sides, seed, **options)


class DomainSampler:
    """Draws (domain, record index) pairs: d ~ p(d), then a record of d uniformly (Eq 4).

    weights: {domain: w >= 0}; records: {domain: number of records available}. Every weighted domain must have
    records. `known`: the valid domain names (default: the registry). The draw is a pure function of
    (seed, number drawn so far), so `state()` / `restore()` resume exactly.
    """

    def __init__(self, weights: Mapping[str, float], records: Mapping[str, int], *, seed: int = 0,
                 known: Any = None):
        for k in weights:
            if known is None:
                domain(k)  # an unknown name is an error listing the domains
            elif k not in known:
                raise EnvError(f"unknown domain {k!r}; domains: {sorted(known)}")
        for k, w in weights.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not np.isfinite(w) or w < 0:
                raise EnvError(f"domain weights: {k!r} must be a finite number >= 0, got {w!r}")
        self.names = [k for k in weights if weights[k] > 0]
        if not self.names:
            raise EnvError("domain weights: every weight is 0; at least one domain must be drawn")
        for k in self.names:
            n = records.get(k, 0)
            if not isinstance(n, int) or n < 1:
                raise EnvError(f"domain weights: domain {k!r} has weight {weights[k]} but no records")
        w = np.asarray([float(weights[k]) for k in self.names])
        self.p = w / w.sum()
        self.counts = {k: int(records[k]) for k in self.names}
        self.seed, self.drawn = int(seed), 0

    def probabilities(self) -> dict[str, float]:
        return dict(zip(self.names, self.p.tolist()))

    def draw(self, n: int) -> list[tuple[str, int]]:
        out = []
        for _ in range(n):
            rng = np.random.default_rng([self.seed, self.drawn])
            d = self.names[int(rng.choice(len(self.names), p=self.p))]
            out.append((d, int(rng.integers(self.counts[d]))))
            self.drawn += 1
        return out

    def state(self) -> dict:
        return {"seed": self.seed, "drawn": self.drawn}

    def restore(self, state: Mapping) -> None:
        if int(state.get("seed", -1)) != self.seed:
            raise EnvError(f"domain sampler state: seed {state.get('seed')!r} does not match this run's {self.seed}")
        self.drawn = int(state["drawn"])
