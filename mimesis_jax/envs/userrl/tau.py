"""TauGym (docs/reference/environments.md, "The gyms"): tau-bench customer-service tasks behind UserRL's three choices.

The agent serves a customer (the user model) at a store's support desk. It talks to the customer and calls the
domain's tools, which read and change a JSON database; the reward is tau-bench's: 0/1, computed once, when the
conversation ends.

Choices (as UserRL's TauGym proxies them to tau-bench):

* `[search] tools` -- the tool list (name, description, arguments), the first time only; later asks get a
  "look back" note. `[search] help` -- guidance plus the domain policy. Anything else: "cannot search" (the query
  is lower-cased and stripped first, as UserRL does).
* `[action] text` -- tau-bench's `respond`: the text goes to the customer and the customer's reply is the feedback.
  A reply containing STOP_MARKER ("###STOP###", tau-bench's) ends the episode and triggers the reward.
* `[answer] {"name": ..., "arguments": {...}}` -- one tool call (UserRL also accepts `name: {json arguments}`;
  a missing "arguments" is {}). Content that does not parse to a name and an argument object is answered with
  the invalid-tool-call text (reward 0, the episode goes on). An unknown name is answered "Unknown action ...";
  missing / unexpected / mistyped arguments and domain failures are answered "Error: ..." (tau-bench turns the
  tool's exception or error string into the observation). Calling a terminating tool (`transfer_to_human_agents`)
  ends the episode and triggers the reward.
* Reward (tau-bench `Env.calculate_reward`): 1.0 when the final database hashes equal to the database reached by
  replaying the task's gold actions (terminating tools skipped) on a fresh copy, AND every required output
  string (lower-cased) occurs in some message the agent sent to the customer (lower-cased, commas removed);
  otherwise 0.0. Every other step rewards 0. Truncation (max_steps, default 15 = UserRL's
  `InteractTool.create(max_turns=15)`, the training path's tool; 16 in the paper's runs; set by `max_steps` or a
  `max_turns` create argument)
  ends the episode with no reward, as in UserRL, where only tau-bench's `done` computes it.

Two backends, chosen per task record (the `tau_train.json` / `tau_test.json` record named by the task id; ids with
"train" are looked up in tau_train.json, others in tau_test.json, as UserRL's environment manager splits them):

1. **local retail** -- records with `"env": "local_retail"` (a key the real files do not have; ids
   `local_retail-<split>-NNN`). The project's own invented store: `tau_retail_db.json` (users, orders, products in
   tau-bench's layout), `tau_retail_policy.md`, the eight tools below as pure functions over the db, and the
   record's gold actions / outputs. Always available.
2. **tau-bench** -- records without "env" (UserRL's own files: ids `retail-train-019`, `retail-019`,
   `airline-005`): tau-bench's own env, tools, wiki and reward (`TauBenchBackend`), with this project's ChatModel
   as the user (`ChatModelUser` replaces tau-bench's LLM user). Needs the package `tau_bench`; without it the
   task is an EnvError naming it. Category: "retail" in the id, else airline; task index: the id's last number.

Choices where UserRL is silent or unreachable here (written down, as the brief asks):

* The customer's opening message is the record's `obs` (what the agent's task prompt quotes), not a fresh user
  generation at reset: the user model's history starts with it, so the agent and the user see the same opening.
  Reset makes no model call.
* The user model is asked as tau-bench asks its LLM user (the gyms' convention, envs/userrl/common.py): system =
  the instruction prompt, the agent's turns `user`, the customer's own turns `assistant`; a MIMESIS simulator
  gets its true roles back through `SimulatorAsResponder`.
* A user model that refuses its role or fails is an INVALID episode (`InvalidEpisode`), never UserRL's
  communication-error text with reward 0.
* UserRL's `[finish]` cannot be sent through `interact_with_env` (choices action/answer/search only).
* Local domain: the hash is sha256 of canonical JSON (sorted keys) instead of tau-bench's `str(to_hashable(...))`;
  both compare the same structure. "respond" is not a tool there (only `[action]` talks to the customer); with
  tau-bench, `[answer] {"name": "respond", ...}` reaches its env as in UserRL, and an exception of its step is
  answered with TOOL_CALL_FAILED and the exception's text (UserRL's handling, in this project's words).
  `[search] help` shows the policy for tau-bench tasks too (their wiki), beside UserRL's guidance.
* A `max_turns` create argument (UserRL's tool option) sets the step limit when `max_steps` is not given.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from typing import Callable

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.userrl.common import (USERRL_TOOL_MAX_TURNS, UserRLEnv, build_gym, data_file, index_records,
                                            read_json)
from mimesis_jax.envs.userrl.tasks import register_gym

TRAIN_FILE, TEST_FILE = "tau_train.json", "tau_test.json"
DB_FILE, POLICY_FILE = "tau_retail_db.json", "tau_retail_policy.md"
LOCAL_ENV = "local_retail"
STOP_MARKER = "###STOP###"
RESPOND = "respond"  # tau-bench's name of the "talk to the user" action
TERMINATE_TOOLS = ("transfer_to_human_agents",)
CANCEL_REASONS = ("no longer needed", "ordered by mistake")
TOOL_CALL_FAILED = "The tool call could not be carried out: {error}"


# ------------------------------------------------------------------------------------ local tools
def _dump(obj) -> str:
    return json.dumps(obj)


def find_user_id_by_email(db, email):
    wanted = email.strip().lower()
    for user_id, user in db["users"].items():
        if user["email"].lower() == wanted:
            return user_id
    return "Error: user not found"


def get_user_details(db, user_id):
    return _dump(db["users"][user_id]) if user_id in db["users"] else "Error: user not found"


def get_order_details(db, order_id):
    return _dump(db["orders"][order_id]) if order_id in db["orders"] else "Error: order not found"


def get_product_details(db, product_id):
    return _dump(db["products"][product_id]) if product_id in db["products"] else "Error: product not found"


def cancel_pending_order(db, order_id, reason):
    order = db["orders"].get(order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "pending":
        return f"Error: only pending orders can be cancelled (this one is {order['status']})"
    if reason not in CANCEL_REASONS:
        return f"Error: reason must be one of {list(CANCEL_REASONS)}"
    methods = db["users"][order["user_id"]]["payment_methods"]
    refunds = []
    for payment in order["payment_history"]:
        if payment["transaction_type"] != "payment":
            continue
        refunds.append({"transaction_type": "refund", "amount": payment["amount"],
                        "payment_method_id": payment["payment_method_id"]})
        method = methods.get(payment["payment_method_id"], {})
        if method.get("source") == "gift_card":  # gift cards are refunded at once
            method["balance"] = round(method["balance"] + payment["amount"], 2)
    order["status"], order["cancel_reason"] = "cancelled", reason
    order["payment_history"].extend(refunds)
    return _dump(order)


def modify_pending_order_address(db, order_id, address1, address2, city, state, country, zip):  # noqa: A002
    order = db["orders"].get(order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "pending":
        return f"Error: only pending orders can be modified (this one is {order['status']})"
    order["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                        "country": country, "zip": zip}
    return _dump(order)


def return_delivered_order_items(db, order_id, item_ids, payment_method_id):
    order = db["orders"].get(order_id)
    if order is None:
        return "Error: order not found"
    if order["status"] != "delivered":
        return f"Error: only delivered orders can be returned (this one is {order['status']})"
    methods = db["users"][order["user_id"]]["payment_methods"]
    if payment_method_id not in methods:
        return "Error: payment method not found"
    original = order["payment_history"][0]["payment_method_id"]
    if methods[payment_method_id].get("source") != "gift_card" and payment_method_id != original:
        return "Error: the refund must go to the original payment method or to a gift card"
    have = [item["item_id"] for item in order["items"]]
    if not item_ids or any(item_ids.count(i) > have.count(i) for i in item_ids):
        return "Error: some item is not in this order"
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return _dump(order)


def transfer_to_human_agents(db, summary):
    return "Transfer successful"


_STR, _LIST = "string", "array"


def _info(name: str, description: str, params: dict[str, tuple[str, str]]) -> dict:
    props = {k: ({"type": "array", "items": {"type": "string"}, "description": d} if t == _LIST
                 else {"type": "string", "description": d}) for k, (t, d) in params.items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": props, "required": list(params)}}}


_ORDER = (_STR, "The order id, e.g. '#L1001' (with the leading '#').")
TOOLS: dict[str, tuple[Callable[..., str], dict]] = {
    "find_user_id_by_email": (find_user_id_by_email, _info(
        "find_user_id_by_email", "Look up a customer's user id from the email address on their account.",
        {"email": (_STR, "The email address, e.g. 'jo.doe@example.com'.")})),
    "get_user_details": (get_user_details, _info(
        "get_user_details", "A customer's profile: name, address, email, payment methods and order ids.",
        {"user_id": (_STR, "The user id, e.g. 'jo_doe_1234'.")})),
    "get_order_details": (get_order_details, _info(
        "get_order_details", "An order's status, items (with item and product ids), address and payments.",
        {"order_id": _ORDER})),
    "get_product_details": (get_product_details, _info(
        "get_product_details", "A product's variants: item id, options, price and availability.",
        {"product_id": (_STR, "The product id, e.g. '8310000001' (not an item id).")})),
    "cancel_pending_order": (cancel_pending_order, _info(
        "cancel_pending_order", "Cancel a pending order and refund its payments (gift cards at once, other methods "
        "in 5-7 business days). Explain the cancellation and get an explicit yes from the customer first.",
        {"order_id": _ORDER, "reason": (_STR, "Exactly 'no longer needed' or 'ordered by mistake'.")})),
    "modify_pending_order_address": (modify_pending_order_address, _info(
        "modify_pending_order_address", "Change the shipping address of a pending order. Explain the change and "
        "get an explicit yes from the customer first.",
        {"order_id": _ORDER, "address1": (_STR, "First address line, e.g. '12 Main Street'."),
         "address2": (_STR, "Second address line, e.g. 'Apt 4', or ''."), "city": (_STR, "The city."),
         "state": (_STR, "The state, e.g. 'CA'."), "country": (_STR, "The country, e.g. 'USA'."),
         "zip": (_STR, "The zip code, e.g. '94105'.")})),
    "return_delivered_order_items": (return_delivered_order_items, _info(
        "return_delivered_order_items", "Request the return of items of a delivered order; the order becomes "
        "'return requested'. The refund goes to the original payment method or to a gift card. Explain the return "
        "and get an explicit yes from the customer first.",
        {"order_id": _ORDER, "item_ids": (_LIST, "The item ids to return (an id may repeat if it was bought twice)."),
         "payment_method_id": (_STR, "Where the refund goes, e.g. 'gift_card_1234' or 'credit_card_5678'.")})),
    "transfer_to_human_agents": (transfer_to_human_agents, _info(
        "transfer_to_human_agents", "Hand the customer to a human agent, with a summary of the issue. Only when the "
        "customer asks for a person or the request cannot be handled with the tools. Ends the conversation.",
        {"summary": (_STR, "A short summary of the customer's issue.")})),
}


def argument_error(name: str, kwargs: dict) -> str | None:
    """Why `kwargs` do not fit local tool `name`'s parameters ("Error: ..."), or None when they fit."""
    params = TOOLS[name][1]["function"]["parameters"]
    missing = [k for k in params["required"] if k not in kwargs]
    extra = sorted(k for k in kwargs if k not in params["properties"])
    if missing:
        return f"Error: {name} is missing argument(s) {missing}"
    if extra:
        return f"Error: {name} got unexpected argument(s) {extra}"
    for k, spec in params["properties"].items():
        v = kwargs[k]
        if spec["type"] == "string" and not isinstance(v, str):
            return f"Error: argument '{k}' of {name} must be a string"
        if spec["type"] == "array" and not (isinstance(v, list) and all(isinstance(x, str) for x in v)):
            return f"Error: argument '{k}' of {name} must be a list of strings"
    return None


