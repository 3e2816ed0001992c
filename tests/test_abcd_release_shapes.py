"""ABCD conversations in every scenario shape the public release uses load, prompt and replay (issue 22.1).

The release (asappresearch/abcd) has no field of scenario.personal / order / product in every conversation: its
own code reads a personal slot only when present, its ontology names personal slots account_id, email, phone,
pin_number, username besides the name and member level, and the public sample's storewide_query conversation has
personal {customer_name, member_level, phone}, an address-only order and empty product lists. The records below
are invented (names, numbers and texts written here), one per release flow, in those shapes.
"""

import gzip
import json

import pytest

from mimesis_jax.envs.abcd import dataset as abcd
from mimesis_jax.envs.abcd.env import BehaviourEnv, scenario_facts
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.chat.base import ScriptedChatModel

# the release's ten flows (its ontology's intents.flows), each with one of its subflows
RELEASE_FLOWS = ("account_access", "manage_account", "order_issue", "product_defect", "purchase_dispute",
                 "shipping_issue", "single_item_query", "storewide_query", "subscription_inquiry", "troubleshoot_site")

ADDRESS = {"street_address": "12 elm rd", "full_address": "12 elm rd  oakvale, tx 40213", "city": "oakvale",
           "state": "tx", "zip_code": "40213"}
FULL_ORDER = {**ADDRESS, "num_products": "2", "order_id": "7001002003", "packaging": "no",
              "payment_method": "paypal", "purchase_date": "2020-03-04",
              "products": "[{'brand': 'guess', 'product_type': 'boots', 'amount': 51}]"}

PULL = ("action", "Account has been pulled up for Ria Tamsin.")
VERIFY = ("action", "Identity verification in progress ...")
VALIDATE = ("action", "Purchase validation in progress ...")

