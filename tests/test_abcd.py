"""ABCD loaders, identity-verification replay, behaviour cards, Eq 12-13 reward, meta-narration, assignment."""

import gzip
import json
import random

import numpy as np
import pytest

from mimesis_jax.envs.abcd import behaviour
from mimesis_jax.envs.abcd import dataset as abcd
from mimesis_jax.envs.agent_env import EnvError


def _sample_raw():
    with open(abcd.SAMPLE_PATH) as f:
        return json.load(f)


def _record(cid=42, subflow="manage_change_name"):
    """A record written here in the published schema (invented values)."""
    turns = [
        ["agent", "Hello, how can I help you today?"],
        ["customer", "I need to fix the spelling of my name on the account"],
        ["agent", "Sure, what's your full name as it is now?"],
        ["customer", "Jon Qwerty"],
        ["action", "Account has been pulled up for Jon Qwerty."],
        ["agent", "And your account ID and an order ID, please?"],
        ["customer", "AB12CD34E, order 1234567890"],
        ["action", "Identity verification in progress ..."],
        ["agent", "Verified. What should the name be?"],
        ["customer", "John Qwerty"],
    ]
    kinds = {4: ("pull-up-account", ["jon qwerty"]), 7: ("verify-identity", ["jon qwerty", "AB12CD34E", "1234567890"])}
    delexed = []
    for i, (spk, text) in enumerate(turns):
        if spk == "action":
            tg = [subflow, "take_action", kinds[i][0], kinds[i][1], -1]
        elif spk == "agent":
            tg = [subflow, "retrieve_utterance", None, [], 3]
        else:
            tg = [subflow, None, None, [], -1]
        delexed.append({"speaker": spk, "text": text.lower(), "turn_count": i + 1, "targets": tg,
                        "candidates": [1, 2, 3] if spk == "agent" else []})
    return {"convo_id": cid,
            "scenario": {"personal": {"customer_name": "jon qwerty", "email": "jq@email.com", "member_level": "gold",
                                      "phone": "(555) 000-1111", "username": "jqwerty1"},
                         "order": {"order_id": "1234567890", "payment_method": "paypal", "products": "[]",
                                   "purchase_date": "2020-01-01", "full_address": "1 a st  b, ca 00000"},
                         "product": {"names": [], "amounts": []}, "flow": "manage_account", "subflow": subflow},
            "original": turns, "delexed": delexed}


# ------------------------------------------------------------------------------------- loaders
def test_shipped_sample_loads():
    convs = abcd.load_conversations(abcd.SAMPLE_PATH)
    assert 4 <= len(convs) <= 6
    raw = _sample_raw()
    for c, r in zip(convs, raw):
        assert isinstance(c, abcd.Conversation) and c.split is None
        assert c.convo_id == r["convo_id"] and c.scenario == r["scenario"]
        assert c.original == [tuple(t) for t in r["original"]]
        assert all(isinstance(t, tuple) for t in c.original)
        assert len(c.delexed) == len(c.original)
        assert set(c.scenario["personal"]) >= set(abcd.PERSONAL_FIELDS)
    kb = abcd.load_kb(abcd.KB_PATH)
    onto = abcd.load_ontology(abcd.ONTOLOGY_PATH)
    guide = abcd.load_guidelines(abcd.GUIDELINES_PATH)
    assert isinstance(guide, dict) and guide
    subflows = {s for ss in onto["intents"]["subflows"].values() for s in ss}
    actions = {a for cat in onto["actions"].values() for a in cat}
    for c in convs:
        assert c.subflow in kb and c.subflow in subflows
        for d in c.delexed:  # every action the sample takes is in the ontology and the subflow's kb sequence
            if d["speaker"] == "action":
                assert d["targets"][2] in actions and d["targets"][2] in kb[c.subflow]