def run_tool(db: dict, name: str, kwargs: dict) -> str:
    """One local tool call on `db` (changed in place); failures come back as "Error: ..." text, as in tau-bench."""
    error = argument_error(name, kwargs)
    if error is not None:
        return error
    try:
        return TOOLS[name][0](db, **kwargs)
    except Exception as e:  # noqa: BLE001 -- a tool failure is the observation, as in tau-bench
        return f"Error: {type(e).__name__}: {e}"


def db_hash(db: dict) -> str:
    """sha256 of the database as canonical JSON (sorted keys, no whitespace)."""
    text = json.dumps(db, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def parse_tool_call(content: str) -> tuple[str, dict]:
    """`{"name": ..., "arguments": {...}}` or `name: {arguments}` -> (name, arguments); ValueError otherwise."""
    text = content.strip()
    try:
        if text.startswith("{") and text.endswith("}"):
            call = json.loads(text)
            if not isinstance(call, dict):
                raise ValueError("not a JSON object")
            name, args = call.get("name", ""), call.get("arguments", {})
        else:
            name, sep, rest = text.partition(":")
            if not sep:
                raise ValueError("no JSON tool call")
            name, args = name.strip(), json.loads(rest.strip())
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg})") from None
    if not isinstance(name, str):
        raise ValueError("'name' must be a string")
    if not isinstance(args, dict):
        raise ValueError("'arguments' must be a JSON object")
    return name, args


