"""Judge-based simulator fidelity: RealUserSim fidelity index (Eq 14) and the SimulatorArena Turing test and style
similarity (docs/reference/metrics.md). Every metric compares a simulator conversation with the human conversation of the same
task (`conversations.pair_by_task`); prompts are data (``data/sim_judges.toml``).

* **Fidelity (Eq 14).** Per case (pair) and dimension d in `FI_DIMENSIONS` the judge says whether the simulated
  user matches the real one: m_{j,d} = 1 for MATCH, 0 for MISMATCH; `metrics.fidelity_index` gives the dimension
  scores (100/N sum_j m_{j,d}) and FI (their mean).
* **Turing.** Per pair the two conversations are shown in a seeded random order -- ``rng = random.Random(seed)``,
  then for each pair in order ``human_first = rng.random() < 0.5`` (drawn for every pair before any judge call);
  the judge names the conversation with the human user; a = 100 x share of pairs it got right and the Turing
  distance |a - 50| (`metrics.turing_distance`).
* **Style.** Per pair the judge rates writing-style and interaction-style similarity from 1 to 5; the section
  reports the means.

Judge answers are parsed robustly (see `parse_verdict`, `parse_human`, `parse_style`). An answer that cannot be
read is asked again once; a second unreadable answer, or a failed judge call, makes that case INVALID: it is
left out of every score and listed apart (``n_invalid`` and ``invalid``), never counted as a 0. A fidelity case is
invalid when any of its five dimensions is.
"""

from __future__ import annotations

import concurrent.futures
import random
import re
from typing import Any, Callable, Sequence

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.model_io import call_model, fill, load_templates, parse_json_object
from mimesis_jax.eval import metrics
from mimesis_jax.eval.conversations import Pair, render_transcript
from mimesis_jax.eval.usi import DATA_DIR
from mimesis_jax.chat.thoughts import split_thought

PROMPTS_PATH = DATA_DIR / "sim_judges.toml"
FI_DIMENSIONS = ("persona", "style", "technical_competency", "interaction_flow", "pacing")
STYLE_KEYS = ("writing", "interaction")


def prompt(key: str, **values) -> str:
    table = load_templates(str(PROMPTS_PATH))
    if key not in table:
        raise EnvError(f"prompt file {PROMPTS_PATH}: no prompt {key!r}")
    return fill(table[key], f"sim_judges.toml:{key}", **values)


def _visible(text: str) -> str:
    return (split_thought(text or "")[1] or "").strip()


def _bare(text: str) -> str:
    """The visible answer with markup and punctuation around it removed, lower case."""
    return re.sub(r"^[\W_]+|[\W_]+$", "", _visible(text)).lower()


# ------------------------------------------------------------------------------------ answer parsers
_VERDICT_RE = re.compile(r"verdict\W{0,5}(match|mismatch|yes|no)\b", re.IGNORECASE)
_VERDICT_WORDS = {"match": True, "matches": True, "yes": True, "true": True, "1": True,
                  "mismatch": False, "no": False, "false": False, "0": False}


def parse_verdict(text: str) -> bool:
    """A fidelity judge's MATCH (True) / MISMATCH (False), from: the last "Verdict: X" line (X one of match,
    mismatch, yes, no); else a JSON object's "match" or "verdict" (bool, or one of those words); else a bare
    answer that is only one such word. ValueError otherwise."""
    found = _VERDICT_RE.findall(_visible(text))
    if found:
        return _VERDICT_WORDS[found[-1].lower()]
    try:
        obj = parse_json_object(text)
    except ValueError:
        obj = {}
    for key in ("match", "verdict"):
        v = obj.get(key)
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.strip().lower() in _VERDICT_WORDS:
            return _VERDICT_WORDS[v.strip().lower()]
    bare = _bare(text)
    if bare in _VERDICT_WORDS:
        return _VERDICT_WORDS[bare]
    raise ValueError(f"no 'Verdict: MATCH' or 'Verdict: MISMATCH' in {_visible(text)[:200]!r}")


