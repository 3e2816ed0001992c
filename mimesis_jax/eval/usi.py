"""tau-bench User-Sim Index (docs/reference/metrics.md): 19 behavioural features of the user turns, Eq 15 Dice, ECE, Eq 16 USI5.

Features. docs/reference/metrics.md names 19 features in four dimensions (`DIMENSIONS`). How each is computed lives in a data
file, ``data/usi_features.toml`` (its header documents the text handling and every feature *kind*; each feature
has a one-line ``doc`` of what it counts): regexes and word lists, never code. `conversation_features` computes
all 19 for one conversation from its user turns; `average_features` averages them over conversations.

Scores (docs/reference/metrics.md, tau-bench User-Sim Index):

* per feature m: Dice_m = 2 min(M_m, H_m) / (M_m + H_m) (Eq 15, `metrics.dice`), M_m the simulator's average and
  H_m the humans' average;
* a dimension D1..D4 = 100 x mean of its features' Dice (`metrics.dimension_score`);
* ECE (`metrics.ece`): per task, the simulator's success rate and the humans' success rate (over the task's
  conversations with a non-null ``success``) and the task's ``difficulty``, in 5 difficulty bins; only tasks with
  all three take part (``n_ece_tasks``). With none, ``ece`` and ``usi5`` are null;
* USI5 = (D1 + D2 + D3 + D4 + 100 (1 - ECE)) / 5 (Eq 16, `metrics.usi5`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import pathlib
import re
import statistics
from typing import Any, Sequence

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import read_toml
from mimesis_jax.eval import metrics
from mimesis_jax.eval.conversations import Conversation

DATA_DIR = pathlib.Path(__file__).resolve().parent / "data"
FEATURES_PATH = DATA_DIR / "usi_features.toml"

DIMENSIONS: dict[str, tuple[str, ...]] = {
    "D1": ("politeness_rate", "short_msg_rate", "formality_rate", "ack_only_rate", "verbosity_cv", "repeat_rate",
           "id_confuse_rate"),
    "D2": ("info_frontload", "id_density", "user_words_per_turn", "opening_words"),
    "D3": ("uncertainty_rate", "certainty_rate", "pushback_q_rate", "clarify_q_rate", "info_q_rate"),
    "D4": ("emotion_rate", "accusation_rate", "pivot_rate"),
}
FEATURE_NAMES: tuple[str, ...] = tuple(f for fs in DIMENSIONS.values() for f in fs)

# kind -> {parameter: (type, required)}
KINDS: dict[str, dict[str, tuple[type, bool]]] = {
    "turn_rate": {"patterns": (list, True), "require": (str, False), "unless": (list, False)},
    "match_count": {"patterns": (list, True)},
    "phrase_only": {"phrases": (list, True)},
    "short_turns": {"max_words": (int, True)},
    "words_cv": {},
    "repeat_ngram": {"n": (int, True)},
    "frontload": {"first_turns": (int, True)},
    "words_per_turn": {},
    "opening_words": {},
}


@dataclasses.dataclass(frozen=True)
class Feature:
    name: str
    kind: str
    doc: str
    params: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class FeatureSet:
    """The loaded data file: the word regex and the 19 features with their patterns compiled."""

    path: str
    word_re: re.Pattern
    features: dict[str, Feature]


def normalise(text: str) -> str:
    """What every feature matches against: lower case, the typographic apostrophe as '."""
    return text.lower().replace("\u2019", "'")


def _compile(pattern: Any, where: str) -> re.Pattern:
    if not isinstance(pattern, str) or not pattern:
        raise EnvError(f"{where}: a pattern must be a non-empty string, got {pattern!r}")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise EnvError(f"{where}: bad regex {pattern!r} ({e})") from None