# ------------------------------------------------------------------------------------ the user
class ChatModelUser:
    """tau-bench's user-simulator interface (`reset(instruction) -> str`, `step(content) -> str`,
    `get_total_cost()`) over this project's ChatModel: every reply goes through the gym's `ask_user` (refusals and
    failures -> InvalidEpisode; a `<think>` thought stays private). `reset` returns the record's opening message
    without a model call (module docstring)."""

    def __init__(self, gym: "TauEnv", opening: str):
        self.gym, self.opening = gym, opening
        self.messages: list[dict] = []

    def reset(self, instruction: str | None = None) -> str:
        system = self.gym.prompt("user_system", instruction=instruction or "", stop_marker=STOP_MARKER)
        # the gyms' user-model convention (envs/userrl/common.py): the customer's own turns are `assistant`, the
        # agent's are `user` (as tau-bench asks its user LLM); SimulatorAsResponder flips them for a simulator
        self.messages = [{"role": "system", "content": system}, {"role": "assistant", "content": self.opening}]
        return self.opening

    def step(self, content: str) -> str:
        self.messages.append({"role": "user", "content": content})
        reply = self.gym.ask_user(self.messages)
        own = {"role": "assistant", "content": reply}
        thought = self.gym.user_turn.get("user_thought")
        if thought:
            own["reasoning"] = thought
        self.messages.append(own)
        return reply

    def get_total_cost(self) -> float:
        return 0.0


