"""FunctionGym (envs/userrl/function.py): every feedback/reward branch of UserRL's rules, the hidden rules checked on
random inputs against an evaluator written here (a hand-written lambda per shipped rule), the safe rule parser, the
data/task loaders and an episode through `run_episodes`. Expected texts are the module's FB_* constants."""

import json
import math
import random
import shutil

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import EnvError, tool_call_text
from mimesis_jax.envs.userrl import DATA_DIR, TASKS_DIR, load_tasks, make_env
from mimesis_jax.envs.userrl.common import load_prompts
from mimesis_jax.envs.userrl import function as fn
from mimesis_jax.envs.userrl.function import FunctionGym, load_functions
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

RESET, INVALID, NO_NUMBERS, NOT_FOUR = fn.FB_RESET, fn.FB_INVALID, fn.FB_NO_NUMBERS, fn.FB_NOT_FOUR
TEST_CASE, CALC_ERROR, SEARCH_ONLY = fn.FB_TEST_CASE, fn.FB_CALC_ERROR, fn.FB_SEARCH_ONLY_TEST
EMPTY, NOT_NUMBER, CORRECT, WRONG = fn.FB_ANSWER_EMPTY, fn.FB_ANSWER_NOT_NUMBER, fn.FB_CORRECT, fn.FB_WRONG


def result(numbers: str, value) -> str:
    """The [action] feedback for inputs shown as `numbers` (a list of floats as text) and the rounded `value`."""
    return fn.FB_RESULT.format(numbers=numbers, result=value)


def case_text(case) -> str:
    return fn.FB_TEST_CASE_IS.format(test_case=case)


REFUSING_USER = "As an AI language model, I cannot pretend to be a user."

# The shipped rules, written by hand as Python (independent of the implementation's parser/evaluator).
RULES = {
    "func-1": ("a * b + c - d", lambda a, b, c, d: a * b + c - d),
    "func-2": ("(a + b) * (c - d)", lambda a, b, c, d: (a + b) * (c - d)),
    "func-3": ("a ** 2 + b * c - d", lambda a, b, c, d: a * a + b * c - d),
    "func-4": ("(b - a) * c + d ** 2", lambda a, b, c, d: (b - a) * c + d * d),
    "func-5": ("a * d - b * c", lambda a, b, c, d: a * d - b * c),
    "func-6": ("(a + c) / d + b", lambda a, b, c, d: (a + c) / d + b),
    "func-7": ("c ** 2 - a * b + d", lambda a, b, c, d: c * c - a * b + d),
    "func-8": ("(d - b) ** 2 + a * c", lambda a, b, c, d: (d - b) * (d - b) + a * c),
    "func-9": ("a / b * c - d", lambda a, b, c, d: a / b * c - d),
    "func-10": ("b * (c + d) - a ** 2", lambda a, b, c, d: b * (c + d) - a * a),
    "func-11": ("-a + b * d - c", lambda a, b, c, d: b * d - a - c),
    "func-12": ("(a * c - b) / (d + 1)", lambda a, b, c, d: (a * c - b) / (d + 1)),
    "func-13": ("d * (a - c) ** 2 + b", lambda a, b, c, d: d * (a - c) * (a - c) + b),
    "func-14": ("c * d - b ** a", lambda a, b, c, d: c * d - pow(b, a)),
}


def expected_feedback(fid, nums):
    """What UserRL answers to `[action] nums`, computed here from the hand-written rule."""
    rule = RULES[fid][1]
    floats = [float(x) for x in nums]
    try:
        value = rule(*floats)
    except (ZeroDivisionError, OverflowError):
        return CALC_ERROR
    if isinstance(value, complex):
        return CALC_ERROR
    shown = "[" + ", ".join(repr(x) for x in floats) + "]"
    return result(shown, round(value, 4))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def shipped():
    with open(DATA_DIR / "functions.json", encoding="utf-8") as f:
        return {r["id"]: r for r in json.load(f)}