def test_split_dict_gz_and_plain_list(tmp_path):
    a, b, c = _record(1), _record(2), _record(3)
    p = tmp_path / "abcd_v1.1.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"train": [a, b], "dev": [c], "test": []}, f)
    convs = abcd.load_conversations(p)
    assert [(x.convo_id, x.split) for x in convs] == [(1, "train"), (2, "train"), (3, "dev")]
    assert convs[0].original[4] == ("action", "Account has been pulled up for Jon Qwerty.")
    q = tmp_path / "plain.json"
    q.write_text(json.dumps([a, {k: v for k, v in b.items() if k != "delexed"}]))
    convs = abcd.load_conversations(q)
    assert [x.split for x in convs] == [None, None] and convs[1].delexed is None
    assert convs[0].scenario["flow"] == "manage_account"


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r["scenario"].pop("subflow"), "scenario.subflow"),
    (lambda r: r["scenario"]["personal"].__setitem__("email", 5), "scenario.personal.email"),
    (lambda r: r["scenario"].__setitem__("personal", None), "scenario.personal"),
    (lambda r: r["scenario"].pop("order"), "scenario.order"),
    (lambda r: r["scenario"]["order"].__setitem__("order_id", 1234567890), "scenario.order.order_id"),
    (lambda r: r["scenario"]["order"].__setitem__("products", 3), "scenario.order.products"),
    (lambda r: r["scenario"]["product"].__setitem__("names", "boots"), "scenario.product.names"),
    (lambda r: r["scenario"].__setitem__("flow", ""), "scenario.flow"),
    (lambda r: r["original"].__setitem__(2, ["robot", "hi"]), "original[2].speaker"),
    (lambda r: r["original"].__setitem__(3, ["customer"]), "original[3]"),
    (lambda r: r["delexed"][1].pop("targets"), "delexed[1].targets"),
    (lambda r: r.pop("original"), "original"),
])
def test_bad_records_name_file_conversation_field(tmp_path, mutate, field):
    good, bad = _record(7), _record(99)
    mutate(bad)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps({"train": [good], "test": [bad]}))
    with pytest.raises(EnvError) as ei:
        abcd.load_conversations(p)
    msg = str(ei.value)
    assert "bad.json" in msg and "convo_id=99" in msg and repr(field) in msg and "'test'" in msg


def test_bad_record_without_id_named_by_index(tmp_path):
    bad = _record()
    del bad["convo_id"]
    p = tmp_path / "x.json"
    p.write_text(json.dumps([_record(1), bad]))
    with pytest.raises(EnvError, match=r"x\.json.*conversation #1.*'convo_id'"):
        abcd.load_conversations(p)


def test_other_loader_errors(tmp_path):
    with pytest.raises(EnvError, match="does not exist"):
        abcd.load_conversations(tmp_path / "missing.json")
    (tmp_path / "junk.json").write_text("{not json")
    with pytest.raises(EnvError, match="junk.json"):
        abcd.load_kb(tmp_path / "junk.json")
    (tmp_path / "kb.json").write_text(json.dumps({"return_size": "pull-up-account"}))
    with pytest.raises(EnvError, match="return_size"):
        abcd.load_kb(tmp_path / "kb.json")
    (tmp_path / "g.json").write_text("[1, 2]")
    with pytest.raises(EnvError, match="guidelines"):
        abcd.load_guidelines(tmp_path / "g.json")
    (tmp_path / "o.json").write_text(json.dumps({"intents": {"flows": ["a"], "subflows": {"b": ["x"]}},
                                                 "actions": {}}))
    with pytest.raises(EnvError, match=r"intents\.subflows\.b"):
        abcd.load_ontology(tmp_path / "o.json")
    (tmp_path / "s.json").write_text(json.dumps({"training": []}))
    with pytest.raises(EnvError, match="training"):
        abcd.load_conversations(tmp_path / "s.json")


# ------------------------------------------------------------------------------------- identity replay
def test_identity_verification_replay_reproduces_original():
    convs = {c.convo_id: c for c in abcd.load_conversations(abcd.SAMPLE_PATH)}
    raw = {r["convo_id"]: r for r in _sample_raw()}
    expected_end = {1101: "validate-purchase", 1102: "verify-identity", 1103: "verify-identity",
                    1104: "pull-up-account", 1105: None}
    for cid, c in convs.items():
        turns = abcd.identity_verification_turns(c)
        assert turns == [tuple(t) for t in raw[cid]["original"][:len(turns)]]  # verbatim prefix
        if expected_end[cid] is None:
            assert turns == []
        else:
            end = len(turns) - 1
            assert turns[-1][0] == "action" and raw[cid]["delexed"][end]["targets"][2] == expected_end[cid]
            # no verification action before the end
            assert not any(d["targets"][2] in abcd.VERIFY_ACTIONS for d in raw[cid]["delexed"][:end])


def test_identity_rule_falls_back_to_action_text(tmp_path):
    rec = _record(5)
    rec.pop("delexed")
    p = tmp_path / "nodelex.json"
    p.write_text(json.dumps([rec]))
    (c,) = abcd.load_conversations(p)
    turns = abcd.identity_verification_turns(c)
    assert turns == [tuple(t) for t in rec["original"][:8]]
    assert turns[-1] == ("action", "Identity verification in progress ...")


