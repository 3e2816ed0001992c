"""ABCD (Action-Based Conversations Dataset, asappresearch/abcd) loaders and the identity-verification replay.

Formats (docs/reference/environments.md, ABCD section) -- all accepted as ``.json`` or gzip-compressed ``.json.gz``:

* conversations: either the release's ``{"train": [...], "dev": [...], "test": [...]}`` dict (every split's
  records are returned, each with its ``split``) or a plain list of conversations (as the public
  ``abcd_sample.json``; ``split`` is then None). Each conversation is
  ``{"convo_id", "scenario": {"personal": {...}, "order": {...}, "product": {...}, "flow", "subflow"},
  "original": [[speaker, text], ...], "delexed": [...]?}`` (every personal / order / product field optional,
  as in the release: ``PERSONAL_FIELDS`` + ``PERSONAL_OTHER_FIELDS``, ``ORDER_FIELDS``, ``PRODUCT_LIST_FIELDS``) with speaker in
  {agent, customer, action}; ``delexed`` (optional) holds one dict per turn
  ``{speaker, text, turn_count, targets, candidates}`` with ``targets = [subflow, kind, action, values, index]``.
* ``kb.json``: ``{subflow: [action name, ...]}`` -- the action sequence each subflow requires.
* ``guidelines.json``: the agent policy; any JSON object.
* ``ontology.json``: ``{"intents": {"flows": [...], "subflows": {flow: [subflow, ...]}}, "actions": {category:
  {action: [slot, ...]}}, ...}``.

Malformed input raises ``EnvError`` naming the file, the conversation (convo_id, else its index) and the field.

Identity-verification replay (docs/reference/paper.md 3.4: "the identity-verification part of the conversation is replayed")
-- the rule `identity_verification_turns` implements:

1. Each ``action`` turn gets an action name: from the aligned ``delexed`` turn's ``targets[2]`` when ``delexed``
   is present, has as many turns as ``original`` and that turn's speaker is ``action``; otherwise from its
   text (``ACTION_TEXT_PATTERNS``: "identity verification in progress" -> verify-identity, "purchase validation
   in progress" -> validate-purchase, "account has been pulled up" -> pull-up-account).
2. The verification ends at the FIRST action turn named ``verify-identity`` or ``validate-purchase``
   (``VERIFY_ACTIONS``: the customer's identity / purchase has been checked against the account).
3. Subflows that never verify (e.g. recover_password) end at the first ``pull-up-account`` turn instead.
4. Conversations with neither (FAQ and troubleshooting flows) have no identity part: the prefix is empty.

The replay is ``original[:end + 1]`` -- the turns verbatim, as (speaker, text) tuples.
"""

from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from mimesis_jax.envs.agent_env import EnvError

SPEAKERS = ("agent", "customer", "action")
SPLITS = ("train", "dev", "test")
# The release's scenario fields. None of the personal / order / product fields is present in every conversation:
# the release's own code reads a personal slot only `if slot in scene` (components/systems.py), its ontology lists
# personal slots account_id, email, phone, pin_number, username beside the name and membership level, and e.g. a
# storewide_query conversation of the public sample has personal {customer_name, member_level, phone} (no email,
# no username), an address-only order and empty product lists. So each is optional; when present it must have
# its type (a string; product.names / product.amounts lists; order.products a string or a list). Other keys are
# kept as they are. flow and subflow are required non-empty strings, personal / order / product required objects.
PERSONAL_FIELDS = ("customer_name", "email", "member_level", "phone", "username")  # the shipped sample has all
PERSONAL_OTHER_FIELDS = ("account_id", "pin_number", "zip_code")  # slots the release's ontology / README name too
ORDER_FIELDS = ("street_address", "full_address", "city", "state", "zip_code", "order_id", "num_products",
                "packaging", "payment_method", "purchase_date")
PRODUCT_LIST_FIELDS = ("names", "amounts")
SCENARIO_FIELDS = ("personal", "order", "product", "flow", "subflow")
DELEXED_FIELDS = ("speaker", "text", "turn_count", "targets", "candidates")

VERIFY_ACTIONS = ("verify-identity", "validate-purchase")
ACCOUNT_ACTION = "pull-up-account"
ACTION_TEXT_PATTERNS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"identity verification", re.I), "verify-identity"),
    (re.compile(r"purchase validation", re.I), "validate-purchase"),
    (re.compile(r"account has been pulled up", re.I), "pull-up-account"),
)


@dataclass
class Conversation:
    """One ABCD conversation. ``original`` holds (speaker, text) tuples; ``delexed`` the raw delexed dicts."""

    convo_id: Any
    scenario: dict
    original: list[tuple[str, str]]
    delexed: list[dict] | None = None
    split: str | None = None
    extra: dict = field(default_factory=dict)  # any other top-level keys of the record, kept as they were

    @property
    def flow(self) -> str:
        return self.scenario["flow"]

    @property
    def subflow(self) -> str:
        return self.scenario["subflow"]