@functools.lru_cache(maxsize=None)
def load_features(path: str | pathlib.Path = FEATURES_PATH) -> FeatureSet:
    """The feature definitions of `path` (read once per path); errors name the file and the feature (and
    parameter)."""
    data = read_toml(path, "USI feature file")
    word_re = _compile((data.get("settings") or {}).get("word_pattern"), f"{path}: settings.word_pattern")
    table = data.get("features")
    if not isinstance(table, dict):
        raise EnvError(f"{path}: no [features.<name>] tables")
    missing, unknown = sorted(set(FEATURE_NAMES) - set(table)), sorted(set(table) - set(FEATURE_NAMES))
    if missing or unknown:
        raise EnvError(f"{path}: the features must be exactly the 19 of docs/reference/metrics.md; missing {missing}, "
                       f"unknown {unknown}")
    features = {}
    for name in FEATURE_NAMES:
        spec, where = table[name], f"{path}: features.{name}"
        kind = spec.get("kind")
        if kind not in KINDS:
            raise EnvError(f"{where}: 'kind' must be one of {sorted(KINDS)}, got {kind!r}")
        if not isinstance(spec.get("doc"), str) or not spec["doc"].strip():
            raise EnvError(f"{where}: 'doc' (what the feature counts) must be a non-empty string")
        extra = sorted(set(spec) - set(KINDS[kind]) - {"kind", "doc"})
        if extra:
            raise EnvError(f"{where}: unknown parameter(s) {extra} for kind {kind!r}")
        params: dict[str, Any] = {}
        for key, (typ, required) in KINDS[kind].items():
            if key not in spec:
                if required:
                    raise EnvError(f"{where}: kind {kind!r} needs parameter {key!r}")
                continue
            value = spec[key]
            if not isinstance(value, typ) or isinstance(value, bool):
                raise EnvError(f"{where}.{key}: must be {typ.__name__}, got {value!r}")
            params[key] = value
        if kind in ("turn_rate", "match_count"):
            if not params["patterns"]:
                raise EnvError(f"{where}.patterns: must not be empty")
            compiled = [_compile(p, f"{where}.patterns") for p in params["patterns"]]
            params["patterns"] = compiled
            if kind == "match_count":
                params["joined"] = re.compile("|".join(f"(?:{p.pattern})" for p in compiled))
        if "require" in params:
            params["require"] = _compile(params["require"], f"{where}.require")
        if kind == "phrase_only":
            phrases = []
            for p in params["phrases"]:
                ws = word_re.findall(normalise(p)) if isinstance(p, str) else []
                if not ws:
                    raise EnvError(f"{where}.phrases: {p!r} has no words")
                phrases.append(tuple(ws))
            params["phrases"] = phrases
        for key in ("max_words", "n", "first_turns"):
            if key in params and params[key] < (0 if key == "max_words" else 1):
                raise EnvError(f"{where}.{key}: must be >= {0 if key == 'max_words' else 1}, got {params[key]}")
        features[name] = Feature(name, kind, spec["doc"].strip(), params)
    for f in features.values():
        for other in f.params.get("unless", []):
            if other == f.name or other not in features or features[other].kind != "turn_rate":
                raise EnvError(f"{path}: features.{f.name}.unless: {other!r} must name another turn_rate feature")
    _check_unless_cycles(features, path)
    return FeatureSet(str(path), word_re, features)


def _check_unless_cycles(features: dict[str, Feature], path) -> None:
    done: set[str] = set()

    def visit(name: str, stack: tuple[str, ...]):
        if name in stack:
            raise EnvError(f"{path}: 'unless' references form a cycle: {' -> '.join(stack + (name,))}")
        if name in done:
            return
        for other in features[name].params.get("unless", []):
            visit(other, stack + (name,))
        done.add(name)
    for name in features:
        visit(name, ())


# ------------------------------------------------------------------------------------ per conversation
def _turn_counted(fs: FeatureSet, f: Feature, text: str) -> bool:
    p = f.params
    if "require" in p and not p["require"].search(text):
        return False
    if not any(r.search(text) for r in p["patterns"]):
        return False
    return not any(_turn_counted(fs, fs.features[o], text) for o in p.get("unless", []))


def _phrase_only(words: list[str], phrases: list[tuple[str, ...]]) -> bool:
    if not words:
        return False
    ok = [True] + [False] * len(words)  # ok[i]: words[:i] splits into phrases
    for i in range(1, len(words) + 1):
        ok[i] = any(len(ph) <= i and ok[i - len(ph)] and tuple(words[i - len(ph):i]) == ph for ph in phrases)
    return ok[-1]


def _ngrams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs)


def _repeat_rate(words: list[list[str]], n: int) -> float:
    seen: set[tuple[str, ...]] = set()
    hits = 0
    for w in words:
        grams = _ngrams(w, n)
        hits += bool(grams & seen)
        seen |= grams
    return hits / len(words)


def _cv(counts: list[int]) -> float:
    m = _mean(counts)
    return statistics.pstdev(counts) / m if m > 0 else 0.0


# kind -> value(feature set, feature, normalised user turns, their words, their word counts)
_VALUE = {
    "turn_rate": lambda fs, f, texts, words, counts: _mean([float(_turn_counted(fs, f, t)) for t in texts]),
    "match_count": lambda fs, f, texts, words, counts: _mean([float(len(f.params["joined"].findall(t)))
                                                               for t in texts]),
    "phrase_only": lambda fs, f, texts, words, counts: _mean([float(_phrase_only(w, f.params["phrases"]))
                                                               for w in words]),
    "short_turns": lambda fs, f, texts, words, counts: _mean([float(c <= f.params["max_words"]) for c in counts]),
    "words_cv": lambda fs, f, texts, words, counts: _cv(counts),
    "repeat_ngram": lambda fs, f, texts, words, counts: _repeat_rate(words, f.params["n"]),
    "frontload": lambda fs, f, texts, words, counts: (sum(counts[:f.params["first_turns"]]) / sum(counts)
                                                      if sum(counts) else 0.0),
    "words_per_turn": lambda fs, f, texts, words, counts: float(_mean(counts)),
    "opening_words": lambda fs, f, texts, words, counts: float(counts[0]),
}