# ------------------------------------------------------------------------------------ backends
class LocalRetailBackend:
    """The project's own retail domain, with tau-bench's `Env` semantics (step, done, reward on done)."""

    kind = LOCAL_ENV

    def __init__(self, db: dict, policy: str, task: dict, user: ChatModelUser):
        self.initial, self.policy, self.task, self.user = copy.deepcopy(db), policy, task, user
        self.tools_info = [info for _, info in TOOLS.values()]
        self.data: dict = copy.deepcopy(db)
        self.actions: list[tuple[str, dict]] = []

    def reset(self) -> str:
        self.data, self.actions = copy.deepcopy(self.initial), []
        return self.user.reset(self.task["instruction"])

    def respond(self, content: str) -> tuple[str, float, bool, dict]:
        """tau-bench's `respond`: the message goes to the customer; a reply with STOP_MARKER ends the episode."""
        self.actions.append((RESPOND, {"content": content}))
        observation = self.user.step(content)
        return self._after(observation, STOP_MARKER in observation)

    def call(self, name: str, kwargs: dict) -> tuple[str, float, bool, dict]:
        """One tool call; a terminating tool ends the episode. "respond" is no tool here (only `[action]` talks)."""
        self.actions.append((name, kwargs))
        if name not in TOOLS:
            return self._after(self.user.gym.prompt("unknown_tool", name=name), False)
        return self._after(run_tool(self.data, name, kwargs), name in TERMINATE_TOOLS)

    def _after(self, observation: str, done: bool) -> tuple[str, float, bool, dict]:
        if not done:
            return observation, 0.0, False, {}
        reward, info = self.reward()
        return observation, reward, True, {"reward_info": info}

    def reward(self) -> tuple[float, dict]:
        """tau-bench's reward: database equal to the gold replay's, and every required output said."""
        data_hash = db_hash(self.data)
        gold = copy.deepcopy(self.initial)
        for action in self.task["actions"]:
            if action["name"] not in TERMINATE_TOOLS:
                run_tool(gold, action["name"], action["kwargs"])
        gold_hash = db_hash(gold)
        said = [kw["content"].lower().replace(",", "") for name, kw in self.actions if name == RESPOND]
        outputs = {out: any(out.lower() in text for text in said) for out in self.task.get("outputs") or []}
        r_actions, r_outputs = data_hash == gold_hash, all(outputs.values())
        info = {"r_actions": r_actions, "data_hash": data_hash, "gt_data_hash": gold_hash, "r_outputs": r_outputs,
                "outputs": outputs}
        return (1.0 if r_actions and r_outputs else 0.0), info