# ------------------------------------------------------------------------------------- behaviours
def test_behaviour_cards():
    assert tuple(behaviour.BEHAVIOURS) == tuple(f"B{i}" for i in range(1, 14)) + ("N",)
    for bid, card in behaviour.BEHAVIOURS.items():
        assert card.id == bid
        for k in behaviour.CARD_FIELDS:
            assert isinstance(getattr(card, k), str) and getattr(card, k).strip()
    assert behaviour.BEHAVIOURS["B2"].name == "Incremental goalpost shifting"
    assert behaviour.BEHAVIOURS["N"].name == "Neutral"


def _eq12(s, w):
    return (w["e"] * s["e"] + w["p"] * s["p"] + w["n"] * s["n"] + w["c"] * s["c"]) / (w["e"] + w["p"] + w["n"] + w["c"])


def test_reward_eq12_eq13():
    rng = np.random.default_rng(0)
    w0 = {"e": 2.0, "p": 1.5, "n": 0.75, "c": 0.75}
    w1 = {"e": 1.0, "p": 1.0, "n": 1.0, "c": 3.0}
    for _ in range(50):
        s = dict(zip("epnc", (float(x) for x in rng.random(4))))
        assert behaviour.behaviour_reward(s) == pytest.approx(_eq12(s, w0), abs=1e-12)
        assert behaviour.behaviour_reward(s) == pytest.approx(
            (2.0 * s["e"] + 1.5 * s["p"] + 0.75 * s["n"] + 0.75 * s["c"]) / 5.0, abs=1e-12)
        meta = dict(s, e=0.0, p=0.0)
        assert behaviour.behaviour_reward(s, meta_narration=True) == pytest.approx(_eq12(meta, w0), abs=1e-12)
        assert behaviour.behaviour_reward(s, weights=w1) == pytest.approx(_eq12(s, w1), abs=1e-12)
        assert behaviour.behaviour_reward(s, weights=w1, meta_narration=True) == pytest.approx(
            _eq12(meta, w1), abs=1e-12)
        partial = dict(w0, c=2.0)
        assert behaviour.behaviour_reward(s, weights={"c": 2.0}) == pytest.approx(_eq12(s, partial), abs=1e-12)
    one = {"e": 1.0, "p": 1.0, "n": 1.0, "c": 1.0}
    assert behaviour.behaviour_reward(one) == 1.0
    assert behaviour.behaviour_reward(one, meta_narration=True) == pytest.approx(1.5 / 5.0)
    assert behaviour.behaviour_reward({"e": 0, "p": 0, "n": 0, "c": 0}) == 0.0


@pytest.mark.parametrize("scores, key", [
    ({"e": 1.0, "p": 1.0, "n": 1.0}, "'c'"),
    ({"e": 1.2, "p": 1.0, "n": 1.0, "c": 1.0}, "'e'"),
    ({"e": 1.0, "p": -0.1, "n": 1.0, "c": 1.0}, "'p'"),
    ({"e": 1.0, "p": 1.0, "n": float("nan"), "c": 1.0}, "'n'"),
    ({"e": 1.0, "p": 1.0, "n": 1.0, "c": "high"}, "'c'"),
    ({"e": 1.0, "p": 1.0, "n": 1.0, "c": 1.0, "x": 0.5}, "'x'"),
])
def test_reward_bad_scores_name_key(scores, key):
    with pytest.raises(EnvError, match=key):
        behaviour.behaviour_reward(scores)


def test_reward_bad_weights():
    s = {"e": 1.0, "p": 1.0, "n": 1.0, "c": 1.0}
    with pytest.raises(EnvError, match="'z'"):
        behaviour.behaviour_reward(s, weights={"z": 1.0})
    with pytest.raises(EnvError, match="'e'"):
        behaviour.behaviour_reward(s, weights={"e": -1.0})
    with pytest.raises(EnvError, match="sum"):
        behaviour.behaviour_reward(s, weights={"e": 0, "p": 0, "n": 0, "c": 0})