def _env(fid="func-1", **kw):
    env = FunctionGym(fid, **kw)
    obs, info = env.reset()
    assert obs == {"feedback": RESET} and info["function_id"] == fid
    return env


def _write(tmp_path, records, sub=None):
    folder = tmp_path if sub is None else tmp_path / sub
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "functions.json"
    path.write_text(json.dumps(records, indent=4), encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ data
def test_shipped_data_format_and_expected_results(shipped):
    assert 10 <= len(shipped) <= 15 and set(shipped) == set(RULES)
    for fid, rec in shipped.items():
        assert set(rec) == {"id", "rule", "test_case", "expected_result"}
        assert rec["rule"] == RULES[fid][0]
        assert len(rec["test_case"]) == 4 and all(type(x) is int for x in rec["test_case"])
        assert isinstance(rec["expected_result"], float)
        assert math.isclose(RULES[fid][1](*map(float, rec["test_case"])), rec["expected_result"], abs_tol=1e-9)
    assert set(load_functions()) == set(shipped)
    assert (DATA_DIR / "functions.json").stat().st_size < 50_000


@pytest.mark.parametrize("fid", sorted(RULES, key=lambda s: int(s.split("-")[1])))
def test_hidden_rule_on_random_inputs(fid, shipped):
    rng = random.Random(f"functiongym-{fid}")
    env = _env(fid, max_steps=10_000)
    test_case = [float(x) for x in shipped[fid]["test_case"]]
    errors = 0
    for k in range(200):
        if k % 5 == 4:  # one draw in five with decimals (UserRL reads floats too)
            nums = [round(rng.uniform(-6, 6), 1) for _ in range(4)]
        else:
            nums = [rng.randint(-10, 10) for _ in range(4)]
        sep = ", " if k % 3 == 0 else " "
        obs, reward, terminated, truncated, info = env.step("[action] " + sep.join(str(x) for x in nums))
        want = TEST_CASE if [float(x) for x in nums] == test_case else expected_feedback(fid, nums)
        assert obs["feedback"] == want, (fid, nums)
        assert (reward, terminated, truncated) == (0.0, False, False)
        errors += want == CALC_ERROR
    assert env.step_count == 200
    if fid in ("func-6", "func-9", "func-12"):  # divisions meet zero denominators among 200 draws
        assert errors > 0


def test_action_parsing_branches():
    env = _env("func-1")  # a * b + c - d, test case [4, 7, 2, 9]
    cases = [
        ("[action]", NO_NUMBERS),
        ("[action]    ", NO_NUMBERS),
        ("[action] 1 2 3", NOT_FOUR),
        ("[action] 1 2 3 4 5", NOT_FOUR),
        ("[action] one two three four", NOT_FOUR),
        ("[action] 1,2,3,4", result("[1.0, 2.0, 3.0, 4.0]", 1.0)),
        ("[action]1 2 3 4", result("[1.0, 2.0, 3.0, 4.0]", 1.0)),
        ("[action] a=2, b=3, c=-1, d=0.5", result("[2.0, 3.0, -1.0, 0.5]", 4.5)),
        ("[action] 1.25 2 3 4", result("[1.25, 2.0, 3.0, 4.0]", 1.5)),
        ("[action] 0.1 0.2 0 0", result("[0.1, 0.2, 0.0, 0.0]", 0.02)),  # round(.., 4)
        ("[action] 0.123 0.456 0 0", result("[0.123, 0.456, 0.0, 0.0]", round(0.123 * 0.456, 4))),
    ]
    for text, want in cases:
        obs, reward, terminated, truncated, _ = env.step(text)
        assert (obs["feedback"], reward, terminated, truncated) == (want, 0.0, False, False), text


def test_test_case_is_refused_exactly_as_numbers_in_order():
    env = _env("func-1")
    for text in ("[action] 4 7 2 9", "[action] 4.0, 7, 2.0, 9", "[action]   4 7 2 9.0  "):
        obs, reward, terminated, _, info = env.step(text)
        assert (obs["feedback"], reward, terminated) == (TEST_CASE, 0.0, False) and info["test_case_refused"]
    obs, *_ = env.step("[action] 7 4 2 9")  # same numbers, other order: evaluated
    assert obs["feedback"] == result("[7.0, 4.0, 2.0, 9.0]", 21.0)


def test_arithmetic_failures_give_the_error_feedback():
    env6 = _env("func-6")  # (a + c) / d + b
    assert env6.step("[action] 1 2 3 0")[0]["feedback"] == CALC_ERROR
    env14 = _env("func-14")  # c * d - b ** a
    assert env14.step("[action] 0.5 -2 1 1")[0]["feedback"] == CALC_ERROR  # complex power
    assert env14.step("[action] 400 10 1 1")[0]["feedback"] == CALC_ERROR  # float overflow
    assert env14.step("[action] -1 0 1 1")[0]["feedback"] == CALC_ERROR  # 0 ** -1
    obs, reward, terminated, truncated, _ = env14.step("[action] -1 2 3 1")
    assert obs["feedback"] == result("[-1.0, 2.0, 3.0, 1.0]", 2.5)
    assert (reward, terminated, truncated, env14.done) == (0.0, False, False, False)


def test_search_branches():
    env = _env("func-3")
    for text in ("[search] test", "[search] TEST", "[search]test", "[search]   Test  "):
        obs, reward, terminated, _, _ = env.step(text)
        assert (obs["feedback"], reward, terminated) == (case_text([5, 2, 8, 6]), 0.0, False)
    for text in ("[search] rule", "[search]", "[search] test case", "[search] the test"):
        assert env.step(text)[0]["feedback"] == SEARCH_ONLY


def test_answer_branches_and_correct_answer_ends_episode(shipped):
    env = _env("func-6")  # expected 6.5
    expected = shipped["func-6"]["expected_result"]
    for text, want in (("[answer]", EMPTY), ("[answer] six and a half", NOT_NUMBER), ("[answer] 6.5.1", NOT_NUMBER),
                       ("[answer] 7", WRONG), ("[answer] nan", WRONG), ("[answer] 6.50001", WRONG)):
        obs, reward, terminated, truncated, _ = env.step(text)
        assert (obs["feedback"], reward, terminated, truncated) == (want, 0.0, False, False), text
    assert abs(6.5000005 - expected) <= 1e-6  # within UserRL's tolerance
    obs, reward, terminated, truncated, info = env.step("[answer] 6.5000005")
    assert (obs["feedback"], reward, terminated, truncated) == (CORRECT, 1.0, True, False)
    assert info["submitted_answer"] == 6.5000005 and env.done
    with pytest.raises(EnvError, match="ended"):
        env.step("[answer] 6.5")
    env.reset()  # a fresh episode of the same rule
    assert env.step("[answer] 6.5")[1:3] == (1.0, True)


def test_answer_tolerance_is_1e6_not_the_4_digit_rounding(tmp_path):
    path = _write(tmp_path, [{"id": "func-x", "rule": "a / b", "test_case": [10, 3, 1, 1],
                              "expected_result": 10 / 3}])
    env = FunctionGym("func-x", data_dir=path.parent)
    env.reset()
    assert abs(3.3333 - 10 / 3) > 1e-6 and abs(3.3333335 - 10 / 3) <= 1e-6
    assert env.step("[answer] 3.3333")[1:3] == (0.0, False)  # what an [action] would show, rounded: wrong
    assert env.step("[answer] 3.333333333")[1:3] == (1.0, True)


def test_invalid_format_finish_and_truncation():
    env = _env("func-2")
    for text in ("hello", "[ACTION] 1 2 3 4", "[actions] 1 2 3 4", "action: 1 2 3 4"):
        obs, reward, terminated, _, info = env.step(text)
        assert (obs["feedback"], reward, terminated) == (INVALID, 0.0, False) and "invalid_action" in info
    assert env.invalid_action("no <tool_call> found")[0]["feedback"] == INVALID
    obs, reward, terminated, truncated, _ = env.step("[finish]")
    assert (reward, terminated, truncated) == (0.0, True, False)
    assert obs["feedback"] == fn.FB_FINISH_WRONG.format(expected=63.0)

    env = _env("func-2")  # default 15 steps: UserRL's InteractTool.create(max_turns=15)
    for i in range(14):
        assert env.step("[action] 1 1 1 1")[2:4] == (False, False)
    assert env.step("[action] 1 1 1 1")[2:4] == (False, True) and env.done


def test_reward_options_step_penalty_and_normalisation():
    env = _env("func-1", step_penalty=0.1, correct_answer_reward=2.0)
    assert env.step("[search] test")[1] == pytest.approx(-0.1)
    assert env.step("[answer] 21")[1] == pytest.approx(2.0 - 0.2)
    env = _env("func-1", step_penalty=0.1, normalize_rewards=True, incorrect_answer_reward=-1.0,
               correct_answer_reward=2.0)
    assert env.step("[answer] 3")[1] == 0.0  # -1.1 clipped to [0, 1]
    assert env.step("[answer] 21")[1] == 1.0  # 1.8 clipped
    with pytest.raises(EnvError, match="unknown options"):
        make_env(load_tasks(TASKS_DIR / "function_train.jsonl")[0], bonus=1)


def test_no_model_is_ever_called():
    user, judge = ScriptedChatModel([REFUSING_USER]), ScriptedChatModel(["not json"])
    env = make_env(load_tasks(TASKS_DIR / "function_train.jsonl")[0], user=user, judge=judge)
    env.reset()
    for text in ("[search] test", "[action] 1 2 3 4", "[answer] 5", "[answer] 21"):
        _, _, _, _, info = env.step(text)
        assert info["to_user"] is None and "user_utterance" not in info
    assert user.calls == [] and judge.calls == []


# ------------------------------------------------------------------------------------------- rule parser
MALFORMED_RULES = [
    "a + import os", "__import__('os').system('true')", "a.real + b", "a // b", "a % b", "abs(a) + b", "e * a",
    "(lambda: 1)()", "a if b else c", "[a, b][0]", "'a' * 3", "a < b", "True + a", "2j * a", "+a - b", "a; b",
    "a +", "", "   ", "a & b", "a[0]", "not a", "x * 2", "{a: b}",
]


@pytest.mark.parametrize("rule", MALFORMED_RULES)
def test_malformed_rules_are_rejected_with_the_rule_id(tmp_path, rule):
    path = _write(tmp_path, [{"id": "func-ok", "rule": "a + b", "test_case": [1, 2, 3, 4], "expected_result": 3.0},
                             {"id": "func-bad", "rule": rule, "test_case": [1, 2, 3, 4], "expected_result": 1.0}])
    with pytest.raises(EnvError) as e:
        load_functions(path)
    msg = str(e.value)
    assert str(path) in msg and "record 1" in msg and "func-bad" in msg and "'rule'" in msg


def test_malformed_rule_reported_through_make_env(tmp_path):
    _write(tmp_path, [{"id": "func-1", "rule": "__import__('os')", "test_case": [1, 2, 3, 4],
                       "expected_result": 1.0}])
    task = load_tasks(TASKS_DIR / "function_train.jsonl")[0]
    with pytest.raises(EnvError, match=r"func-1.*'rule'.*not a FunctionGym rule"):
        make_env(task, data_dir=tmp_path)


def test_allowed_rule_forms_evaluate(tmp_path):
    path = _write(tmp_path, [
        {"id": "f1", "rule": "-(a - b) ** 2 / -d + 2.5", "test_case": [1, 1, 1, 1], "expected_result": 2.5},
        {"id": "f2", "rule": "((c))", "test_case": [1, 1, 1, 1], "expected_result": 1.0},
        {"id": "f3", "rule": "2 ** 3 + 1", "test_case": [1, 1, 1, 1], "expected_result": 9.0},
    ])
    recs = load_functions(path)
    env = FunctionGym("f1", data_dir=tmp_path)
    env.reset()
    assert env.step("[action] 5 2 0 -3")[0]["feedback"] == result("[5.0, 2.0, 0.0, -3.0]",
                                                                 round(-(5.0 - 2.0) ** 2 / 3.0 + 2.5, 4))
    assert recs["f2"].evaluate([1, 2, 7, 4]) == 7.0
    env = FunctionGym("f3", data_dir=tmp_path)
    env.reset()
    assert env.step("[action] 2 2 2 2")[0]["feedback"] == result("[2.0, 2.0, 2.0, 2.0]", 9)


# ------------------------------------------------------------------------------------------------ loaders
@pytest.mark.parametrize("record,needle", [
    ({"id": "func-1", "test_case": [1, 2, 3, 4], "expected_result": 1.0}, "missing field 'rule'"),
    ({"id": "func-1", "rule": "a", "test_case": [1, 2, 3], "expected_result": 1.0}, "field 'test_case'"),
    ({"id": "func-1", "rule": "a", "test_case": [1, True, 3, 4], "expected_result": 1.0}, "field 'test_case'"),
    ({"id": "func-1", "rule": "a", "test_case": "1 2 3 4", "expected_result": 1.0}, "field 'test_case'"),
    ({"id": "func-1", "rule": "a", "test_case": [1, 2, 3, 4], "expected_result": "1.0"}, "field 'expected_result'"),
    ({"id": "func-1", "rule": "a", "test_case": [1, 2, 3, 4]}, "missing field 'expected_result'"),
    ({"id": "func-1", "rule": 5, "test_case": [1, 2, 3, 4], "expected_result": 1.0}, "field 'rule'"),
    ({"rule": "a", "test_case": [1, 2, 3, 4], "expected_result": 1.0}, "missing field 'id'"),
])
def test_malformed_record_names_file_and_field(tmp_path, record, needle):
    path = _write(tmp_path, [record])
    with pytest.raises(EnvError) as e:
        load_functions(path)
    assert str(path) in str(e.value) and needle in str(e.value)


def test_duplicate_ids_and_non_list_file(tmp_path):
    rec = {"id": "func-1", "rule": "a", "test_case": [1, 2, 3, 4], "expected_result": 1.0}
    with pytest.raises(EnvError, match="duplicate id 'func-1'"):
        load_functions(_write(tmp_path, [rec, rec]))
    with pytest.raises(EnvError, match="expected a list"):
        load_functions(_write(tmp_path / "x", {"func-1": rec}))


def test_unknown_task_id_names_the_id_and_file():
    task = load_tasks(TASKS_DIR / "function_test.jsonl")[0]
    task.create_kwargs = {"id": "func-999"}
    with pytest.raises(EnvError, match=r"functions\.json.*'func-999'"):
        make_env(task)


def test_data_dir_may_hold_userrl_layout(tmp_path, shipped):
    # the loader finds functions.json below a checkout of UserRL's gyms/ folder
    target = tmp_path / "gyms" / "FunctionGym" / "functiongym" / "data"
    target.mkdir(parents=True)
    shutil.copy(DATA_DIR / "functions.json", target / "functions.json")
    env = make_env(load_tasks(TASKS_DIR / "function_test.jsonl")[0], data_dir=tmp_path)
    env.reset()
    assert env.step("[search] test")[0]["feedback"] == case_text(shipped['func-10']['test_case'])


def test_task_files(shipped):
    prompts = load_prompts("function")
    for split, n in (("train", 9), ("test", 5)):
        tasks = load_tasks(TASKS_DIR / f"function_{split}.jsonl")
        assert len(tasks) == n
        for i, t in enumerate(tasks):
            assert t.gym == "FunctionGym" and t.id in shipped and t.create_kwargs == {"id": t.id}
            assert (t.data_source, t.ability, t.split, t.index) == ("interact_function", "interaction", split, i)
            assert t.reward_model == {"ground_truth": str(shipped[t.id]["expected_result"]), "style": "rule"}
            assert [m["role"] for m in t.prompt] == ["system", "user"]
            assert t.prompt[0]["content"] == prompts["system"] and t.prompt[1]["content"] == prompts["opening"]
            assert len(t.prompt[0]["content"]) < 3000  # well under 1,000 tokens
            with open(t.source.split(", row")[0], encoding="utf-8") as f:
                row = json.loads(f.readlines()[i])
            assert row["reward_model"]["env_name"] == "FunctionGym" and row["reward_model"]["id"] == t.id
            assert row["extra_info"]["need_tools_kwargs"] is True
    train = {t.id for t in load_tasks(TASKS_DIR / "function_train.jsonl")}
    test = {t.id for t in load_tasks(TASKS_DIR / "function_test.jsonl")}
    assert not train & test


def test_max_turns_from_create_kwargs_and_override():
    task = load_tasks(TASKS_DIR / "function_train.jsonl")[0]
    task.create_kwargs = {"id": task.id, "max_turns": 3}
    env = make_env(task)
    assert env.max_steps == 3 and make_env(task, max_steps=5).max_steps == 5
    env.reset()
    assert [env.step("[action] 1 1 1 1")[3] for _ in range(3)] == [False, False, True]


# --------------------------------------------------------------------------------------------- episodes
def test_end_to_end_episode(tok, shipped):
    task = load_tasks(TASKS_DIR / "function_train.jsonl")[0]  # func-1: a * b + c - d, test case [4, 7, 2, 9]
    assert task.id == "func-1"
    user = ScriptedChatModel([REFUSING_USER])  # never asked: FunctionGym has no user
    env = make_env(task, user=user)
    replies = [tool_call_text("search", "test"), tool_call_text("action", "1 2 3 4"),
               "<tool_call>\n{broken json}\n</tool_call>", tool_call_text("action", "4 7 2 9"),
               tool_call_text("answer", "20"), "Now I know.\n" + tool_call_text("answer", "21")]
    agent = ScriptedAgent(tok, replies)
    [traj] = run_episodes(agent, user, [EpisodeTask(env=env, agent_messages=task.prompt)],
                          EpisodeConfig(max_turns=16), tokenizer=tok)
    assert traj.status == "ok" and traj.invalid_reason is None
    assert traj.turn_rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 6
    assert traj.meta["reset_feedback"] == RESET
    assert [i["feedback"] for i in traj.env_info] == [
        case_text([4, 7, 2, 9]), result("[1.0, 2.0, 3.0, 4.0]", 1.0), INVALID, TEST_CASE, WRONG,
        CORRECT]
    assert traj.env_info[2]["tool_error"].startswith("tool call is not valid JSON")
    # the env's own user turns are recorded (none here: no user side) and the simulator was never called
    assert traj.user_utterances == [None] * 6 and traj.user_thoughts == [None] * 6 and user.calls == []
    # the agent saw each step's feedback and reward
    assert case_text([4, 7, 2, 9]) + "\nReward: 0.0" in tok.decode(agent.prompts[1])
    assert all(shipped["func-1"]["rule"] not in tok.decode(p) for p in agent.prompts)  # the rule stays hidden


def test_episode_turn_limit_and_env_truncation(tok):
    task = load_tasks(TASKS_DIR / "function_test.jsonl")[0]
    agent = ScriptedAgent(tok, [tool_call_text("action", "1 2 3 4")])
    trajs = run_episodes(agent, None, [EpisodeTask(env=make_env(task), agent_messages=task.prompt),
                                       EpisodeTask(env=make_env(task, max_steps=3), agent_messages=task.prompt)],
                         EpisodeConfig(max_turns=12), tokenizer=tok)  # under the env's default 15 steps
    assert trajs[0].meta["end_reason"] == "turn_limit" and trajs[0].meta["turns"] == 12
    assert trajs[1].meta["end_reason"] == "truncated" and trajs[1].turn_rewards == [0.0, 0.0, 0.0]
    assert all(t.status == "ok" for t in trajs)