class TauBenchBackend:
    """Adapter over a real tau-bench env (retail / airline): its data, tools, wiki and reward, with our
    ChatModelUser as its user. Not exercised by the tests here (tau_bench is not installed); kept small."""

    def __init__(self, category: str, split: str, index: int, user: ChatModelUser, where: str):
        try:
            # lazy (b): tau_bench is optional (not in pyproject)
            from tau_bench.envs import get_env
            from tau_bench.types import RESPOND_ACTION_NAME, Action
        except ImportError as e:
            raise EnvError(f"{where}: a real tau-bench task ({category}, split {split}, index {index}) needs the "
                           f"package tau_bench (github.com/sierra-research/tau-bench), which is not importable: "
                           f"{e}") from None
        kwargs = dict(env_name=category, user_strategy="human", user_model="human", task_split=split)
        try:  # "human" builds tau-bench's user without any model call; ours replaces it below
            env = get_env(**kwargs, task_index=index)
        except TypeError:  # tau-bench versions whose get_env has no task_index
            env = get_env(**kwargs)
        env.user = user
        self.kind, self.env, self.Action, self.index = f"tau_bench:{category}", env, Action, index
        self.respond_name = RESPOND_ACTION_NAME
        self.tools_info, self.policy = list(env.tools_info), str(env.wiki)

    def reset(self) -> str:
        return str(self.env.reset(task_index=self.index).observation)

    def respond(self, content: str) -> tuple[str, float, bool, dict]:
        return self._step(self.respond_name, {"content": content})

    def call(self, name: str, kwargs: dict) -> tuple[str, float, bool, dict]:
        try:  # UserRL answers an exception of tau-bench's step as text (e.g. "respond" without "content")
            return self._step(name, kwargs)
        except InvalidEpisode:
            raise
        except Exception as e:  # noqa: BLE001
            return TOOL_CALL_FAILED.format(error=e), 0.0, False, {}

    def _step(self, name: str, kwargs: dict) -> tuple[str, float, bool, dict]:
        r = self.env.step(self.Action(name=name, kwargs=kwargs))
        info = {}
        if r.done and r.info.reward_info is not None:
            info["reward_info"] = r.info.reward_info.model_dump()
        return str(r.observation), float(r.reward), bool(r.done), info


