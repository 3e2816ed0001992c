"""The SOUL task environments' shared machinery: registry, record loading, prompt templates, answer parsing, judging.

SOUL (docs/reference/paper.md 3.3, docs/reference/environments.md) is a suite of user-/human-simulation tasks; Stage I's joint RL (Eq 4) treats
each as one environment d with its own protocol and reward r_d in [0, 1]. The simulator is the policy
(envs/sim_env.py): the task is put to it as a ``user`` message and it answers, or role-plays, as ``assistant``.
This project writes its own version of each task from the protocols of the public OdysSim repository
(``agents/<task>``); prompts are data (``prompts/<task>.toml``, ``string.Template`` placeholders ``$name``).

Two protocol families:

* ``choice`` -- multiple-choice / exact-answer tasks scored by accuracy, no judge (`ChoiceEnv`): the reply is
  read exactly as the task's OdysSim agent reads it (the FIRST ``<answer>`` tag, only the forms it accepts, its
  per-task fallbacks; lifechoices' one documented difference is in its module); a reply with no readable answer
  scores 0 (that is the policy's failure, not the environment's). ``lenient=True`` selects a forgiving
  reader (`parse_choice` / `parse_exact`), off by default since format compliance is part of r_d.
* ``judge`` -- generation tasks scored by an LLM judge with a per-task rubric (`JudgeEnv`), single- or multi-turn
  (a fixed ``partner`` model plays the other side). The judge's score is parsed by `parse_score` and mapped to
  [0, 1]; an answer that does not parse is asked again once, then the episode is INVALID (`InvalidEpisode`).

Records: every task reads JSONL, JSON (a list) or parquet rows. A row whose ``extra_info`` is an object is read
from that object (OdysSim's verl parquet keeps each task's fields there); otherwise the row itself is the record.
`SoulEnv.parse_record` checks the task's fields (``fields``: (key, types, optional)) and errors name the file,
the record index and the field. A row's ``data_source`` must name the task loaded (OdysSim's own keys are aliases,
`ODYSSIM_ALIASES`); `load_mixed` routes the rows of a file that mixes tasks. Each task ships 3-10 invented
records in ``samples/<task>.jsonl``.

Registering a task: subclass `ChoiceEnv` or `JudgeEnv`, set the class attributes documented on `SoulEnv`,
decorate with `@register`, and add the module to the imports of the package's __init__.py.
"""

from __future__ import annotations

from dataclasses import dataclass
import json
import os
import pathlib
import re
import string
from typing import Any, Callable, Sequence

from mimesis_jax.data import jsonio
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.model_io import call_model, field, fill, load_templates, parse_json_object
from mimesis_jax.envs.sim_env import Message, SimEnv, SimTurn
from mimesis_jax.chat.thoughts import split_thought

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
PROMPTS_DIR = PACKAGE_DIR / "prompts"
SAMPLES_DIR = PACKAGE_DIR / "samples"
FAMILIES = ("choice", "judge")


# ------------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class TaskInfo:
    """What the domain registry and the docs read about one task."""

    name: str
    family: str          # choice | judge
    multi_turn: bool
    protocol: str        # one line: what the policy is shown and must do
    reward: str          # one line: how r_d in [0, 1] is computed
    record_format: str   # one line: the record fields the loader reads
    real_format: bool    # True: OdysSim's published field names; False: this project's documented generic schema
    env_class: type


_REGISTRY: dict[str, TaskInfo] = {}


def register(cls):
    """Class decorator: registers a SoulEnv subclass under `cls.name` (a duplicate name is an error)."""
    for attr in ("name", "protocol", "reward_doc", "record_format"):
        if not getattr(cls, attr, None):
            raise EnvError(f"SOUL task class {cls.__name__}: class attribute {attr!r} must be set")
    if cls.family not in FAMILIES:
        raise EnvError(f"SOUL task {cls.name!r}: family must be one of {FAMILIES}, got {cls.family!r}")
    if cls.name in _REGISTRY:
        raise EnvError(f"SOUL task {cls.name!r} is registered twice ({_REGISTRY[cls.name].env_class.__name__} "
                       f"and {cls.__name__})")
    cls.domain = cls.name  # the SimEnv's domain (Eq 4's d) is the task's name
    _REGISTRY[cls.name] = TaskInfo(cls.name, cls.family, bool(cls.multi_turn), cls.protocol, cls.reward_doc,
                                   cls.record_format, bool(cls.real_format), cls)
    return cls