# ------------------------------------------------------------------------------------- reading
def _read_json(path, what: str) -> Any:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise EnvError(f"ABCD {what} file {path!r} does not exist")
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as f:
                return json.load(f)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EnvError(f"ABCD {what} file {path!r} is not readable JSON: {e}") from e


def _fail(path, where: str, fld: str, msg: str) -> EnvError:
    return EnvError(f"ABCD file {os.fspath(path)!r}, {where}: field {fld!r} {msg}")


def _parse_record(rec: Any, path, index: int, split: str | None) -> Conversation:
    where0 = f"conversation #{index}" + (f" of split {split!r}" if split else "")
    if not isinstance(rec, dict):
        raise EnvError(f"ABCD file {os.fspath(path)!r}, {where0}: expected an object, got {type(rec).__name__}")
    if "convo_id" not in rec:
        raise _fail(path, where0, "convo_id", "is missing")
    cid = rec["convo_id"]
    if not isinstance(cid, (int, str)) or isinstance(cid, bool):
        raise _fail(path, where0, "convo_id", f"must be an int or a string, got {type(cid).__name__}")
    where = f"conversation convo_id={cid!r} (#{index}" + (f" of split {split!r})" if split else ")")

    sc = rec.get("scenario")
    if not isinstance(sc, dict):
        raise _fail(path, where, "scenario", "is missing or not an object")
    for k in SCENARIO_FIELDS:
        if k not in sc:
            raise _fail(path, where, f"scenario.{k}", "is missing")
    for k in ("flow", "subflow"):
        if not isinstance(sc[k], str) or not sc[k]:
            raise _fail(path, where, f"scenario.{k}", "must be a non-empty string")
    for k in ("personal", "order", "product"):
        if not isinstance(sc[k], dict):
            raise _fail(path, where, f"scenario.{k}", "must be an object")
    for part, names in (("personal", PERSONAL_FIELDS + PERSONAL_OTHER_FIELDS), ("order", ORDER_FIELDS)):
        for k in names:  # optional: checked only when present
            if k in sc[part] and not isinstance(sc[part][k], str):
                raise _fail(path, where, f"scenario.{part}.{k}",
                            f"must be a string when present, got {type(sc[part][k]).__name__}")
    if "products" in sc["order"] and not isinstance(sc["order"]["products"], (str, list)):
        raise _fail(path, where, "scenario.order.products", "must be a string or a list when present")
    for k in PRODUCT_LIST_FIELDS:
        if k in sc["product"] and not isinstance(sc["product"][k], list):
            raise _fail(path, where, f"scenario.product.{k}", "must be a list when present")

    orig = rec.get("original")
    if not isinstance(orig, list):
        raise _fail(path, where, "original", "is missing or not a list")
    turns: list[tuple[str, str]] = []
    for t, turn in enumerate(orig):
        if not isinstance(turn, (list, tuple)) or len(turn) != 2:
            raise _fail(path, where, f"original[{t}]", "must be a [speaker, text] pair")
        spk, text = turn
        if spk not in SPEAKERS:
            raise _fail(path, where, f"original[{t}].speaker", f"must be one of {SPEAKERS}, got {spk!r}")
        if not isinstance(text, str):
            raise _fail(path, where, f"original[{t}].text", "must be a string")
        turns.append((spk, text))

    delexed = rec.get("delexed")
    if delexed is not None:
        if not isinstance(delexed, list):
            raise _fail(path, where, "delexed", "must be a list")
        for t, d in enumerate(delexed):
            if not isinstance(d, dict):
                raise _fail(path, where, f"delexed[{t}]", "must be an object")
            for k in DELEXED_FIELDS:
                if k not in d:
                    raise _fail(path, where, f"delexed[{t}].{k}", "is missing")
            if d["speaker"] not in SPEAKERS:
                raise _fail(path, where, f"delexed[{t}].speaker", f"must be one of {SPEAKERS}")
            if not isinstance(d["text"], str):
                raise _fail(path, where, f"delexed[{t}].text", "must be a string")
            if not isinstance(d["targets"], list) or len(d["targets"]) != 5:
                raise _fail(path, where, f"delexed[{t}].targets",
                            "must be a list [subflow, kind, action, values, index]")
            if not isinstance(d["candidates"], list):
                raise _fail(path, where, f"delexed[{t}].candidates", "must be a list")
    extra = {k: v for k, v in rec.items() if k not in ("convo_id", "scenario", "original", "delexed")}
    return Conversation(convo_id=cid, scenario=sc, original=turns, delexed=delexed, split=split, extra=extra)