# ------------------------------------------------------------------------------------ data
def validate_record(record, where: str) -> dict:
    """A UserRL tau record {id, obs, info: {task: {user_id, actions, instruction, outputs}, ...}} (plus "env" for
    the local domain); errors name `where` (file and record) and the field."""
    field(record, "id", str, where)
    field(record, "obs", str, where)
    env = field(record, "env", str, where, optional=True)
    if env is not None and env not in (LOCAL_ENV, "retail", "airline"):
        raise EnvError(f"{where}: field 'env' must be {LOCAL_ENV!r}, 'retail' or 'airline', got {env!r}")
    info = field(record, "info", dict, where)
    task = field(info, "task", dict, f"{where}, info")
    tw = f"{where}, info.task"
    field(task, "user_id", str, tw)
    field(task, "instruction", str, tw)
    actions = field(task, "actions", list, tw)
    outputs = field(task, "outputs", list, tw, optional=True, default=[])
    for j, out in enumerate(outputs):
        if not isinstance(out, str):
            raise EnvError(f"{tw}: field 'outputs[{j}]' must be a string, got {type(out).__name__}")
    for j, action in enumerate(actions):
        aw = f"{tw}, actions[{j}]"
        name = field(action, "name", str, aw)
        kwargs = field(action, "kwargs", dict, aw)
        if env == LOCAL_ENV:
            if name not in TOOLS:
                raise EnvError(f"{aw}: field 'name' is not a local retail tool: {name!r}; known: {sorted(TOOLS)}")
            error = argument_error(name, kwargs)
            if error is not None:
                raise EnvError(f"{aw}: field 'kwargs' does not fit the tool ({error})")
    return record


def load_records(path) -> dict[str, dict]:
    """{id: record} of a UserRL `tau_train.json` / `tau_test.json` (a list of records), validated."""
    table = index_records(read_json(path), "id", str(path))
    return {key: validate_record(rec, f"{path}, record {i} (id {key!r})") for i, (key, rec) in enumerate(table.items())}


def validate_db(db, where: str) -> dict:
    """The local retail database {users, orders, products} in tau-bench's layout; errors name the entry and field."""
    for key in ("users", "orders", "products"):
        field(db, key, dict, where)
    for uid, user in db["users"].items():
        uw = f"{where}, users[{uid!r}]"
        field(user, "email", str, uw)
        for pid, method in field(user, "payment_methods", dict, uw).items():
            field(method, "source", str, f"{uw}, payment_methods[{pid!r}]")
            if method["source"] == "gift_card":
                field(method, "balance", (int, float), f"{uw}, payment_methods[{pid!r}]")
    for oid, order in db["orders"].items():
        ow = f"{where}, orders[{oid!r}]"
        user_id = field(order, "user_id", str, ow)
        if user_id not in db["users"]:
            raise EnvError(f"{ow}: field 'user_id' names unknown user {user_id!r}")
        field(order, "status", str, ow)
        field(order, "address", dict, ow)
        for j, item in enumerate(field(order, "items", list, ow)):
            field(item, "item_id", str, f"{ow}, items[{j}]")
        payments = field(order, "payment_history", list, ow)
        if not payments:
            raise EnvError(f"{ow}: field 'payment_history' is empty")
        for j, p in enumerate(payments):
            field(p, "transaction_type", str, f"{ow}, payment_history[{j}]")
            field(p, "payment_method_id", str, f"{ow}, payment_history[{j}]")
            field(p, "amount", (int, float), f"{ow}, payment_history[{j}]")
    for pid, product in db["products"].items():
        field(product, "variants", dict, f"{where}, products[{pid!r}]")
    return db


_INDEX_RE = re.compile(r"(\d+)$")


