"""TauGym (mimesis_jax/envs/userrl/tau.py): local retail tools, tau-bench reward, user stop, invalid input, loaders,
the tau_bench adapter (missing package; a stub), and whole episodes through run_episodes."""

import copy
import hashlib
import json
import sys
import types

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import InvalidEpisode, tool_call_text
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.userrl import DATA_DIR, Task, make_env, shipped_tasks
from mimesis_jax.chat.base import ChatResponse, ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeTask, ScriptedAgent, run_episodes

STOP = "###STOP###"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def _task(task_id, **create):
    for t in shipped_tasks("train", ["TauGym"]) + shipped_tasks("test", ["TauGym"]):
        if t.id == task_id:
            return t
    return Task(gym="TauGym", id=task_id, prompt=[{"role": "user", "content": "x"}], create_kwargs={"id": task_id,
                                                                                                    **create})


def _env(task_id="local_retail-train-000", replies=("ok",), **kw):
    user = ScriptedChatModel(list(replies), cycle=False)
    env = make_env(_task(task_id), user=user, **kw)
    env.reset()
    return env, user


def call(name, **arguments):
    return "[answer] " + json.dumps({"name": name, "arguments": arguments})


def _db():
    with open(DATA_DIR / "tau_retail_db.json", encoding="utf-8") as f:
        return json.load(f)