def task_info(name: str) -> TaskInfo:
    if name not in _REGISTRY:
        raise EnvError(f"unknown SOUL task {name!r}; registered: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def task_names() -> list[str]:
    return sorted(_REGISTRY)


# ------------------------------------------------------------------------------------ records
def read_rows(path: str | os.PathLike) -> list[dict]:
    """The rows of a .jsonl / .json (list) / .parquet file; errors name the file (and line)."""
    p = pathlib.Path(path)
    if not p.is_file():
        raise EnvError(f"SOUL record file {p} does not exist")
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".json"):
        if suffix == ".jsonl":
            return jsonio.read_jsonl(p, error=EnvError)
        data = jsonio.read_json(p, error=EnvError)
        if not isinstance(data, list):
            raise EnvError(f"{p}: a .json record file must hold a list of records")
        return data
    if suffix == ".parquet":
        # lazy (b): pyarrow only for .parquet rows
        import pyarrow.parquet as pq
        try:
            return pq.read_table(p).to_pylist()
        except Exception as e:  # noqa: BLE001 -- any reader failure is the file's fault
            raise EnvError(f"{p}: not a readable parquet file ({e})") from None
    raise EnvError(f"{p}: SOUL record files are .jsonl, .json or .parquet")


def _unwrap(row: Any, where: str) -> dict:
    if not isinstance(row, dict):
        raise EnvError(f"{where}: expected an object, got {type(row).__name__}")
    extra = row.get("extra_info")
    if isinstance(extra, str) and extra.strip().startswith("{"):
        try:
            extra = json.loads(extra)
        except json.JSONDecodeError as e:
            raise EnvError(f"{where}: field 'extra_info' is not valid JSON ({e.msg})") from None
    return dict(extra) if isinstance(extra, dict) else row


# OdysSim's own task keys (the ``data_source`` of its verl rows, ``agents/base_agent.py`` routes) that differ from
# this project's task names. "humanual" (no domain suffix) is accepted by every humanual_* task.
ODYSSIM_ALIASES = {
    "behavior_chain": "behaviorchain",
    "sim_arena_math": "sim_math",
    "sim_arena_doc": "sim_doc",
    "sotopia_hint": "sotopia",
    "alignx_demo": "alignx", "alignx_pair": "alignx", "alignx_ugc": "alignx", "alignx_arbitrary": "alignx",
    "alignx_history16": "alignx",
    **{f"humanual-{d}": f"humanual_{d}" for d in ("book", "chat", "email", "news", "opinion", "politics")},
}


def canonical_task(key: str) -> str:
    """This project's task name for `key` (ours, or OdysSim's alias of it); unknown: an EnvError."""
    name = ODYSSIM_ALIASES.get(key, key)
    task_info(name)
    return name


def _data_source(row: Any) -> str | None:
    """A row's ``data_source`` (the verl row's own, else its extra_info's), or None."""
    if not isinstance(row, dict):
        return None
    ds = row.get("data_source")
    if ds is None and isinstance(row.get("extra_info"), dict):
        ds = row["extra_info"].get("data_source")
    return ds if isinstance(ds, str) and ds.strip() else None


def _source_matches(ds: str, name: str) -> bool:
    ds = ds.strip()
    if ds == "humanual":
        return name.startswith("humanual_")
    return ODYSSIM_ALIASES.get(ds, ds) == name