# ------------------------------------------------------------------------------------ the gym
@register_gym("TauGym")
class TauEnv(UserRLEnv):
    """A tau-bench-style customer-service episode (module docstring for the rules)."""

    prompt_file = "tau"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # UserRL's InteractTool creates the tool with max_turns=15
    invalid_action_feedback = ("This step was not understood. Use the interact_with_env tool, with choice "
                               "'search', 'action' or 'answer', as the system instruction describes.")

    def __init__(self, record: dict, *, db: dict | None = None, policy: str = "", where: str = "TauGym record",
                 user=None, judge=None, max_steps: int | None = None, **options):
        super().__init__(user=user, judge=judge, max_steps=max_steps, **options)
        self.record = validate_record(record, where)
        task = record["info"]["task"]
        self.task_id = record["id"]
        self.user_adapter = ChatModelUser(self, record["obs"].strip())
        if record.get("env") == LOCAL_ENV:
            if db is None:
                raise EnvError(f"{where}: a {LOCAL_ENV} task needs the database {DB_FILE}")
            if task["user_id"] not in db["users"]:
                raise EnvError(f"{where}: field 'info.task.user_id' names no user of {DB_FILE}: {task['user_id']!r}")
            self.backend = LocalRetailBackend(db, policy, task, self.user_adapter)
        else:
            tid = self.task_id
            category = record.get("env") or ("retail" if "retail" in tid else "airline")
            m = _INDEX_RE.search(tid)
            if m is None:
                raise EnvError(f"{where}: tau-bench task id {tid!r} does not end in a task index")
            split = "train" if "train" in tid else "test"
            self.backend = TauBenchBackend(category, split, int(m.group(1)), self.user_adapter, where)
        self.tools_listed = False

    # -------------------------------------------------------------- episode
    def _reset(self):
        self.tools_listed = False
        opening = self.backend.reset()
        return self.prompt("reset_feedback", opening=opening), {
            "task_id": self.task_id, "backend": self.backend.kind, "user_id": self.record["info"]["task"]["user_id"]}

    def _search(self, content: str):
        query = content.strip().lower()
        if query == "tools":
            if self.tools_listed:
                return self.prompt("tools_repeat"), 0.0, False, {}
            self.tools_listed = True
            return self.tools_text(), 0.0, False, {}
        if query == "help":
            return self.prompt("help", policy=self.backend.policy.strip()), 0.0, False, {}
        return self.prompt("search_unsupported", query=query), 0.0, False, {}

    def _action(self, content: str):
        observation, reward, done, info = self.backend.respond(content)
        return observation, reward, done, {"tool": RESPOND, **info}

    def _answer(self, content: str):
        try:
            name, args = parse_tool_call(content)
        except ValueError as e:
            return self.prompt("invalid_tool_call"), 0.0, False, {"invalid_tool_call": str(e)}
        observation, reward, done, info = self.backend.call(name, args)
        return observation, reward, done, {"tool": name, **info}

    def tools_text(self) -> str:
        lines = [self.prompt("tools_header")]
        for tool in self.backend.tools_info:
            fn = tool.get("function", {})
            lines.append(f"- {fn.get('name', '?')}: {fn.get('description', '')}")
            params = fn.get("parameters", {})
            required = set(params.get("required", []))
            for arg, spec in params.get("properties", {}).items():
                kind = spec.get("type", "any")
                if kind == "array":
                    kind = f"list of {spec.get('items', {}).get('type', 'any')}"
                need = "required" if arg in required else "optional"
                lines.append(f"    {arg} ({kind}, {need}): {spec.get('description', '')}")
        return "\n".join(lines)

    # -------------------------------------------------------------- construction
    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "TauEnv":
        key = str(task.create_kwargs.get("id", task.id))
        path = data_file(TRAIN_FILE if "train" in key else TEST_FILE, data_dir)
        records = load_records(path)
        if key not in records:
            raise EnvError(f"{path}: no task with id {key!r} (task {task.source or task.id})")
        record = records[key]
        where = f"{path}, id {key!r}"
        db, policy = None, ""
        if record.get("env") == LOCAL_ENV:
            db_path = data_file(DB_FILE, data_dir)
            db = validate_db(read_json(db_path), str(db_path))
            policy = data_file(POLICY_FILE, data_dir).read_text(encoding="utf-8")
        if max_steps is None and task.create_kwargs.get("max_turns") is not None:
            max_steps = int(task.create_kwargs["max_turns"])
        return build_gym(cls, options, record, db=db, policy=policy, where=where, user=user, judge=judge,
                         seed=seed, max_steps=max_steps)


__all__ = ["TauEnv", "TOOLS", "STOP_MARKER", "LOCAL_ENV", "ChatModelUser", "LocalRetailBackend", "TauBenchBackend",
           "run_tool", "db_hash", "parse_tool_call", "load_records", "validate_db"]