def load_conversations(path) -> list[Conversation]:
    """All conversations of an ABCD file (.json / .json.gz): the release's split dict or a plain list."""
    data = _read_json(path, "conversations")
    out: list[Conversation] = []
    if isinstance(data, list):
        for i, rec in enumerate(data):
            out.append(_parse_record(rec, path, i, None))
    elif isinstance(data, dict):
        unknown = [k for k in data if k not in SPLITS]
        if unknown or not data:
            raise EnvError(f"ABCD file {os.fspath(path)!r}: expected a list of conversations or a dict with splits "
                           f"{SPLITS}; unknown key(s) {unknown}" if unknown else
                           f"ABCD file {os.fspath(path)!r}: the split dict is empty")
        for split in SPLITS:
            if split not in data:
                continue
            if not isinstance(data[split], list):
                raise EnvError(f"ABCD file {os.fspath(path)!r}: split {split!r} must be a list of conversations")
            for i, rec in enumerate(data[split]):
                out.append(_parse_record(rec, path, i, split))
    else:
        raise EnvError(f"ABCD file {os.fspath(path)!r}: expected a list of conversations or a dict of splits, "
                       f"got {type(data).__name__}")
    return out


def load_kb(path) -> dict[str, list[str]]:
    """kb.json: {subflow: [required action names in order]}."""
    data = _read_json(path, "kb")
    if not isinstance(data, dict):
        raise EnvError(f"ABCD kb file {os.fspath(path)!r}: expected an object {{subflow: [actions]}}")
    for sub, acts in data.items():
        if not isinstance(acts, list) or not all(isinstance(a, str) for a in acts):
            raise EnvError(f"ABCD kb file {os.fspath(path)!r}: subflow {sub!r} must map to a list of action names")
    return data


def load_guidelines(path) -> dict:
    """guidelines.json: the agent policy, any JSON object."""
    data = _read_json(path, "guidelines")
    if not isinstance(data, dict):
        raise EnvError(f"ABCD guidelines file {os.fspath(path)!r}: expected a JSON object, "
                       f"got {type(data).__name__}")
    return data


def load_ontology(path) -> dict:
    """ontology.json: intents.flows, intents.subflows {flow: [subflow]}, actions {category: {action: [slots]}}."""
    data = _read_json(path, "ontology")
    p = os.fspath(path)
    if not isinstance(data, dict):
        raise EnvError(f"ABCD ontology file {p!r}: expected a JSON object")
    intents = data.get("intents")
    if not isinstance(intents, dict):
        raise EnvError(f"ABCD ontology file {p!r}: field 'intents' is missing or not an object")
    flows = intents.get("flows")
    if not isinstance(flows, list) or not all(isinstance(f, str) for f in flows):
        raise EnvError(f"ABCD ontology file {p!r}: field 'intents.flows' must be a list of strings")
    subs = intents.get("subflows")
    if not isinstance(subs, dict):
        raise EnvError(f"ABCD ontology file {p!r}: field 'intents.subflows' must be an object")
    for fl, sl in subs.items():
        if fl not in flows:
            raise EnvError(f"ABCD ontology file {p!r}: field 'intents.subflows.{fl}' names a flow not in "
                           f"intents.flows")
        if not isinstance(sl, list) or not all(isinstance(s, str) for s in sl):
            raise EnvError(f"ABCD ontology file {p!r}: field 'intents.subflows.{fl}' must be a list of strings")
    actions = data.get("actions")
    if not isinstance(actions, dict):
        raise EnvError(f"ABCD ontology file {p!r}: field 'actions' is missing or not an object")
    for cat, acts in actions.items():
        if not isinstance(acts, dict):
            raise EnvError(f"ABCD ontology file {p!r}: field 'actions.{cat}' must be an object {{action: [slots]}}")
    return data


# ------------------------------------------------------------------------------------- identity replay
def action_name(record: Conversation, index: int) -> str | None:
    """The action name of ``record.original[index]`` (None for non-action turns or unknown actions)."""
    spk, text = record.original[index]
    if spk != "action":
        return None
    d = record.delexed
    if d is not None and len(d) == len(record.original) and d[index].get("speaker") == "action":
        name = d[index]["targets"][2]
        if isinstance(name, str) and name:
            return name
    for pat, name in ACTION_TEXT_PATTERNS:
        if pat.search(text):
            return name
    return None


def identity_verification_end(record: Conversation) -> int:
    """Index of the last turn of the identity-verification part, or -1 if there is none (module docstring)."""
    first_account = -1
    for i in range(len(record.original)):
        name = action_name(record, i)
        if name in VERIFY_ACTIONS:
            return i
        if name == ACCOUNT_ACTION and first_account < 0:
            first_account = i
    return first_account


def identity_verification_turns(record: Conversation) -> list[tuple[str, str]]:
    """The verbatim prefix of ``record.original`` up to and including the end of identity verification."""
    return list(record.original[: identity_verification_end(record) + 1])


DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
SAMPLE_PATH = os.path.join(DATA_DIR, "abcd_sample.json")
KB_PATH = os.path.join(DATA_DIR, "kb.json")
GUIDELINES_PATH = os.path.join(DATA_DIR, "guidelines.json")
ONTOLOGY_PATH = os.path.join(DATA_DIR, "ontology.json")