def load_records(name: str, path: str | os.PathLike) -> list[dict]:
    """Every record of task `name` in `path`, checked by the task's `parse_record`. A row whose ``data_source``
    names another task (OdysSim's keys accepted as aliases, `ODYSSIM_ALIASES`) is an error naming the row and
    both names (for a file mixing tasks use `load_mixed`)."""
    name = ODYSSIM_ALIASES.get(name, name)
    cls = task_info(name).env_class
    rows = read_rows(path)
    if not rows:
        raise EnvError(f"SOUL record file {path} holds no records")
    out = []
    for i, row in enumerate(rows):
        where = f"{path}, record {i} (task {name})"
        ds = _data_source(row)
        if ds is not None and not _source_matches(ds, name):
            raise EnvError(f"{where}: field 'data_source' is {ds!r}, not task {name!r} (a mixed file loads with "
                           f"domains.load_mixed)")
        out.append(cls.parse_record(_unwrap(row, where), where))
    return out


def load_mixed(path: str | os.PathLike) -> dict[str, list[dict]]:
    """The records of a file mixing tasks (an OdysSim verl parquet), routed by each row's ``data_source``:
    {task: [record, ...]} in file order. A row without ``data_source``, or naming no SOUL task, is an error naming
    the row; the bare "humanual" key names no single task and is an error too."""
    rows = read_rows(path)
    if not rows:
        raise EnvError(f"SOUL record file {path} holds no records")
    out: dict[str, list[dict]] = {}
    for i, row in enumerate(rows):
        ds = _data_source(row)
        if ds is None:
            raise EnvError(f"{path}, record {i}: missing field 'data_source' (needed to route a mixed file)")
        try:
            name = canonical_task(ds.strip())
        except EnvError:
            raise EnvError(f"{path}, record {i}: field 'data_source' {ds!r} is not a SOUL task or OdysSim alias; "
                           f"tasks: {task_names()}") from None
        where = f"{path}, record {i} (task {name})"
        out.setdefault(name, []).append(task_info(name).env_class.parse_record(_unwrap(row, where), where))
    return out


def sample_path(name: str) -> pathlib.Path:
    return SAMPLES_DIR / f"{name}.jsonl"


def sample_records(name: str) -> list[dict]:
    """The task's shipped invented records."""
    return load_records(name, sample_path(name))


def make_env(name: str, record: dict, *, judge=None, partner=None, seed: int | None = None, **options) -> "SoulEnv":
    """A fresh environment of task `name` for one (already parsed) record."""
    return task_info(name).env_class(record, judge=judge, partner=partner, seed=seed, **options)


# ------------------------------------------------------------------------------------ record helpers
def aliased_field(record: dict, keys: tuple[str, ...], types, where: str):
    """The value of the first of `keys` present (not None) in `record`, type-checked; missing: an EnvError naming
    every alias."""
    for key in keys:
        if record.get(key) is not None:
            return field(record, key, types, where)
    names = " or ".join(repr(k) for k in keys)
    raise EnvError(f"{where}: missing field {names}")


def stored_prompt(record: dict, where: str, fallback: str | None = None) -> str:
    """The task prompt a record carries: ``prompt_text``; else the first message of ``conversations[0]``
    (the upstream human-sim wrapper); else, when given, the ``fallback`` field. Errors name the field."""
    text = field(record, "prompt_text", str, where, optional=True)
    if text and text.strip():
        return text.strip()
    convs = field(record, "conversations", list, where, optional=True)
    if convs:
        first = convs[0]
        msgs = first.get("messages") if isinstance(first, dict) else None
        content = msgs[0].get("content") if isinstance(msgs, list) and msgs and isinstance(msgs[0], dict) else None
        if not isinstance(content, str) or not content.strip():
            raise EnvError(f"{where}: field 'conversations' must be [{{'messages': [{{'content': <text>}}, ...]}}]")
        return content.strip()
    if fallback is not None:
        text = field(record, fallback, str, where, optional=True)
        if text and text.strip():
            return text.strip()
    names = "'prompt_text' (or 'conversations'" + (f" or {fallback!r})" if fallback else ")")
    raise EnvError(f"{where}: missing field {names}: the record has no prompt text")


# ------------------------------------------------------------------------------------ answer parsing
_TAG_RE = {}