PERFORMING = [
    "I've given you my order number twice already. Just fix it.",
    "Okay, but it also has to arrive before Friday, otherwise it's useless to me.",
    "Actually forget the refund, I want to change my shipping address.",
    "Do you even know how to do your job? I'm a gold member, I shouldn't have to wait.",
    "Your colleague already promised me a full refund yesterday.",
    "this behavior is unacceptable from your staff",
    "I am going to play hardball here, I want the manager.",
    "I will act on your advice and wait.",
    "ok **really** fast please",
    "My behaviour? I just want my money back.",
    "The jacket is the wrong color (and the size is off too).",
]
DESCRIBING = [
    "I will now act like an annoyed customer.",
    "I'll play the part of a difficult customer: where is my order?",
    "I'm going to pretend I lost my receipt.",
    "*sighs* fine, here is my email",
    "(rolls eyes) whatever you say",
    "[frustrated] Still waiting.",
    "As an impatient customer, I demand this be fixed now.",
    "Staying in character: where is my refund?",
    "My role here is to keep changing what I want.",
    "Following my assigned behaviour, I add another requirement.",
    "Now some incremental goalpost shifting: it must also be blue.",
    "According to my instructions I should not give you the order ID.",
]


def test_meta_narration_patterns():
    for t in PERFORMING:
        assert behaviour.detect_meta_narration(t) is None, t
    for t in DESCRIBING:
        m = behaviour.detect_meta_narration(t)
        assert m and m in t, t
    names = [n for n, _ in behaviour.META_NARRATION_PATTERNS]
    assert len(names) == len(set(names)) >= 5


@pytest.mark.parametrize("share", [1 / 3, 0.6])
def test_assignment_frequencies(share):
    n = 30_000
    for rng in (np.random.default_rng(123), random.Random(321)):
        draws = [behaviour.assign_behaviour(rng, neutral_share=share) for _ in range(n)]
        counts = {k: draws.count(k) for k in behaviour.ALL_IDS}
        assert sum(counts.values()) == n
        assert abs(counts["N"] / n - share) < 0.015
        each = (1 - share) / 13
        for bid in behaviour.BEHAVIOUR_IDS:
            assert abs(counts[bid] / n - each) < 0.006, (bid, counts[bid])
    assert behaviour.assign_behaviour(np.random.default_rng(0), neutral_share=1.0) == "N"
    assert behaviour.assign_behaviour(np.random.default_rng(0), neutral_share=0.0) != "N"
    with pytest.raises(EnvError, match="neutral_share"):
        behaviour.assign_behaviour(np.random.default_rng(0), neutral_share=1.5)


# In-character speech that mentions roles, characters, pretending or a type of customer: the rule must not fire
# (issue 22: the first four zeroed e and p before).
IN_CHARACTER = [
    "shipping it late is out of character for you guys",
    "In my role as office manager I ordered these",
    "As a frustrated customer, I want this fixed today",
    "I will pretend I did not hear that",
    "I'm going to act like I never got that email and start over.",
    "That's not the role I expected support to play here.",
    "My character is being questioned, I never lied about the order.",
    "I'll play the loyal customer card: I've been with you ten years.",
    "As an angry customer I think I deserve a discount.",
    "I'm a gold member, I shouldn't have to act like a detective to find my package.",
    "Let me pretend for a second that this makes sense.",
    "It's totally in character for your company to lose my order.",
    "Your agent played the part of helpful and then hung up on me.",
    "The script you're reading from doesn't answer my question.",
    "My instructions to the courier were to leave it at the door.",
    "I am a customer, not a bot, please read what I wrote.",
    "I had a role in choosing this supplier, so I care.",
    "I'll behave when you give me my refund.",
    "Act like you care for once.",
    "The scenario you describe never happened.",
    "I ordered the B4: the blue one, size medium.",
    "Honestly the customer service in this store used to be better.",
    "I simulate nothing, the box really arrived crushed.",
    "I've acted patient long enough, where is my money?",
]
# True meta-narration the rule still catches on its own.
META = [
    "As an AI language model, I cannot pretend to be angry.",
    "I am a simulated user, so here is my next request.",
    "(the user sighs) fine, my email is on file",
    "In this role-play I am the customer, so: where is my order?",
    "I will now act like an annoyed customer.",
    "*sighs* fine, here is my email",
    "According to my instructions I should not give you the order ID.",
    "Breaking character for a moment: the scenario is unclear.",
    "Following my assigned behaviour, I add another requirement.",
]


def test_meta_narration_rule_spares_in_character_speech():
    assert len(IN_CHARACTER) >= 24
    for t in IN_CHARACTER:
        assert behaviour.meta_narration_rule(t) is None, t
    for t in META:
        m = behaviour.meta_narration_rule(t)
        assert m and m in t, t
    # the looser forms of the four reported sentences are candidates for the judge, not the rule
    for t in IN_CHARACTER[:4]:
        assert behaviour.meta_narration_candidates(t), t
    with pytest.raises(EnvError, match="meta_narration_rule"):
        behaviour.meta_narration_rule(None)