_HUMAN_RE = re.compile(r"human(?:\s+user)?\W{0,5}(?:(?:is|was|in|the)\s+)*(?:conversation\s+)?"
                       r"((?-i:[AB])|[12]|first|second)\b", re.IGNORECASE)
_SIDES = {"a": "A", "1": "A", "first": "A", "b": "B", "2": "B", "second": "B"}


def parse_human(text: str) -> str:
    """A Turing judge's pick, "A" or "B", from: the last "Human: A" (also "the human user is in conversation B",
    "Human: first"; letters must be capitals there); else a JSON object's "human"; else a bare answer that is only
    A / B / 1 / 2 / first / second. ValueError otherwise."""
    found = _HUMAN_RE.findall(_visible(text))
    if found:
        return _SIDES[found[-1].lower()]
    try:
        obj = parse_json_object(text)
    except ValueError:
        obj = {}
    v = obj.get("human")
    if isinstance(v, (str, int)) and not isinstance(v, bool) and str(v).strip().lower() in _SIDES:
        return _SIDES[str(v).strip().lower()]
    bare = _bare(text)
    if bare in _SIDES:
        return _SIDES[bare]
    raise ValueError(f"no 'Human: A' or 'Human: B' in {_visible(text)[:200]!r}")


def parse_style(text: str) -> dict[str, float]:
    """A style judge's {"writing", "interaction"} ratings in [1, 5]: from a JSON object (``{key: x}`` or
    ``{key: {"score": x}}``), else from "writing ...: 4" lines. ValueError when one is missing or out of range."""
    try:
        obj = parse_json_object(text)
    except ValueError:
        obj = {}
    out = {}
    for key in STYLE_KEYS:
        v = obj.get(key)
        if isinstance(v, dict):
            v = v.get("score")
        if v is None:
            m = re.findall(rf"{key}[^0-9\n]{{0,30}}?(\d+(?:\.\d+)?)", _visible(text), re.IGNORECASE)
            v = m[-1] if m else None
        if v is None or isinstance(v, bool):
            raise ValueError(f"no {key!r} rating in {_visible(text)[:200]!r}")
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ValueError(f"{key!r} rating must be a number, got {v!r}") from None
        if not 1.0 <= x <= 5.0:
            raise ValueError(f"{key!r} rating {x} is outside [1, 5]")
        out[key] = x
    return out


# ------------------------------------------------------------------------------------ asking
def ask_twice(judge, messages: list[dict], parse: Callable[[str], Any]) -> tuple[Any, str | None]:
    """(parsed answer, None), or (None, reason) when the call failed or the answer was unreadable twice."""
    try:
        first = call_model(judge, messages, "judge").text
        try:
            return parse(first), None
        except ValueError as e:
            retry = list(messages) + [{"role": "assistant", "content": first},
                                      {"role": "user", "content": prompt("retry", error=str(e))}]
            second = call_model(judge, retry, "judge").text
            try:
                return parse(second), None
            except ValueError as e2:
                return None, f"judge answer unparseable twice: {e2}"
    except InvalidEpisode as e:
        return None, str(e)


def _map(fn, items: list, workers: int) -> list:
    if workers <= 1 or len(items) <= 1:
        return [fn(*it) for it in items]
    with concurrent.futures.ThreadPoolExecutor(min(workers, len(items))) as pool:
        return list(pool.map(lambda it: fn(*it), items))


def _ask(judge, content: str, parse) -> tuple[Any, str | None]:
    return ask_twice(judge, [{"role": "user", "content": content}], parse)


def _invalid(pair: Pair, reason: str, **more) -> dict:
    return {"case": pair.simulator.id, "human": pair.human.id, "task_id": pair.simulator.task_id, **more,
            "reason": reason}