def first_tag(text: str | None, tag: str = "answer") -> str | None:
    """The content of the FIRST <tag>...</tag> in `text` (case-insensitive tag, DOTALL, stripped), else None: what
    OdysSim's agents read (``re.search``)."""
    m = re.search(rf"<{tag}>(.*?)</{tag}>", text or "", re.DOTALL | re.IGNORECASE)
    return m.group(1).strip() if m else None


def tagged_letter(text: str | None, letter_class: str, ignore_case: bool = True) -> str | None:
    """OdysSim's strict letter reader: the first ``<answer>\\s*X\\s*</answer>`` whose X is one character of
    `letter_class` (a regex class body, e.g. "ABCD"), upper-cased; else None. Note ``re.search`` of the whole
    pattern: a first tag that holds something else is skipped for a later one that holds a bare letter."""
    m = re.search(rf"<answer>\s*([{letter_class}])\s*</answer>", text or "", re.IGNORECASE if ignore_case else 0)
    return m.group(1).upper() if m else None


def extract_tag(text: str, tag: str = "answer") -> str | None:
    """The content of the LAST <tag>...</tag> in `text` (whitespace stripped), else None."""
    if tag not in _TAG_RE:
        _TAG_RE[tag] = re.compile(rf"<{tag}>(.*?)</{tag}>", re.DOTALL | re.IGNORECASE)
    found = _TAG_RE[tag].findall(text or "")
    return found[-1].strip() if found else None


def _letter_in(s: str, letters: Sequence[str]) -> str | None:
    """`s` is one option letter, possibly wrapped: "B", "(B)", "B.", "B)", "[B]", "**B**", "Option B", "B: text"."""
    s = s.strip().strip("*").strip()
    m = re.fullmatch(r"(?:option\s+|choice\s+)?[\(\[]?([A-Za-z])[\)\]]?(?:[\.:\)]\s*.*)?", s, re.DOTALL | re.I)
    if m and m.group(1).upper() in letters:
        return m.group(1).upper()
    return None


_ANSWER_IS_RE = re.compile(r"(?:final\s+)?answer\s*(?:is|:)?\s*[:\-]?\s*\**\s*[\(\[]?([A-Za-z])[\)\]]?(?![A-Za-z])",
                           re.IGNORECASE)
_BOXED_RE = re.compile(r"\\boxed\{\s*(?:\\text\{)?\s*\(?([A-Za-z])\)?\s*\}?\s*\}")


def parse_choice(text: str | None, letters: Sequence[str], options: dict[str, str] | None = None) -> str | None:
    """The chosen option letter of a reply, or None when no single answer can be read.

    In order: the last ``<answer>...</answer>``; the last ``\\boxed{X}``; the last "answer is X" / "Answer: (X)";
    a reply that is only a letter ("B", "(B)", "B.", "B) text"); a reply that is exactly one option's text
    (case and surrounding punctuation ignored, when `options` maps letters to texts). Letters are matched
    case-insensitively against `letters` (upper case); a letter not among them does not count.
    """
    if not text:
        return None
    letters = [x.upper() for x in letters]
    tagged = extract_tag(text)
    if tagged is not None:
        got = _letter_in(tagged, letters)
        if got is None and options:
            got = _option_text(tagged, options)
        return got
    boxed = [m.upper() for m in _BOXED_RE.findall(text) if m.upper() in letters]
    if boxed:
        return boxed[-1]
    said = [m.upper() for m in _ANSWER_IS_RE.findall(text) if m.upper() in letters]
    if said:
        return said[-1]
    got = _letter_in(text, letters)
    if got is None and options:
        got = _option_text(text, options)
    return got