def conversation_features(conv: Conversation, fs: FeatureSet | None = None) -> dict[str, float]:
    """All 19 features of one conversation, from its user turns (a conversation without one is an error)."""
    fs = fs or load_features()
    turns = conv.user_turns()
    if not turns:
        raise EnvError(f"{conv.where}: field 'messages' has no user turn; the User-Sim Index reads user turns")
    texts = [normalise(t) for t in turns]
    words = [fs.word_re.findall(t) for t in texts]
    counts = [len(w) for w in words]
    return {name: _VALUE[f.kind](fs, f, texts, words, counts) for name, f in fs.features.items()}


def average_features(convs: Sequence[Conversation], fs: FeatureSet | None = None) -> dict[str, float]:
    """Each feature's mean over the conversations (docs/reference/metrics.md: averaged over tasks)."""
    if not convs:
        raise EnvError("the User-Sim Index needs at least one conversation on each side")
    fs = fs or load_features()
    rows = [conversation_features(c, fs) for c in convs]
    return {name: _mean([r[name] for r in rows]) for name in FEATURE_NAMES}


# ------------------------------------------------------------------------------------ ECE inputs
def ece_tasks(simulated: Sequence[Conversation], human: Sequence[Conversation]) -> list[dict]:
    """Per task with a simulator success rate, a human success rate and a difficulty: {"task_id", "sim",
    "human", "difficulty"}, sorted by task id. Conflicting difficulties for one task are an error naming both
    places."""
    difficulty: dict[str, tuple[float, str]] = {}
    for c in list(simulated) + list(human):
        if c.difficulty is None:
            continue
        if c.task_id in difficulty and difficulty[c.task_id][0] != c.difficulty:
            d, where = difficulty[c.task_id]
            raise EnvError(f"{c.where}: field 'difficulty' {c.difficulty} differs from {d} given for task "
                           f"{c.task_id!r} at {where}")
        difficulty.setdefault(c.task_id, (c.difficulty, c.where))

    def rates(convs):
        out: dict[str, list[float]] = {}
        for c in convs:
            if c.success is not None:
                out.setdefault(c.task_id, []).append(1.0 if c.success else 0.0)
        return {t: _mean(v) for t, v in out.items()}
    sim, hum = rates(simulated), rates(human)
    return [{"task_id": t, "sim": sim[t], "human": hum[t], "difficulty": difficulty[t][0]}
            for t in sorted(set(sim) & set(hum) & set(difficulty))]


def ece_bins(tasks: Sequence[dict]) -> list[dict]:
    """The 5 difficulty bins of `metrics.ece` (same cutoffs, same rule) with their task counts and mean rates."""
    edges = (0.0,) + tuple(metrics.ECE_CUTOFFS) + (1.0,)
    members: list[list[dict]] = [[] for _ in range(len(edges) - 1)]
    for t in tasks:
        members[bisect.bisect_right(metrics.ECE_CUTOFFS, t["difficulty"])].append(t)
    return [{"lo": edges[b], "hi": edges[b + 1], "n": len(m),
             "sim_rate": _mean([t["sim"] for t in m]) if m else None,
             "human_rate": _mean([t["human"] for t in m]) if m else None} for b, m in enumerate(members)]


# ------------------------------------------------------------------------------------ the index
def usi(simulated: Sequence[Conversation], human: Sequence[Conversation],
        fs: FeatureSet | None = None) -> dict:
    """The ``usi`` section of evalsim.json: per-feature averages and Dice, D1-D4, ECE (+ bins) and USI5."""
    fs = fs or load_features()
    m, h = average_features(simulated, fs), average_features(human, fs)
    features = {name: {"sim": m[name], "human": h[name], "dice": metrics.dice(m[name], h[name])}
                for name in FEATURE_NAMES}
    dims = {d: metrics.dimension_score({f: m[f] for f in fs_}, {f: h[f] for f in fs_})
            for d, fs_ in DIMENSIONS.items()}
    tasks = ece_tasks(simulated, human)
    ece = metrics.ece([t["sim"] for t in tasks], [t["human"] for t in tasks],
                      [t["difficulty"] for t in tasks]) if tasks else None
    return {"features": features, "dimensions": dims, "ece": ece, "ece_bins": ece_bins(tasks),
            "n_ece_tasks": len(tasks),
            "usi5": None if ece is None else metrics.usi5(dims["D1"], dims["D2"], dims["D3"], dims["D4"], ece),
            "n_simulator": len(simulated), "n_human": len(human)}