# ------------------------------------------------------------------------------------ metrics
def fidelity(pairs: Sequence[Pair], judge, *, workers: int = 8) -> dict:
    """The ``fidelity`` section (Eq 14): {"dimensions", "fi", "n_cases", "n_invalid", "invalid"}; "fi" is null
    and "dimensions" empty when no case is valid."""
    items = [(j, d) for j in range(len(pairs)) for d in FI_DIMENSIONS]

    def one(j, d):
        p = pairs[j]
        return _ask(judge, prompt("fidelity", dimension=d.replace("_", " "), rule=prompt(f"fidelity_{d}"),
                                  human=render_transcript(p.human), simulated=render_transcript(p.simulator)),
                    parse_verdict)
    answers = dict(zip(items, _map(one, items, workers)))
    marks: dict[str, list[int]] = {d: [] for d in FI_DIMENSIONS}
    invalid = []
    for j, p in enumerate(pairs):
        bad = [(d, answers[(j, d)][1]) for d in FI_DIMENSIONS if answers[(j, d)][1] is not None]
        if bad:
            invalid.append(_invalid(p, bad[0][1], dimension=bad[0][0]))
            continue
        for d in FI_DIMENSIONS:
            marks[d].append(int(answers[(j, d)][0]))
    n_valid = len(pairs) - len(invalid)
    fi, dims = metrics.fidelity_index(marks) if n_valid else (None, {})
    return {"dimensions": dims, "fi": fi, "n_cases": n_valid, "n_invalid": len(invalid), "invalid": invalid}


def turing_order(n: int, seed: int) -> list[bool]:
    """human_first for each of `n` pairs: ``rng = random.Random(seed)``, one ``rng.random() < 0.5`` per pair."""
    rng = random.Random(seed)
    return [rng.random() < 0.5 for _ in range(n)]


def turing(pairs: Sequence[Pair], judge, *, seed: int = 0, workers: int = 8) -> dict:
    """The ``turing`` section: {"a", "distance", "n_pairs", "n_invalid", "invalid"} (a and distance null when
    no pair is valid)."""
    order = turing_order(len(pairs), seed)

    def one(j):
        p = pairs[j]
        h, s = render_transcript(p.human), render_transcript(p.simulator)
        first, second = (h, s) if order[j] else (s, h)
        return _ask(judge, prompt("turing", first=first, second=second), parse_human)
    answers = _map(one, [(j,) for j in range(len(pairs))], workers)
    correct, invalid = [], []
    for j, (pick, reason) in enumerate(answers):
        if reason is not None:
            invalid.append(_invalid(pairs[j], reason))
        else:
            correct.append((pick == "A") == order[j])
    a = 100.0 * sum(correct) / len(correct) if correct else None
    return {"a": a, "distance": metrics.turing_distance(correct) if correct else None, "n_pairs": len(correct),
            "n_invalid": len(invalid), "invalid": invalid}


def style(pairs: Sequence[Pair], judge, *, workers: int = 8) -> dict:
    """The ``style`` section: mean writing- and interaction-style similarity (1-5) over the valid pairs, with
    {"n_pairs", "n_invalid", "invalid"} (means null when no pair is valid)."""
    def one(j):
        p = pairs[j]
        return _ask(judge, prompt("style", human=render_transcript(p.human),
                                  simulated=render_transcript(p.simulator)), parse_style)
    answers = _map(one, [(j,) for j in range(len(pairs))], workers)
    rated, invalid = [], []
    for j, (scores, reason) in enumerate(answers):
        if reason is not None:
            invalid.append(_invalid(pairs[j], reason))
        else:
            rated.append(scores)
    out: dict[str, Any] = {k: (sum(r[k] for r in rated) / len(rated) if rated else None) for k in STYLE_KEYS}
    out.update({"n_pairs": len(rated), "n_invalid": len(invalid), "invalid": invalid})
    return out