# convo_id: (flow, subflow, personal, order, product, turns, index of the last identity-verification turn)
CASES = {
    501: ("account_access", "recover_password",
          {"customer_name": "ria tamsin", "phone": "(310) 555-0101", "pin_number": "4417", "zip_code": "40213"},
          dict(ADDRESS), {"names": [], "amounts": []},
          [("customer", "i can't log in"), ("agent", "Your full name and pin please?"),
           ("customer", "ria tamsin, 4417"), PULL, ("agent", "I can send a new password to your phone."),
           ("customer", "ok")], 3),
    502: ("manage_account", "manage_change_phone",
          {"customer_name": "ria tamsin", "account_id": "QX7R2K9PLM", "member_level": "silver",
           "phone": "(310) 555-0101"},
          {**ADDRESS, "order_id": "7001002003"}, {"names": [], "amounts": []},
          [("customer", "new phone number"), ("agent", "Name, account ID and order ID?"),
           ("customer", "ria tamsin QX7R2K9PLM 7001002003"), PULL, VERIFY, ("agent", "Thanks. The new number?"),
           ("customer", "(310) 555-0199")], 4),
    503: ("order_issue", "status_delivery_time",
          {"customer_name": "ria tamsin", "email": "rtamsin@email.com", "member_level": "gold",
           "phone": "(310) 555-0101", "username": "rtamsin88"},
          {**FULL_ORDER, "products": [{"brand": "guess", "product_type": "boots", "amount": 51}]},
          {"names": ["guess boots"], "amounts": [51]},
          [("customer", "where are my boots"), ("agent", "Name, username, email and order ID?"),
           ("customer", "ria tamsin, rtamsin88, rtamsin@email.com, 7001002003"), PULL,
           ("action", "Checked: details match."), ("agent", "Your order ships tomorrow."), ("customer", "thanks")], 4),
    504: ("product_defect", "return_stain",
          {"customer_name": "ria tamsin", "email": "rtamsin@email.com", "member_level": "bronze",
           "phone": "(310) 555-0101", "username": "rtamsin88"},
          dict(FULL_ORDER), {"names": ["guess boots"], "amounts": [51]},
          [("customer", "my boots came stained"), ("agent", "Name please?"), ("customer", "ria tamsin"), PULL,
           ("agent", "Username, email and order ID?"), ("customer", "rtamsin88 rtamsin@email.com 7001002003"),
           VALIDATE, ("agent", "How would you like to return them?"), ("customer", "by mail")], 6),
    505: ("purchase_dispute", "bad_price_competitor",
          {"customer_name": "ria tamsin", "email": "rtamsin@email.com", "member_level": "guest",
           "username": "rtamsin88"},
          dict(FULL_ORDER), {"names": ["guess boots"], "amounts": [51]},
          [("customer", "another shop sells these cheaper"), ("agent", "Name, username, email, order ID?"),
           ("customer", "ria tamsin rtamsin88 rtamsin@email.com 7001002003"), PULL, VALIDATE,
           ("agent", "I can match the price.")], 4),
    506: ("shipping_issue", "status",
          {"customer_name": "ria tamsin", "member_level": "silver", "phone": "(310) 555-0101"},
          {"order_id": "7001002003", "full_address": ADDRESS["full_address"]}, {"names": [], "amounts": []},
          [("customer", "has my order shipped"), ("agent", "Name and order ID?"),
           ("customer", "ria tamsin 7001002003"), PULL, ("agent", "And your account ID?"),
           ("customer", "QX7R2K9PLM"), VERIFY, ("agent", "It is in transit.")], 6),
    507: ("single_item_query", "boots",
          {"customer_name": "ria tamsin", "member_level": "gold", "phone": "(310) 555-0101"},
          dict(ADDRESS), {},
          [("customer", "are the guess boots waterproof"), ("agent", "Yes, they are."), ("customer", "great")], -1),
    # the public sample's storewide_query shape: no email, no username, address-only order, empty product lists
    508: ("storewide_query", "pricing",
          {"customer_name": "ria tamsin", "member_level": "bronze", "phone": "(310) 555-0101"},
          dict(ADDRESS), {"names": [], "amounts": []},
          [("customer", "do prices drop in march"), ("agent", "Sales start on the 10th."), ("customer", "ok")], -1),
    509: ("subscription_inquiry", "status_due_amount",
          {"account_id": "QX7R2K9PLM", "customer_name": "ria tamsin", "member_level": "gold", "pin_number": "4417"},
          {}, {"names": [], "amounts": []},
          [("customer", "how much do i owe"), ("agent", "Name and account ID?"),
           ("customer", "ria tamsin QX7R2K9PLM"), PULL, ("agent", "And your pin?"), ("customer", "4417"), VERIFY,
           ("agent", "You owe $40.")], 6),
    510: ("troubleshoot_site", "slow_speed", {}, {}, {},
          [("customer", "the site is slow"), ("agent", "Please log out and back in."),
           ("action", "Customer logged out and back in."), ("customer", "better now")], -1),
}
WITH_DELEXED = {503, 504, 509, 510}  # the others come without `delexed` (action names read from the text)
DELEXED_ACTIONS = {(503, 3): "pull-up-account", (503, 4): "verify-identity", (504, 3): "pull-up-account",
                   (504, 6): "validate-purchase", (509, 3): "pull-up-account", (509, 6): "verify-identity",
                   (510, 2): "log-out-in"}


def _raw(cid):
    flow, subflow, personal, order, product, turns, _ = CASES[cid]
    rec = {"convo_id": cid, "scenario": {"personal": personal, "order": order, "product": product, "flow": flow,
                                         "subflow": subflow},
           "original": [list(t) for t in turns]}
    if cid in WITH_DELEXED:
        rec["delexed"] = [{"speaker": s, "text": t.lower(), "turn_count": i + 1,
                           "targets": [subflow, "take_action" if s == "action" else None,
                                       DELEXED_ACTIONS.get((cid, i)), [], -1],
                           "candidates": []} for i, (s, t) in enumerate(turns)]
    return json.loads(json.dumps(rec))


def _write(tmp_path, cases=CASES):
    ids = sorted(cases)
    p = tmp_path / "abcd_v1.1.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"train": [_raw(c) for c in ids[:6]], "dev": [_raw(c) for c in ids[6:8]],
                   "test": [_raw(c) for c in ids[8:]]}, f)
    return p


def test_cases_cover_every_flow_and_the_missing_field_shapes():
    assert sorted(c[0] for c in CASES.values()) == sorted(RELEASE_FLOWS)
    personals = [set(c[2]) for c in CASES.values()]
    assert any(not ({"email", "username"} & p) and p for p in personals)  # no email / username (sample 3695)
    assert set() in personals and any("account_id" in p for p in personals) and any("phone" not in p for p in
                                                                                      personals)