def _hash(db):  # the test's own canonical hash of a database
    return hashlib.sha256(json.dumps(db, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------- shipped data
def test_shipped_files_and_task_rows():
    train, test = shipped_tasks("train", ["TauGym"]), shipped_tasks("test", ["TauGym"])
    assert 5 <= len(train) <= 8 and len(test) == 5
    for split, tasks in (("train", train), ("test", test)):
        with open(DATA_DIR / f"tau_{split}.json", encoding="utf-8") as f:
            records = {r["id"]: r for r in json.load(f)}
        for t in tasks:
            rec = records[t.id]
            assert rec["env"] == "local_retail" and set(rec) == {"id", "obs", "info", "env"}
            assert set(rec["info"]["task"]) == {"user_id", "actions", "instruction", "outputs"}
            assert t.data_source == "interact_taugym" and t.split == split and t.create_kwargs == {"id": t.id}
            assert t.reward_model == {"style": "rule", "ground_truth": ""}
            assert rec["obs"] in t.prompt[1]["content"] and "Lumen Goods" in t.prompt[0]["content"]
            env = make_env(t, user=ScriptedChatModel(["ok"]))
            obs, info = env.reset()
            assert obs["feedback"] == f"The customer says: {rec['obs']}"
            assert info["backend"] == "local_retail" and info["task_id"] == t.id
    assert len((DATA_DIR / "tau_retail_db.json").read_bytes()) < 50_000


# --------------------------------------------------------------------------------------- tools
def test_read_tools_and_their_errors():
    env, _ = _env()
    db = _db()
    step = lambda a: env.step(a)[0]["feedback"]  # noqa: E731
    assert step(call("find_user_id_by_email", email="Mara.Okafor@example.com ")) == "mara_okafor_4821"
    assert step(call("find_user_id_by_email", email="nobody@example.com")) == "Error: user not found"
    assert json.loads(step(call("get_user_details", user_id="hana_sato_5567"))) == db["users"]["hana_sato_5567"]
    assert step(call("get_user_details", user_id="hana")) == "Error: user not found"
    assert json.loads(step(call("get_order_details", order_id="#L1007")))["status"] == "processed"
    assert step(call("get_order_details", order_id="L1007")) == "Error: order not found"
    assert json.loads(step(call("get_product_details", product_id="8310000004"))) == db["products"]["8310000004"]
    assert step(call("get_product_details", product_id="9410000401")) == "Error: product not found"  # an item id
    assert env.backend.data == db  # reads change nothing


def test_cancel_pending_order_effects_and_errors():
    env, _ = _env()
    db = _db()
    obs, r, term, _, _ = env.step(call("cancel_pending_order", order_id="#L1006", reason="ordered by mistake"))
    order = env.backend.data["orders"]["#L1006"]
    assert json.loads(obs["feedback"]) == order and (r, term) == (0.0, False)
    assert order["status"] == "cancelled" and order["cancel_reason"] == "ordered by mistake"
    assert order["payment_history"][-1] == {"transaction_type": "refund", "amount": 22.25,
                                            "payment_method_id": "gift_card_8815"}
    # a gift card gets its refund at once: 12.5 + 22.25
    assert env.backend.data["users"]["ines_duarte_7734"]["payment_methods"]["gift_card_8815"]["balance"] == 34.75
    env.step(call("cancel_pending_order", order_id="#L1001", reason="no longer needed"))  # a credit card: no balance
    assert env.backend.data["users"]["mara_okafor_4821"]["payment_methods"] == db["users"]["mara_okafor_4821"][
        "payment_methods"]
    before = copy.deepcopy(env.backend.data)
    for args, msg in [({"order_id": "#L1007", "reason": "no longer needed"}, "only pending orders"),
                      ({"order_id": "#L1006", "reason": "no longer needed"}, "only pending orders"),  # done above
                      ({"order_id": "#L1008", "reason": "too expensive"}, "reason must be one of"),
                      ({"order_id": "#L9999", "reason": "no longer needed"}, "order not found")]:
        feedback = env.step(call("cancel_pending_order", **args))[0]["feedback"]
        assert feedback.startswith("Error:") and msg in feedback
    assert env.backend.data == before


def test_modify_address_and_return_items():
    env, _ = _env()
    new = {"address1": "1 Pier Road", "address2": "", "city": "Salem", "state": "MA", "country": "USA", "zip": "01970"}
    env.step(call("modify_pending_order_address", order_id="#L1003", **new))
    assert env.backend.data["orders"]["#L1003"]["address"] == new
    assert env.backend.data["users"]["tobias_lind_1190"]["address"]["city"] == "Tacoma"  # the account is unchanged
    fb = env.step(call("modify_pending_order_address", order_id="#L1002", **new))[0]["feedback"]
    assert fb.startswith("Error: only pending orders can be modified")

    # #L1004 holds the 750ml bottle twice: both may go back, a third may not
    fb = env.step(call("return_delivered_order_items", order_id="#L1004", item_ids=["9410000202"] * 3,
                       payment_method_id="paypal_5521"))[0]["feedback"]
    assert fb == "Error: some item is not in this order"
    env.step(call("return_delivered_order_items", order_id="#L1004", item_ids=["9410000601", "9410000202",
                                                                               "9410000202"],
                  payment_method_id="paypal_5521"))
    order = env.backend.data["orders"]["#L1004"]
    assert order["status"] == "return requested" and order["return_payment_method_id"] == "paypal_5521"
    assert order["return_items"] == ["9410000202", "9410000202", "9410000601"]  # sorted
    for args, msg in [({"order_id": "#L1005", "item_ids": ["9410000402"], "payment_method_id": "paypal_5521"},
                       "payment method not found"),  # another customer's
                      ({"order_id": "#L1009", "item_ids": ["9410000501"], "payment_method_id": "gift_card_4407"},
                       None),  # a gift card is always allowed
                      ({"order_id": "#L1002", "item_ids": ["9410000301"], "payment_method_id": "credit_card_7716"},
                       "original payment method"),  # paid by gift card, refund to the card
                      ({"order_id": "#L1010", "item_ids": ["9410000401"], "payment_method_id": "credit_card_5120"},
                       "only delivered orders"),
                      ({"order_id": "#L1004", "item_ids": ["9410000202"], "payment_method_id": "paypal_5521"},
                       "only delivered orders")]:  # already returned
        fb = env.step(call("return_delivered_order_items", **args))[0]["feedback"]
        assert (not fb.startswith("Error")) if msg is None else (fb.startswith("Error") and msg in fb), fb
    assert env.backend.data["orders"]["#L1009"]["return_payment_method_id"] == "gift_card_4407"


def test_argument_errors_and_unknown_tool():
    env, _ = _env()
    cases = [(call("get_order_details"), "Error: get_order_details is missing argument(s) ['order_id']"),
             (call("get_order_details", order_id="#L1001", verbose="yes"),
              "Error: get_order_details got unexpected argument(s) ['verbose']"),
             (call("get_order_details", order_id=1001), "Error: argument 'order_id' of get_order_details must be"),
             (call("return_delivered_order_items", order_id="#L1005", item_ids="9410000402",
                   payment_method_id="gift_card_8815"),
             "Error: argument 'item_ids' of return_delivered_order_items must"),
             (call("refund_everything", order_id="#L1001"), "Unknown action refund_everything"),
             (call("respond", content="hello"), "Unknown action respond"),
             ('[answer] {"arguments": {"order_id": "#L1001"}}', "Unknown action "),  # no name
             # "arguments" defaults to {}
             ('[answer] {"name": "get_order_details"}', "Error: get_order_details is missing argument(s)")]
    for text, expected in cases:
        obs, reward, term, trunc, info = env.step(text)
        assert obs["feedback"].startswith(expected) and (reward, term) == (0.0, False), (text, obs)
    assert env.backend.data == _db()


def test_invalid_json_answers():
    env, user = _env()
    for content in ["{not json}", "[1, 2]", '{"name": "get_order_details", "arguments": [1]}',
                    '{"name": 7, "arguments": {}}', "please look up my order", "get_order_details: {oops",
                    '"just a string"']:
        obs, reward, term, trunc, info = env.step(f"[answer] {content}")
        assert obs["feedback"] == env.prompt("invalid_tool_call") and (reward, term, trunc) == (0.0, False, False)
        assert "invalid_tool_call" in info
    # UserRL's second form, `name: {arguments}`, is a valid call
    fb = env.step('[answer] get_order_details: {"order_id": "#L1001"}')[0]["feedback"]
    assert json.loads(fb)["order_id"] == "#L1001"
    obs, reward, term, _, info = env.step("no prefix at all")
    assert obs["feedback"] == env.invalid_action_feedback and "invalid_action" in info
    assert user.calls == [] and env.backend.data == _db()


def test_search_tools_help_and_other():
    env, user = _env()
    first = env.step("[search] tools")[0]["feedback"]
    names = ["find_user_id_by_email", "get_user_details", "get_order_details", "get_product_details",
             "cancel_pending_order", "modify_pending_order_address", "return_delivered_order_items",
             "transfer_to_human_agents"]
    assert all(f"- {n}:" in first for n in names)
    assert "item_ids (list of string, required)" in first
    assert "already given" in env.step("[search]  TOOLS ")[0]["feedback"]
    help_text = env.step("[search] Help")[0]["feedback"]
    assert "Lumen Goods customer-service policy" in help_text and "answer" in help_text
    assert env.step("[search] refund rules")[0]["feedback"].startswith("Cannot search for 'refund rules'")
    assert user.calls == []


# --------------------------------------------------------------------------------------- reward
def _gold_run(env, reason="no longer needed"):
    """train-000 (cancel #L1001, reason 'no longer needed') played by the agent."""
    steps = [env.step("[action] Hello! What is the email on your account?"),
             env.step(call("find_user_id_by_email", email="mara.okafor@example.com")),
             env.step(call("get_order_details", order_id="#L1001")),
             env.step("[action] I will cancel #L1001 (desk lamp, water bottle) as no longer needed. Proceed?")]
    if reason is not None:
        steps.append(env.step(call("cancel_pending_order", order_id="#L1001", reason=reason)))
    steps.append(env.step("[action] Anything else?"))
    return steps


def test_reward_one_when_the_database_matches_the_gold_actions():
    env, user = _env(replies=["mara.okafor@example.com", "Yes.", STOP])
    steps = _gold_run(env)
    *before, (obs, reward, term, trunc, info) = steps
    assert all(s[1] == 0.0 and not s[2] for s in before)
    # the rule: db after the agent == db after the gold actions (#L1001 cancelled, 57.99 refunded to the card)
    expected = _db()
    order = expected["orders"]["#L1001"]
    order.update(status="cancelled", cancel_reason="no longer needed")
    order["payment_history"].append({"transaction_type": "refund", "amount": 57.99,
                                     "payment_method_id": "credit_card_7716"})
    assert _hash(env.backend.data) == _hash(expected)
    assert (obs["feedback"], reward, term, trunc) == (STOP, 1.0, True, False)
    assert info["reward_info"]["r_actions"] is True and info["user_utterance"] == STOP
    with pytest.raises(EnvError, match="ended"):
        env.step("[action] hello?")


@pytest.mark.parametrize("reason", ["ordered by mistake", None])  # a wrong action; the action missing
def test_reward_zero_for_a_wrong_or_missing_action(reason):
    env, _ = _env(replies=["mara.okafor@example.com", "Yes.", STOP])
    obs, reward, term, _, info = _gold_run(env, reason)[-1]
    assert (reward, term) == (0.0, True) and info["reward_info"]["r_actions"] is False


def test_reward_zero_for_an_extra_change():
    env, _ = _env(replies=["Yes.", STOP])
    env.step(call("cancel_pending_order", order_id="#L1001", reason="no longer needed"))
    env.step(call("modify_pending_order_address", order_id="#L1008", address1="x", address2="", city="y",
                  state="z", country="USA", zip="1"))  # someone else's order, not in the gold actions
    assert env.step("[action] Done?")[1:3] == (0.0, False)
    assert env.step("[action] Bye?")[1:3] == (0.0, True)


def test_required_outputs_are_checked_in_messages_to_the_user():
    # train-004: read-only; the agent must tell the user the price 72.4 (lower-cased, commas removed)
    env, _ = _env("local_retail-train-004", replies=["Great, thanks!", STOP])
    env.step(call("get_product_details", product_id="8310000004"))
    env.step("[action] The red 28L backpack costs $72.40.")
    obs, reward, term, _, info = env.step("[action] Anything else?")
    assert (reward, term) == (1.0, True) and info["reward_info"]["outputs"] == {"72.4": True}
    env, _ = _env("local_retail-train-004", replies=["Hmm.", STOP])
    env.step(call("get_product_details", product_id="8310000004"))  # looked up but never said
    env.step("[action] I found it.")
    obs, reward, term, _, info = env.step("[action] Anything else?")
    assert (reward, term) == (0.0, True) and info["reward_info"]["r_actions"] is True
    assert info["reward_info"]["outputs"] == {"72.4": False}


def test_transfer_to_human_ends_the_episode_with_the_reward():
    env, user = _env("local_retail-test-003")  # gold: look-ups and a transfer, no change
    obs, reward, term, _, _ = env.step(call("transfer_to_human_agents", summary="refund question"))
    assert (obs["feedback"], reward, term) == ("Transfer successful", 1.0, True) and user.calls == []
    env, _ = _env()  # train-000 needs a cancellation first: a transfer without it scores 0
    assert env.step(call("transfer_to_human_agents", summary="wants a cancel"))[1:3] == (0.0, True)


def test_truncation_gives_no_reward():
    env, _ = _env(max_steps=2)
    env.step(call("cancel_pending_order", order_id="#L1001", reason="no longer needed"))
    obs, reward, term, trunc, info = env.step("[search] tools")
    assert (reward, term, trunc) == (0.0, False, True) and "reward_info" not in info
    assert make_env(_task("local_retail-train-000"), user=None).max_steps == 15


def test_default_step_limit_is_userrl_training_tools_15_and_configurable():
    # UserRL's InteractTool.create(..., max_turns=15) builds every training env; the tau task rows carry no max_turns
    UR_INTERACT_TOOL_MAX_TURNS = 15
    t = _task("local_retail-train-000")
    assert "max_turns" not in t.create_kwargs
    env = make_env(t, user=None)
    assert env.max_steps == UR_INTERACT_TOOL_MAX_TURNS
    env.reset()
    truncs = [env.step("[search] tools")[3] for _ in range(UR_INTERACT_TOOL_MAX_TURNS)]
    assert truncs == [False] * (UR_INTERACT_TOOL_MAX_TURNS - 1) + [True]
    assert make_env(t, user=None, max_steps=30).max_steps == 30
    t7 = _task("local_retail-train-000")
    t7 = Task(gym=t7.gym, id=t7.id, prompt=t7.prompt, create_kwargs={**t7.create_kwargs, "max_turns": 7})
    assert make_env(t7, user=None).max_steps == 7 and make_env(t7, user=None, max_steps=4).max_steps == 4


# --------------------------------------------------------------------------------------- the user
def test_user_turns_stop_marker_roles_and_private_thought():
    env, user = _env(replies=["<think>I should give my email.</think> It's mara.okafor@example.com",
                              "Thanks, that's all. ###STOP###"])
    obs, reward, term, _, info = env.step("[action] Could I have your email?")
    assert obs["feedback"] == "It's mara.okafor@example.com" and not term
    assert info["user_thought"] == "I should give my email." and info["to_user"] is None
    msgs = user.calls[0]
    assert [m["role"] for m in msgs] == ["system", "assistant", "user"]  # the customer answers as assistant
    assert "cancel your pending order #L1001" in msgs[0]["content"] and STOP in msgs[0]["content"]
    assert msgs[1]["content"] == "Hi, an order from a couple of days ago has to be cancelled, please."
    assert msgs[2]["content"] == "Could I have your email?"
    obs, reward, term, _, info = env.step("[action] Anything else?")
    assert user.calls[1][3] == {"role": "assistant", "content": "It's mara.okafor@example.com",
                                "reasoning": "I should give my email."}
    assert term and reward == 0.0 and obs["feedback"].endswith(STOP)  # stopped before the cancellation


def test_refusing_failing_or_empty_user_is_invalid():
    for reply in ["As an AI language model, I cannot pretend to be a customer.",
                  ChatResponse("", finish_reason="error", meta={"error": "boom"}), "   "]:
        env, _ = _env(replies=[reply])
        with pytest.raises(InvalidEpisode):
            env.step("[action] Hi, what can I do for you?")


# --------------------------------------------------------------------------------------- loaders
def _write(tmp_path, name, data):
    (tmp_path / name).write_text(json.dumps(data), encoding="utf-8")


def _record(**over):
    rec = {"id": "local_retail-train-900", "env": "local_retail", "obs": "Hi.",
           "info": {"task": {"user_id": "mara_okafor_4821", "actions": [], "instruction": "Be Mara.", "outputs": []},
                    "source": "user", "user_cost": None, "reward_info": None}}
    rec.update(over)
    return rec


def _local_dir(tmp_path, records):
    _write(tmp_path, "tau_train.json", records)
    _write(tmp_path, "tau_retail_db.json", _db())
    (tmp_path / "tau_retail_policy.md").write_text("Be kind.", encoding="utf-8")
    return tmp_path


def test_loader_errors_name_file_record_and_field(tmp_path):
    t = _task("local_retail-train-900")
    env = make_env(t, data_dir=_local_dir(tmp_path, [_record()]), user=ScriptedChatModel(["x"]))
    assert env.reset()[0]["feedback"] == "The customer says: Hi."
    bad = _record()
    del bad["info"]["task"]["instruction"]
    with pytest.raises(EnvError, match=r"tau_train\.json, record 0 .*info\.task: missing field 'instruction'"):
        make_env(t, data_dir=_local_dir(tmp_path, [bad]))
    bad = _record()
    bad["info"]["task"]["actions"] = [{"name": "refund_all", "kwargs": {}}]
    with pytest.raises(EnvError, match=r"actions\[0\]: field 'name' is not a local retail tool"):
        make_env(t, data_dir=_local_dir(tmp_path, [bad]))
    bad["info"]["task"]["actions"] = [{"name": "get_order_details", "kwargs": {"id": "#L1"}}]
    with pytest.raises(EnvError, match=r"actions\[0\]: field 'kwargs' does not fit"):
        make_env(t, data_dir=_local_dir(tmp_path, [bad]))
    with pytest.raises(EnvError, match="field 'env' must be"):
        make_env(t, data_dir=_local_dir(tmp_path, [_record(env="bank")]))
    with pytest.raises(EnvError, match=r"no task with id 'local_retail-train-777'"):
        make_env(_task("local_retail-train-777"), data_dir=_local_dir(tmp_path, [_record()]))
    with pytest.raises(EnvError, match=r"no task with id 'local_retail-test-999'.*tau_test\.json|tau_test\.json"):
        make_env(_task("local_retail-test-999"))
    db = _db()
    db["orders"]["#L1001"]["user_id"] = "ghost"
    _local_dir(tmp_path, [_record()])
    _write(tmp_path, "tau_retail_db.json", db)
    with pytest.raises(EnvError, match=r"tau_retail_db\.json, orders\['#L1001'\]: field 'user_id' names unknown"):
        make_env(t, data_dir=tmp_path)


# --------------------------------------------------------------------------------------- tau-bench backend
def _real_record(tid="retail-train-000"):
    rec = _record(id=tid)
    del rec["env"]
    return rec


def test_real_tau_bench_task_without_the_package_is_a_clear_error(tmp_path, monkeypatch):
    for mod in ("tau_bench", "tau_bench.envs", "tau_bench.types"):
        monkeypatch.setitem(sys.modules, mod, None)  # import fails even where tau_bench is installed
    _write(tmp_path, "tau_train.json", [_real_record()])
    with pytest.raises(EnvError, match=r"needs the package tau_bench") as e:
        make_env(_task("retail-train-000"), data_dir=tmp_path, user=ScriptedChatModel(["x"]))
    assert "retail-train-000" in str(e.value) and "retail, split train, index 0" in str(e.value)


def test_tau_bench_adapter_wiring_with_a_stub_package(tmp_path, monkeypatch):
    """A stand-in for tau_bench's API (get_env, Action, env.reset/step) checks how the adapter drives it."""
    made = {}

    class Action:
        def __init__(self, name, kwargs):
            self.name, self.kwargs = name, kwargs

    class StubEnv:
        tools_info = [{"type": "function", "function": {"name": "book_flight", "description": "Book.",
                                                        "parameters": {"properties": {"id": {"type": "string"}},
                                                                       "required": ["id"]}}}]
        wiki = "Airline rules."

        def reset(self, task_index):
            return types.SimpleNamespace(observation=self.user.reset(instruction="Fly to Oslo."))

        def step(self, action):
            done = action.name == "respond" and STOP in (obs := self.user.step(action.kwargs["content"]))
            if action.name != "respond":
                obs = f"booked {action.kwargs}"
            reward_info = types.SimpleNamespace(model_dump=lambda: {"r_actions": True}) if done else None
            return types.SimpleNamespace(observation=obs, reward=1.0 if done else 0.0, done=done,
                                         info=types.SimpleNamespace(reward_info=reward_info))

    def get_env(**kwargs):
        made.update(kwargs)
        return StubEnv()

    pkg = types.ModuleType("tau_bench")
    monkeypatch.setitem(sys.modules, "tau_bench", pkg)
    monkeypatch.setitem(sys.modules, "tau_bench.envs", types.SimpleNamespace(get_env=get_env))
    monkeypatch.setitem(sys.modules, "tau_bench.types", types.SimpleNamespace(Action=Action,
                                                                              RESPOND_ACTION_NAME="respond"))
    _write(tmp_path, "tau_test.json", [_real_record("airline-049")])
    user = ScriptedChatModel(["Yes, book it.", STOP], cycle=False)
    env = make_env(_task("airline-049"), data_dir=tmp_path, user=user)
    assert made == {"env_name": "airline", "user_strategy": "human", "user_model": "human", "task_split": "test",
                    "task_index": 49}
    assert env.reset() == ({"feedback": "The customer says: Hi."}, {"task_id": "airline-049",
                                                                    "backend": "tau_bench:airline",
                                                                    "user_id": "mara_okafor_4821"})
    assert "- book_flight: Book." in env.step("[search] tools")[0]["feedback"]
    assert "Airline rules." in env.step("[search] help")[0]["feedback"]
    assert env.step(call("book_flight", id="F1"))[0]["feedback"] == "booked {'id': 'F1'}"
    assert env.step("[action] Shall I book?")[0]["feedback"] == "Yes, book it."
    assert "Fly to Oslo." in user.calls[0][0]["content"]
    obs, reward, term, _, info = env.step("[action] Done.")
    assert (reward, term, info["reward_info"]) == (1.0, True, {"r_actions": True})


# --------------------------------------------------------------------------------------- whole episodes
def test_episode_through_run_episodes(tok):
    task = _task("local_retail-train-000")
    user = ScriptedChatModel(["<think>Give the email.</think> Sure: mara.okafor@example.com", "Yes, go ahead.", STOP],
                             cycle=False)
    env = make_env(task, user=user)
    agent = ScriptedAgent(tok, [
        tool_call_text("search", "tools"),
        tool_call_text("action", "Happy to help. What is the email on your account?"),
        tool_call_text("answer", json.dumps({"name": "find_user_id_by_email",
                                             "arguments": {"email": "mara.okafor@example.com"}})),
        tool_call_text("answer", '{"name": "get_order_details", "arguments": {"order_id": "#L1001"}}'),
        tool_call_text("action", "Cancel #L1001 (desk lamp, water bottle) as no longer needed: yes?"),
        tool_call_text("answer", json.dumps({"name": "cancel_pending_order",
                                             "arguments": {"order_id": "#L1001", "reason": "no longer needed"}})),
        tool_call_text("action", "Done: refund in 5-7 business days. Anything else?"),
    ])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)], tokenizer=tok)
    assert traj.status == "ok" and traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 7
    assert traj.turn_rewards == [0.0] * 6 + [1.0]
    assert traj.user_utterances == [None, "Sure: mara.okafor@example.com", None, None, "Yes, go ahead.", None, STOP]
    assert traj.user_thoughts[1] == "Give the email." and traj.user_thoughts[0] is None
    assert traj.env_info[5]["tool"] == "cancel_pending_order" and traj.env_info[-1]["reward_info"]["r_actions"]
    assert "Sure: mara.okafor@example.com" in tok.decode(traj.student_tokens())
    assert "Give the email." not in tok.decode(traj.student_tokens())


def test_invalid_episode_through_run_episodes(tok):
    task = _task("local_retail-test-001")
    env = make_env(task, user=ScriptedChatModel(["As an AI language model, I cannot pretend to be a shopper."]))
    agent = ScriptedAgent(tok, [tool_call_text("answer", "{broken"), tool_call_text("action", "Hi! Your email?")])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)], tokenizer=tok)
    assert traj.status == "invalid" and "refused its role" in traj.invalid_reason
    assert traj.turn_rewards == [0.0, 0.0] and traj.env_info[0]["invalid_tool_call"]