def _norm(s: str) -> str:
    s = s.lower().strip()
    s = s.translate(str.maketrans("", "", string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def _option_text(text: str, options: dict[str, str]) -> str | None:
    t = _norm(text)
    hits = [k.upper() for k, v in options.items() if _norm(str(v)) == t]
    return hits[0] if len(hits) == 1 else None


def normalize_answer(s: str) -> str:
    """Lower case, punctuation and articles removed, whitespace collapsed: what exact-answer scoring compares."""
    return _norm(s)


def parse_exact(text: str | None) -> str | None:
    """A free-form answer: the last ``<answer>`` content, else the text after the last "Answer:", else None."""
    if not text:
        return None
    tagged = extract_tag(text)
    if tagged is not None:
        return tagged or None
    m = list(re.finditer(r"answer\s*:\s*(.+)", text, re.IGNORECASE))
    if m:
        return m[-1].group(1).strip() or None
    return None


def parse_score(text: str, lo: float, hi: float, key: str = "score") -> float:
    """A judge's score in [lo, hi]: JSON {key: x} (prose and fences around it tolerated), else "key: x";
    ValueError when there is none or it is out of range."""
    value = None
    try:
        obj = parse_json_object(text)
        if key in obj:
            value = obj[key]
    except ValueError:
        pass
    if value is None:
        m = re.findall(rf"{re.escape(key)}\**\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)", text or "", re.IGNORECASE)
        if m:
            value = m[-1]
    if value is None:
        raise ValueError(f"no {key!r} in the judge's answer {str(text)[:200]!r}")
    if isinstance(value, bool):
        raise ValueError(f"judge {key!r} must be a number, got {value!r}")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"judge {key!r} must be a number, got {value!r}") from None
    if not lo <= v <= hi:
        raise ValueError(f"judge {key!r} {v} is outside [{lo}, {hi}]")
    return v


def parse_dimensions(text: str, ranges: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Every dimension's score from a judge's JSON answer, ``{dim: {"score": x, ...}}`` or ``{dim: x}``;
    ValueError when one is missing, not a number or outside its [lo, hi]. (Shared by the multi-dimension judges.)"""
    obj = parse_json_object(text)
    out = {}
    for dim, (lo, hi) in ranges.items():
        if dim not in obj:
            raise ValueError(f"the judge's answer has no {dim!r}")
        value = obj[dim].get("score") if isinstance(obj[dim], dict) else obj[dim]
        if isinstance(value, bool) or value is None:
            raise ValueError(f"{dim!r} score must be a number, got {value!r}")
        try:
            v = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{dim!r} score must be a number, got {value!r}") from None
        if not lo <= v <= hi:
            raise ValueError(f"{dim!r} score {v} is outside [{lo}, {hi}]")
        out[dim] = v
    return out


# ------------------------------------------------------------------------------------ the base env
class SoulEnv(SimEnv):
    """One SOUL task episode for one record. Class attributes a task sets:

    name, family ("choice" | "judge"), multi_turn, protocol, reward_doc, record_format, real_format (see TaskInfo);
    fields: ((key, types, optional), ...) checked by the default `parse_record`;
    prompt_file: the prompts/<file>.toml stem (default: name); max_policy_turns (multi-turn tasks).
    Subclasses implement `initial_messages()` and the family's hooks.
    """

    name: str = ""
    family: str = ""
    protocol: str = ""
    reward_doc: str = ""
    record_format: str = ""
    real_format: bool = True
    fields: tuple = ()
    prompt_file: str | None = None
    policy_role = "assistant"
    thinking = True

    def __init__(self, record: dict, *, judge=None, partner=None, seed: int | None = None,
                 max_turns: int | None = None, judge_temperature: float | None = 0.0,
                 judge_max_tokens: int | None = None, partner_temperature: float | None = None,
                 partner_max_tokens: int | None = None, lenient: bool = False):
        self.record, self.judge, self.partner, self.seed = record, judge, partner, seed
        if not isinstance(lenient, bool):
            raise EnvError(f"SOUL task {self.name!r}: lenient must be true or false, got {lenient!r}")
        self.lenient = lenient
        if max_turns is not None:
            if not isinstance(max_turns, int) or max_turns < 1:
                raise EnvError(f"SOUL task {self.name!r}: max_turns must be a positive integer, got {max_turns!r}")
            self.max_policy_turns = max_turns
        self.judge_temperature, self.judge_max_tokens = judge_temperature, judge_max_tokens
        self.partner_temperature, self.partner_max_tokens = partner_temperature, partner_max_tokens
        self.view: list[Message] = []
        self.replies: list[str | None] = []

    # -------------------------------------------------------------- records and prompts
    @classmethod
    def parse_record(cls, record: dict, where: str) -> dict:
        """Checks `fields`; returns the record (subclasses may normalise further)."""
        for key, types, optional in cls.fields:
            field(record, key, types, where, optional=optional)
        return record

    def prompt(self, key: str, **values) -> str:
        stem = self.prompt_file or self.name
        table = load_templates(PROMPTS_DIR / f"{stem}.toml")
        if key not in table:
            raise EnvError(f"prompt file {PROMPTS_DIR / (stem + '.toml')}: no template {key!r}")
        return fill(table[key], f"{stem}.toml:{key}", **values)

    # -------------------------------------------------------------- protocol
    def initial_messages(self) -> list[Message]:
        raise NotImplementedError

    def reset(self, seed: int | None = None) -> list[Message]:
        self.view = list(self.initial_messages())
        self.replies = []
        return list(self.view)

    def transcript(self) -> list[Message]:
        return list(self.view)

    # -------------------------------------------------------------- fixed sides
    def ask_judge(self, messages: list[Message], parse: Callable[[str], Any]):
        """The judge's parsed answer; an unparseable answer is asked again once, then INVALID."""
        msgs = list(messages)
        kwargs = dict(temperature=self.judge_temperature, max_tokens=self.judge_max_tokens)
        first = call_model(self.judge, msgs, "judge", **kwargs).text
        try:
            return parse(first)
        except ValueError as e:
            retry = msgs + [{"role": "assistant", "content": first},
                            {"role": "user", "content": f"Your answer could not be read ({e}). Answer again in "
                                                        f"exactly the format asked for."}]
            second = call_model(self.judge, retry, "judge", **kwargs).text
            try:
                return parse(second)
            except ValueError as e2:
                raise InvalidEpisode(f"SOUL task {self.name!r}: judge answer unparseable twice: {e2}") from None

    def ask_partner(self, messages: list[Message]) -> str:
        """The fixed interlocutor's reply (multi-turn tasks); failure or an empty reply is INVALID."""
        resp = call_model(self.partner, messages, "partner", temperature=self.partner_temperature,
                          max_tokens=self.partner_max_tokens)
        _, text = split_thought(resp.text)
        if not text:
            raise InvalidEpisode(f"SOUL task {self.name!r}: the partner model gave an empty reply")
        return text


class ChoiceEnv(SoulEnv):
    """Accuracy-scored tasks: one question, one answer, reward 1.0 when the parsed answer is right else 0.0.

    Reading the answer: by default each task reads the reply exactly as its OdysSim agent does
    (`strict_extract`): for the letter tasks the FIRST ``<answer>X</answer>`` holding one letter of
    `answer_letters` (``re.search``; case-insensitive unless `answer_ignore_case` is False); an untagged answer,
    ``(B)``, ``B. text``, bare option text or ``Option B`` inside the tag scores 0, as there -- format compliance
    is part of r_d. ``lenient=True`` (an env option) selects the forgiving reader
    (`parse_choice` / `parse_exact`: the LAST tag, boxed / "answer is X" / bare-letter / option-text fallbacks);
    it changes the training signal and is off by default.

    Hooks: `initial_messages()`, `letters()` (the option letters; empty for exact-answer tasks), `options()`
    (letter -> text, optional), `gold()` (the right letter, or the right answer text), `strict_extract(utterance)`,
    `is_correct(predicted)`."""

    family = "choice"
    multi_turn = False
    max_policy_turns = 1
    answer_letters = "ABCD"    # the regex class OdysSim's tag pattern reads
    answer_ignore_case = True

    def letters(self) -> list[str]:
        return sorted(self.options())

    def options(self) -> dict[str, str]:
        return {}

    def gold(self) -> str:
        raise NotImplementedError

    def strict_extract(self, utterance: str) -> str | None:
        return tagged_letter(utterance, self.answer_letters, self.answer_ignore_case)

    def extract(self, utterance: str) -> str | None:
        if not self.lenient:
            return self.strict_extract(utterance)
        letters = self.letters()
        if letters:
            return parse_choice(utterance, letters, self.options() or None)
        return parse_exact(utterance)

    def is_correct(self, predicted: str) -> bool:
        if self.letters():
            return predicted.upper() == str(self.gold()).upper()
        return normalize_answer(predicted) == normalize_answer(str(self.gold()))

    def step(self, thought: str | None, utterance: str | None) -> SimTurn:
        self.replies.append(utterance)
        predicted = self.extract(utterance) if utterance else None
        letters = self.letters()
        if predicted is not None and letters and predicted.upper() not in letters:
            predicted = None  # a letter that is not offered is no answer (the reward is 0 either way, as OdysSim)
        correct = predicted is not None and self.is_correct(predicted)
        return SimTurn(done=True, reward=1.0 if correct else 0.0,
                       info={"predicted": predicted, "gold": self.gold(), "correct": correct,
                             "parsed": predicted is not None, "end": "answered"})


class JudgeEnv(SoulEnv):
    """Judge-scored generation tasks. Single-turn: the reply is judged. Multi-turn: after each policy turn the
    fixed partner answers (`partner_messages()` builds its view), until `max_policy_turns` or `partner_ends(text)`;
    then the judge scores the whole dialogue.

    Hooks: `initial_messages()`, `judge_messages()` (rubric + what to judge; the replies are in `self.replies`
    and the dialogue in `self.view`), `score_range` (lo, hi) of the judge's scale, `score_key`; multi-turn tasks
    also `partner_messages()` and optionally `partner_ends(text)`. reward = (score - lo) / (hi - lo)."""

    family = "judge"
    multi_turn = False
    max_policy_turns = 1
    score_range: tuple[float, float] = (1.0, 10.0)
    score_key = "score"

    def judge_messages(self) -> list[Message]:
        raise NotImplementedError

    def partner_messages(self) -> list[Message]:
        raise NotImplementedError

    def partner_ends(self, text: str) -> bool:
        return False

    def judge_reward(self) -> tuple[float, float]:
        lo, hi = self.score_range
        raw = self.ask_judge(self.judge_messages(), lambda t: parse_score(t, lo, hi, self.score_key))
        return (raw - lo) / (hi - lo), raw

    def _finish(self, end: str) -> SimTurn:
        reward, raw = self.judge_reward()
        return SimTurn(done=True, reward=reward, info={"judge_score": raw, "end": end,
                                                       "policy_turns": len(self.replies)})

    def _take_reply(self, utterance: str | None, blank_ends: bool = False) -> SimTurn | None:
        """Records the policy's reply and shows it in the dialogue; returns the episode's last turn instead when
        there is no reply (None, or a blank one when `blank_ends`: judged as "empty_reply")."""
        self.replies.append(utterance)
        if utterance is None:
            return SimTurn(done=True, reward=0.0, info={"end": "no_utterance", "policy_turns": len(self.replies)})
        if blank_ends and not utterance.strip():
            return self._finish("empty_reply")
        self.view.append({"role": "assistant", "content": utterance})
        return None

    def step(self, thought: str | None, utterance: str | None) -> SimTurn:
        if (last := self._take_reply(utterance)) is not None:
            return last
        if not self.multi_turn or len(self.replies) >= self.max_policy_turns:
            return self._finish("judged")
        reply = self.ask_partner(self.partner_messages())
        if self.partner_ends(reply):
            self.view.append({"role": "user", "content": reply})
            return self._finish("partner_ended")
        msg = {"role": "user", "content": reply}
        self.view.append(msg)
        return SimTurn(done=False, messages=[msg])

    def finish(self, reason: str) -> SimTurn:
        if not self.replies or self.replies[-1] is None:
            return SimTurn(done=True, reward=0.0, info={"end": reason, "policy_turns": len(self.replies)})
        return self._finish(reason)