def test_every_release_shape_loads(tmp_path):
    convs = abcd.load_conversations(_write(tmp_path))
    assert [c.convo_id for c in convs] == sorted(CASES)
    assert [c.split for c in convs] == ["train"] * 6 + ["dev"] * 2 + ["test"] * 2
    for c in convs:
        flow, subflow, personal, order, product, turns, _ = CASES[c.convo_id]
        assert c.scenario == {"personal": personal, "order": order, "product": product, "flow": flow,
                              "subflow": subflow}
        assert c.original == turns and (c.delexed is not None) == (c.convo_id in WITH_DELEXED)


@pytest.mark.parametrize("cid", sorted(CASES))
def test_identity_verification_replay_per_flow(tmp_path, cid):
    (conv,) = abcd.load_conversations(_write(tmp_path, {cid: CASES[cid]}))
    end = CASES[cid][-1]
    assert abcd.identity_verification_end(conv) == end
    assert abcd.identity_verification_turns(conv) == CASES[cid][5][:end + 1]


def test_prompt_block_for_the_sample_3695_shape(tmp_path):
    (conv,) = abcd.load_conversations(_write(tmp_path, {508: CASES[508]}))
    # written out by hand: absent fields and empty product lists get no line; an empty part reads "- (none)"
    assert scenario_facts(conv) == (
        "Reason for contacting support: storewide_query / pricing\n"
        "Customer:\n- customer_name: ria tamsin\n- member_level: bronze\n- phone: (310) 555-0101\n"
        "Order:\n- street_address: 12 elm rd\n- full_address: 12 elm rd  oakvale, tx 40213\n- city: oakvale\n"
        "- state: tx\n- zip_code: 40213\n"
        "Product:\n- (none)")


def _guidelines_and_kb():
    g, kb = {}, {}
    for flow, subflow, *_ in CASES.values():
        fname = flow.replace("_", " ").title()
        sname = subflow.replace("_", " ").title()
        g.setdefault(fname, {"description": f"{fname} help", "subflows": {}})["subflows"][sname] = {
            "instructions": [f"Help with {sname}."],
            "actions": [{"type": "interaction", "button": "Pull up Account", "text": "Open the account.",
                         "subtext": []}]}
        kb[subflow] = ["pull-up-account"]
    return g, kb


@pytest.mark.parametrize("cid", sorted(CASES))
def test_env_resets_on_every_shape(tmp_path, cid):
    (conv,) = abcd.load_conversations(_write(tmp_path, {cid: CASES[cid]}))
    g, kb = _guidelines_and_kb()
    env = BehaviourEnv(conv, agent=ScriptedChatModel(["ok"]), judge=ScriptedChatModel(["{}"]), kb=kb,
                       guidelines=g, behaviour="N")
    view = env.reset()
    system = view[0]["content"]
    personal = CASES[cid][2]
    for k, v in personal.items():
        assert f"- {k}: {v}" in system
    for k in abcd.PERSONAL_FIELDS + abcd.PERSONAL_OTHER_FIELDS:
        if k not in personal and k not in CASES[cid][3]:
            assert f"- {k}:" not in system
    if not personal:
        assert "Customer:\n- (none)" in system
    end = CASES[cid][-1]
    replayed = [t for s, t in CASES[cid][5][:end + 1] if s == "customer"]
    assert [m["content"] for m in view[1:] if m["role"] == "user"] == replayed


@pytest.mark.parametrize("cid, part, key, value", [
    (508, "personal", "phone", 3105550101),
    (502, "personal", "account_id", ["QX7R2K9PLM"]),
    (506, "order", "order_id", 7001002003),
    (507, "product", "names", "guess boots"),
])
def test_present_field_of_wrong_type_is_named(tmp_path, cid, part, key, value):
    raw = _raw(cid)
    raw["scenario"][part][key] = value
    p = tmp_path / "bad.json"
    p.write_text(json.dumps([_raw(501), raw]))
    with pytest.raises(EnvError) as ei:
        abcd.load_conversations(p)
    msg = str(ei.value)
    assert "bad.json" in msg and f"convo_id={cid}" in msg and repr(f"scenario.{part}.{key}") in msg


@pytest.mark.parametrize("drop", ["flow", "subflow", "personal", "order", "product"])
def test_required_scenario_parts_still_named(tmp_path, drop):
    raw = _raw(508)
    del raw["scenario"][drop]
    p = tmp_path / "bad.json"
    p.write_text(json.dumps([raw]))
    with pytest.raises(EnvError, match=rf"convo_id=508.*'scenario\.{drop}'"):
        abcd.load_conversations(p)
