"""TravelGym (UserRL; docs/reference/environments.md, "The gyms"): plan a trip for a traveller whose preferences are hidden.

A task is one scenario of UserRL's data files `travelgym_data_<n>.json` (n = the sorted per-aspect preference
counts, e.g. 22, 33, 233). Each file is an object {scenario id: record}; the id (= the task's `create_kwargs.id`,
e.g. `flight:3-151|hotel:2-9`) is the key. As UserRL's `task_data.load_tasks`, the eight files are read in the
order 22, 33, 44, 2222, 233, 334, 444, 333 and merged, a later file winning on a repeated key; files absent from
`data_dir` are skipped. A record: `scenario`, `initial_description`, `dimensions` (aspects among flight, hotel,
restaurant, apartment, rental_car), optional `wanted_num`, and per aspect {`preferences`: [[aspect, subcategory,
preference, implicit hint, ...]], `options`: {correct, wrong, noise: [option objects]}, `correct_ids`, `best_id`,
`arguments` (the correct search arguments)}. Preferences are numbered P1, P2, ... across aspects in order.

Rules (UserRL's `TravelEnv.step_async` + `prompt_async.async_evaluate_action`, the path its training tool and
its eval script both run):

* `[search] q` -- every search counts; every 5th (`search_failure_interval`) fails on purpose without a judge
  call ("backend issues", 0). Otherwise the judge compares q with every aspect's arguments: "True" + aspect ->
  all options of that aspect (shuffled, `type`/`reason` fields removed) and `search_correct_reward`, but 0 with
  a "already searched" note when that aspect was searched before; "False" or "N/A" -> advice, 0. A "True" for an
  aspect the task does not have -> the backend-issues answer, 0 (as UserRL's failed assert).
* `[action] m` -- the classifier labels m: 1 normal, 2 asks concretely about a held (not yet revealed)
  preference (+ its id), 3 asks about a preference the traveller lacks, 4 too vague. Type 2 -> the user hints at
  that preference implicitly, it counts as elicited, `preference_correct_reward`, the off-topic counter resets.
  Otherwise, when the off-topic counter has reached `elicitation_interval` (3) and preferences remain -> the user
  volunteers a random remaining preference (counted as elicited, reward 0), the counter resets. Else the counter
  grows by 1 and: type 3 / 4 -> a fixed reply, type 1 -> the user's neutral reply. All rewards but type 2 are 0.
* `[answer] ids` -- comma-separated option ids, each stripped and processed in turn: an id not matching
  `^[ACFHR]\\d+$` -> format message, 0; with one_choice_per_aspect (True, as UserRL sets it) an id whose initial
  was already answered -> "one option per aspect" message, 0 (earlier ids of the same answer keep their effect);
  a remaining best id -> +`choice_best_reward` (1.0); a remaining correct id -> +`choice_correct_reward` (0.8);
  else -`wrong_choice_penalty` (0). Its initial is recorded and, with one_choice_per_aspect, the remaining
  preferences of that aspect are dropped (no longer classified or volunteered). Step reward = max(sum, 0).
* the episode ends (terminated) when every aspect's best id has been answered; truncated at `max_steps`
  (default 15, UserRL's `InteractTool.create(max_turns=15)`; TravelEnv's own
  config default is 20; or create_kwargs `max_turns`). `[finish]` ends it with reward 0. Every other step
  (unreadable ones too) gets `reward * reward_scale - step_penalty`, clamped to [0, 1] with normalize_rewards
  (defaults: unchanged).
* rewards: reward_variant "train" = UserRL's env_manager (preference 0.8, search 0.0; the default here), "eval" =
  its eval.py (0.6, 0.2), "gym" = TravelGymConfig's defaults (0.2, 0.2); any config value can be overridden.

UserRL's synchronous `step` differs; `userrl_path="sync"` selects it: multi-id answers are refused ("one option at
a time", 0), the answer reward is also capped at 1.0, the user volunteers once the counter reaches interval - 1
(the third off-topic turn itself), and the episode also ends once as many initials were answered as there are
aspects.

Choices where UserRL is silent, broken, or where this project's rules differ:
* UserRL's async path never delivers a volunteered preference (its reply variable is unbound there, so the user's
  canned apology is sent and nothing is elicited); we implement the documented intent on both paths.
* A classifier/judge answer that does not parse (no JSON object, an unknown type/judgement, an aspect name outside
  the five, a type-2 id not among the remaining preferences) is asked once more, then the episode is INVALID
  (UserRL falls back to "normal conversation" / "backend issues"). A user that refuses its role is INVALID too
  (UserRL sends a canned apology). Judgements may be JSON booleans as well as the strings "True"/"False".
* Options are shuffled with the env's seeded rng at reset; wrong/noise options are never truncated (UserRL's
  single-task mode loads them without its config, so its wrong_choice_number/noise_choice_number never apply).
* The user's prompts also carry the traveller's own opening (UserRL's carry only the history); the user may
  answer in plain text or a JSON object with "response" (then that field is the utterance).
* The default reward_variant is "train" (TravelGym is a training gym); evaluators pass reward_variant="eval".
* Step info: `choice`; for [answer] steps `aspect` (the first id's aspect name, None for a malformed id),
  `aspect_letter` and `answer_parts` [{id, aspect, verdict, reward}] for the evaluator's per-aspect max.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field, parse_json_object
from mimesis_jax.envs.userrl.common import DATA_DIR, USERRL_TOOL_MAX_TURNS, UserRLEnv, data_file, read_json
from mimesis_jax.envs.userrl.tasks import register_gym

ASPECT_OF_LETTER = {"F": "flight", "A": "apartment", "C": "rental_car", "H": "hotel", "R": "restaurant"}
ASPECTS = tuple(ASPECT_OF_LETTER.values())
OPTION_ID_RE = re.compile(r"^[ACFHR]\d+$")
# UserRL's load order (task_data.load_tasks); a later file wins on a repeated scenario id
DATA_FILES = tuple(f"travelgym_data_{n}.json" for n in ("22", "33", "44", "2222", "233", "334", "444", "333"))
REWARD_VARIANTS = {
    "train": {"preference_correct_reward": 0.8, "search_correct_reward": 0.0},  # verl/tools/env_manager.py
    "eval": {"preference_correct_reward": 0.6, "search_correct_reward": 0.2},  # eval/eval.py
    "gym": {"preference_correct_reward": 0.2, "search_correct_reward": 0.2},  # TravelGymConfig defaults
}
DEFAULTS: dict[str, Any] = {
    "choice_best_reward": 1.0, "choice_correct_reward": 0.8, "wrong_choice_penalty": 0.0,
    "search_failure_interval": 5, "elicitation_interval": 3, "one_choice_per_aspect": True,
    "reward_scale": 1.0, "step_penalty": 0.0, "normalize_rewards": False,
}
ACTION_TYPES = {"1": "normal", "2": "asks_held_preference", "3": "asks_missing_preference", "4": "too_vague"}

SEARCH_DOWN = "The search service is unavailable at the moment; send the search again a little later."
_REVISE = ("Rework it: match what the traveller needs, send a single request, and give all of the correct search "
           "arguments and nothing else.")
SEARCH_WRONG = "This search request is faulty, or some of its arguments are off. " + _REVISE
SEARCH_NA = "This search request is well formed, but no search this trip needs looks like it. " + _REVISE
SEARCH_OK = "Search accepted: the arguments are right."
SEARCH_REPEAT = ("Search accepted, but the <{aspect}> options already came back from an earlier search; work with "
                 "those results.")
SEARCH_OPTIONS = "Every <{aspect}> option found:"
ANSWER_MULTI = "You recommended several options at once. Recommend exactly one option per answer."
ANSWER_BAD_ID = "'{id}' is not a valid option ID. An ID is a capital letter and a number, such as H1, F12 or C4."
ANSWER_REPEAT = ("An option starting with '{letter}' has been recommended already, and each travel aspect takes a "
                 "single recommendation. Move on to searching, asking and recommending for the other aspects.")
VERDICT_BEST = "Excellent: the best option is among your picks!"
VERDICT_BEST_WRONG = "The best option is among your picks, but so are options that do not fit."
VERDICT_CORRECT = "Your picks include an option that fits, though not the best one."
VERDICT_CORRECT_WRONG = "Your picks include an option that fits, though not the best one, and options that do not fit."
VERDICT_NONE = "None of your picks is the best option or one that fits."
RECORDED_ONE = (" This recommendation is final: this travel aspect takes no further options. Go on with the other "
                "aspects of the trip.")
RECORDED_ANY = " This recommendation is final: leave these options out from now on. Go on with the conversation."
FINISHED = "Conversation closed: {found} of {total} preferences came to light ({ratio:.2%})."
INVALID_FORMAT = "The environment could not read this step: it must start with [action], [search] or [answer]."


# ------------------------------------------------------------------------------------------ data
def find_record(task_id: str, data_dir=None) -> tuple[pathlib.Path, Any]:
    """(file, raw record) of scenario `task_id` in UserRL's data files (UserRL's order; a later file wins)."""
    root = DATA_DIR if data_dir is None else pathlib.Path(data_dir)
    if not root.is_dir():
        raise EnvError(f"gym data folder {root} does not exist")
    found, looked = None, []
    for name in DATA_FILES:
        try:
            path = data_file(name, root)
        except EnvError:
            continue
        data = read_json(path)
        if not isinstance(data, dict):
            raise EnvError(f"{path}: expected an object of scenario id -> record, got {type(data).__name__}")
        looked.append(path.name)
        if task_id in data:
            found = (path, data[task_id])
    if not looked:
        raise EnvError(f"TravelGym: none of the data files {list(DATA_FILES)} is in {root}")
    if found is None:
        raise EnvError(f"TravelGym: task id {task_id!r} is not a scenario of {looked} in {root}")
    return found


def _ids(value, where: str, key: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and OPTION_ID_RE.match(v) for v in value):
        raise EnvError(f"{where}: field {key!r} must be a list of option ids like 'F3'")
    return list(value)


def parse_record(raw: Any, where: str) -> dict:
    """A validated scenario record; errors name the file/record (`where`) and the field."""
    out = {"scenario": field(raw, "scenario", str, where),
           "initial_description": field(raw, "initial_description", str, where),
           "dimensions": field(raw, "dimensions", list, where), "preferences": [], "options": {},
           "arguments": {}, "best": {}, "correct": {}}
    dims = out["dimensions"]
    if not dims or any(d not in ASPECTS for d in dims) or len(set(dims)) != len(dims):
        raise EnvError(f"{where}: field 'dimensions' must list distinct aspects among {list(ASPECTS)}, got {dims}")
    for dim in dims:
        block = field(raw, dim, dict, where)
        at = f"{where}, aspect {dim!r}"
        for i, pref in enumerate(field(block, "preferences", list, at)):
            if not isinstance(pref, list) or len(pref) < 4 or not all(isinstance(p, str) for p in pref[:4]):
                raise EnvError(f"{at}: field 'preferences[{i}]' must be [aspect, subcategory, preference, hint, ...]")
            out["preferences"].append({"id": f"P{len(out['preferences']) + 1}", "aspect": pref[0],
                                       "subcategory": pref[1], "preference": pref[2], "hint": pref[3]})
        options = field(block, "options", dict, at)
        shown = []
        for kind in ("correct", "wrong", "noise"):
            items = field(options, kind, list, f"{at}, field 'options'", optional=True, default=[])
            for j, opt in enumerate(items):
                if not isinstance(opt, dict):
                    raise EnvError(f"{at}: field 'options.{kind}[{j}]' must be an object")
                shown.append({k: v for k, v in opt.items() if k not in ("type", "reason")})
        out["options"][dim] = shown
        correct = _ids(field(block, "correct_ids", list, at), at, "correct_ids")
        best = field(block, "best_id", str, at)
        if best not in correct:
            raise EnvError(f"{at}: field 'best_id' ({best!r}) must be one of correct_ids {correct}")
        out["best"][dim], out["correct"][dim] = best, correct
        if "arguments" in block:
            out["arguments"][dim] = block["arguments"]
    return out


def _history_text(history: list[dict]) -> str:
    if not history:
        return "(no conversation yet)"
    blocks = []
    for h in history:
        who = {"agent": "Agent", "user": "User", "database": "Database"}.get(h["role"], h["role"].capitalize())
        text = f"{who}: {h['content']}"
        if h.get("note"):
            text += f"\n[Note: {h['note']}]"
        blocks.append(text)
    return "\n\n".join(blocks)


def _normal_aspect(name: str) -> str:
    a = name.lower().strip()
    return "rental_car" if a in ("rental car", "car rental") else a


# ------------------------------------------------------------------------------------------ the gym
@register_gym("TravelGym")
class TravelGym(UserRLEnv):
    """UserRL's TravelGym; rules and choices in the module docstring."""

    prompt_file = "travel"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # what UserRL's InteractTool passes, not the gym config's own default
    invalid_action_feedback = INVALID_FORMAT

    def __init__(self, record: dict, *, task_id: str = "", user=None, judge=None, classifier=None,
                 reward_variant: str = "train", userrl_path: str = "async", max_steps: int | None = None,
                 seed=None, temperature: float | None = 0.0, max_tokens: int | None = 2048,
                 user_thinking: bool = False, refusal_rules=None, **overrides):
        super().__init__(user=user, judge=judge, max_steps=max_steps, temperature=temperature,
                         max_tokens=max_tokens, user_thinking=user_thinking, refusal_rules=refusal_rules, seed=seed)
        if reward_variant not in REWARD_VARIANTS:
            raise EnvError(f"TravelGym: reward_variant must be one of {sorted(REWARD_VARIANTS)}, got "
                           f"{reward_variant!r}")
        if userrl_path not in ("async", "sync"):
            raise EnvError(f"TravelGym: userrl_path must be 'async' or 'sync', got {userrl_path!r}")
        cfg = {**DEFAULTS, **REWARD_VARIANTS[reward_variant]}
        unknown = sorted(set(overrides) - set(cfg))
        if unknown:
            raise EnvError(f"TravelGym: unknown options {unknown}; known: {sorted(cfg)} and reward_variant, "
                           "userrl_path, classifier, temperature, max_tokens, user_thinking, refusal_rules")
        cfg.update(overrides)
        for key in ("search_failure_interval", "elicitation_interval"):
            if isinstance(cfg[key], bool) or not isinstance(cfg[key], int) or cfg[key] < 1:
                raise EnvError(f"TravelGym: {key} must be an integer >= 1, got {cfg[key]!r}")
        self.cfg, self.record, self.task_id, self.path = cfg, record, task_id, userrl_path
        self.reward_variant = reward_variant
        self.classifier = classifier if classifier is not None else judge

    # -------------------------------------------------------------- construction
    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "TravelGym":
        path, raw = find_record(task.id, data_dir)
        record = parse_record(raw, f"{path}, record {task.id!r}")
        if max_steps is None and task.create_kwargs.get("max_turns") is not None:
            max_steps = int(task.create_kwargs["max_turns"])
        return cls(record, task_id=task.id, user=user, judge=judge, seed=seed, max_steps=max_steps, **options)

    def _reset(self):
        rec = self.record
        self.options = {d: [dict(o) for o in opts] for d, opts in rec["options"].items()}
        for opts in self.options.values():
            self.rng.shuffle(opts)
        self.remaining_prefs = [dict(p) for p in rec["preferences"]]
        self.elicited: list[dict] = []
        self.history: list[dict] = []
        self.search_times = self.off_topic = 0
        self.unsearched = list(rec["dimensions"])
        self.remaining_best = [rec["best"][d] for d in rec["dimensions"]]
        self.remaining_correct = [i for d in rec["dimensions"] for i in rec["correct"][d]]
        self.choice_initials: list[str] = []
        self.active_elicited = self.passive_elicited = 0
        return rec["initial_description"], {"task_id": self.task_id, "dimensions": list(rec["dimensions"]),
                                            "n_aspects": len(rec["dimensions"]),
                                            "n_preferences": len(self.remaining_prefs)}

    # -------------------------------------------------------------- protocol
    def step(self, action_text: str):
        if str(action_text).strip().lower().startswith("[finish]"):
            if self.done:
                raise EnvError(f"{self.name}: the episode has ended; call reset() first")
            self.step_count += 1
            self.clear_user_turn()
            total = len(self.elicited) + len(self.remaining_prefs)
            ratio = len(self.elicited) / total if total else 0.0
            feedback = FINISHED.format(found=len(self.elicited), total=total, ratio=ratio)
            return self._finish(feedback, 0.0, True, {"choice": "finish"})
        return super().step(action_text)

    def _finish(self, feedback: str, reward: float, terminated: bool, info: dict):
        """Every step but [finish] (malformed ones too, as UserRL's env sees them): the reward scaled as UserRL's
        step does, and the termination check it makes after every step."""
        if info.get("choice") != "finish":
            reward = reward * self.cfg["reward_scale"] - self.cfg["step_penalty"]
            if self.cfg["normalize_rewards"]:
                reward = max(0.0, min(1.0, reward))
            terminated = terminated or not self.remaining_best
            if (self.path == "sync" and self.cfg["one_choice_per_aspect"]
                    and len(self.record["dimensions"]) == len(self.choice_initials)):
                terminated = True
            info = {"task_id": self.task_id, "n_aspects": len(self.record["dimensions"]),
                    "remaining_preferences": len(self.remaining_prefs), "elicited_preferences": len(self.elicited),
                    **info}
        return super()._finish(feedback, reward, terminated, info)

    @staticmethod
    def _out(feedback: str, reward: float, info: dict):
        return feedback, reward, False, info

    # -------------------------------------------------------------- [search]
    def _search(self, content: str):
        self.search_times += 1
        if self.search_times % self.cfg["search_failure_interval"] == 0:
            return self._search_reply(content, SEARCH_DOWN, None, 0.0, "failed_on_purpose", None)
        args = "\n\n".join(f"Aspect: {d}\n{json.dumps(a, indent=4, ensure_ascii=False)}"
                           for d, a in self.record["arguments"].items())
        messages = [{"role": "system", "content": self.prompt("search_system")},
                    {"role": "user", "content": self.prompt("search_user", request=content, arguments=args)}]
        verdict, aspect = self.ask_parsed(self.judge, messages, self._parse_search, role="judge")
        if verdict == "False":
            return self._search_reply(content, SEARCH_WRONG, None, 0.0, "wrong", None)
        if verdict == "N/A":
            return self._search_reply(content, SEARCH_NA, None, 0.0, "not_applicable", None)
        if aspect not in self.record["dimensions"]:
            return self._search_reply(content, SEARCH_DOWN, None, 0.0, "aspect_not_in_task", aspect)
        if aspect not in self.unsearched:
            text = SEARCH_REPEAT.format(aspect=aspect)
            return self._search_reply(content, text, None, 0.0, "repeated", aspect)
        self.unsearched.remove(aspect)
        lines = [json.dumps(o, ensure_ascii=False) for o in self.options[aspect]]
        feedback = (f"{SEARCH_OK}\n\n{self.prompt('schema_' + aspect).strip()}\n\n"
                    f"{SEARCH_OPTIONS.format(aspect=aspect)}\n" + "\n".join(lines)).strip()
        return self._search_reply(content, feedback, f"{SEARCH_OK} ... (option list omitted) ...",
                                  self.cfg["search_correct_reward"], "correct", aspect)

    def _search_reply(self, content, feedback, logged, reward, outcome, aspect):
        self.history.append({"role": "agent", "content": content})
        self.history.append({"role": "database", "content": feedback if logged is None else logged})
        return self._out(feedback, reward, {"choice": "search", "search_outcome": outcome, "search_aspect": aspect,
                                            "search_count": self.search_times})

    @staticmethod
    def _parse_search(text: str) -> tuple[str, str | None]:
        obj = parse_json_object(text)
        raw = obj.get("alignment_judgement")
        verdict = {"true": "True", "false": "False", "n/a": "N/A"}.get(
            str(raw).strip().lower() if isinstance(raw, (str, bool)) else "")
        if verdict is None:
            raise ValueError(f"alignment_judgement must be True, False or N/A, got {raw!r}")
        if verdict != "True":
            return verdict, None
        aspect = obj.get("alignment_aspect")
        if not isinstance(aspect, str) or _normal_aspect(aspect) not in ASPECTS:
            raise ValueError(f"alignment_aspect must be one of {list(ASPECTS)}, got {aspect!r}")
        return verdict, _normal_aspect(aspect)

    # -------------------------------------------------------------- [action]
    def _action(self, content: str):
        prefs = "\n\n".join(f"Preference ID: {p['id']}\tAspect: {p['aspect']}\nPreference: {p['preference']}"
                            for p in self.remaining_prefs) or "(none left)"
        messages = [{"role": "system", "content": self.prompt("classify_system")},
                    {"role": "user", "content": self.prompt(
                        "classify_user", scenario=self.record["scenario"], history=_history_text(self.history),
                        utterance=content, preferences=prefs)}]
        kind, pref_id = self.ask_parsed(self.classifier, messages, self._parse_kind, role="classifier")
        info = {"choice": "action", "action_type": ACTION_TYPES[kind], "preference_id": pref_id, "elicited": [],
                "volunteered": False}
        reward = self.cfg["preference_correct_reward"] if kind == "2" else 0.0
        threshold = self.cfg["elicitation_interval"] - (1 if self.path == "sync" else 0)
        if kind == "2":
            self.off_topic = 0
            self.active_elicited += 1
            pref = next(p for p in self.remaining_prefs if p["id"] == pref_id)
            reply = self._user_reply("reveal", content, pref)
            note = self.prompt("note_held", preference_id=pref_id)
        elif self.off_topic >= threshold and self.remaining_prefs:
            self.off_topic = 0
            self.passive_elicited += 1
            pref = self.rng.choice(self.remaining_prefs)
            reply = self._user_reply("volunteer", content, pref)
            note = self.prompt("note_volunteer")
            info["volunteered"] = True
        else:
            self.off_topic += 1
            pref = None
            if kind == "3":
                reply, note = self.prompt("reply_no_such_preference"), self.prompt("note_missing")
            elif kind == "4":
                reply, note = self.prompt("reply_too_vague"), self.prompt("note_vague")
            else:
                reply, note = self._user_reply("natural", content, None), self.prompt("note_normal")
        if pref is not None:
            self.remaining_prefs = [p for p in self.remaining_prefs if p["id"] != pref["id"]]
            self.elicited.append(pref)
            info["elicited"] = [pref["id"]]
        self.history.append({"role": "agent", "content": content, "note": note})
        self.history.append({"role": "user", "content": reply})
        info["off_topic_count"] = self.off_topic
        return self._out(reply, reward, info)

    def _parse_kind(self, text: str) -> tuple[str, str | None]:
        obj = parse_json_object(text)
        kind = str(obj.get("type", "")).strip()
        if kind not in ACTION_TYPES:
            raise ValueError(f"type must be one of 1, 2, 3, 4, got {obj.get('type')!r}")
        if kind != "2":
            return kind, None
        pid = obj.get("preference_id")
        held = [p["id"] for p in self.remaining_prefs]
        if not isinstance(pid, str) or pid.strip() not in held:
            raise ValueError(f"type 2 needs a preference_id among {held}, got {pid!r}")
        return kind, pid.strip()

    def _user_reply(self, mode: str, content: str, pref: dict | None) -> str:
        values = {"history": _history_text(self.history), "utterance": content}
        if pref is not None:
            values["preference"] = (f"Preference ID: {pref['id']}\tAspect: {pref['aspect']}\n"
                                    f"Preference: {pref['preference']}\nHow to hint at it: {pref['hint']}")
        messages = [{"role": "system", "content": self.prompt(f"{mode}_system",
                                                              trip=self.record["initial_description"])},
                    {"role": "user", "content": self.prompt(f"{mode}_user", **values)}]
        utterance = self.ask_user(messages)
        if utterance.lstrip().startswith(("{", "```")):  # a user answering in UserRL's {"thought", "response"}
            try:
                obj = parse_json_object(utterance)
            except ValueError:
                obj = {}
            said = obj.get("response")
            if isinstance(said, str) and said.strip():
                thought = self.user_turn.get("user_thought")
                if thought is None and isinstance(obj.get("thought"), str):
                    thought = obj["thought"].strip()
                utterance = said.strip()
                self.set_user_turn(thought, utterance)
        return utterance

    # -------------------------------------------------------------- [answer]
    def _answer(self, content: str):
        ids = [s.strip() for s in content.split(",")]
        info: dict[str, Any] = {"choice": "answer", "aspect": None, "aspect_letter": None, "answer_parts": []}
        first = ids[0]
        if OPTION_ID_RE.match(first):
            info.update(aspect=ASPECT_OF_LETTER[first[0]], aspect_letter=first[0])
        if self.path == "sync" and len(ids) > 1:
            return self._out(ANSWER_MULTI, 0.0, {**info, "answer_outcome": "several_ids"})
        one = self.cfg["one_choice_per_aspect"]
        reward, best_found, correct_found, wrong_found = 0.0, False, False, False
        for oid in ids:
            if not OPTION_ID_RE.match(oid):
                return self._out(ANSWER_BAD_ID.format(id=oid), 0.0, {**info, "answer_outcome": "bad_id"})
            letter = oid[0]
            if one and letter in self.choice_initials:
                text = ANSWER_REPEAT.format(letter=letter)
                return self._out(text, 0.0, {**info, "answer_outcome": "aspect_already_answered"})
            if oid in self.remaining_best:
                part, verdict, best_found = self.cfg["choice_best_reward"], "best", True
                self.remaining_best.remove(oid)
                self.remaining_correct.remove(oid)
            elif oid in self.remaining_correct:
                part, verdict, correct_found = self.cfg["choice_correct_reward"], "correct", True
                self.remaining_correct.remove(oid)
            else:
                part, verdict, wrong_found = -self.cfg["wrong_choice_penalty"], "wrong", True
            reward += part
            info["answer_parts"].append({"id": oid, "aspect": ASPECT_OF_LETTER[letter], "verdict": verdict,
                                         "reward": part})
            if letter not in self.choice_initials:
                self.choice_initials.append(letter)
            if one:
                self.remaining_prefs = [p for p in self.remaining_prefs if p["aspect"] != ASPECT_OF_LETTER[letter]]
        reward = max(reward, 0.0)
        if self.path == "sync":
            reward = min(reward, 1.0)
        if best_found:
            feedback = VERDICT_BEST_WRONG if wrong_found else VERDICT_BEST
        elif correct_found:
            feedback = VERDICT_CORRECT_WRONG if wrong_found else VERDICT_CORRECT
        else:
            feedback = VERDICT_NONE
        feedback += RECORDED_ONE if one else RECORDED_ANY
        outcome = "best" if best_found else "correct" if correct_found else "wrong"
        return self._out(feedback, reward, {**info, "answer_outcome": outcome})
