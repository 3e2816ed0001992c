"""IntentionGym: importance rewards with the multi-detail penalty, only newly covered details, termination, what the
responder and the evaluator see, retries and INVALID paths, the shipped data and tasks, and a runner episode."""

import json

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import tool_call_text
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.userrl import make_env, shipped_tasks
from mimesis_jax.envs.userrl.common import DATA_DIR
from mimesis_jax.envs.userrl.intention import IntentionEnv
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

BASE = {3: 1.0, 2: 0.7, 1: 0.4}


def expected_reward(importances) -> float:
    """The rule written out: the top importance's value, minus 0.2 per extra detail, floored at 0."""
    if not importances:
        return 0.0
    return max(0.0, BASE[max(importances)] - 0.2 * (len(importances) - 1))


def record(importances, rid="R1"):
    return {"id": rid, "category": "Cooking", "task": "Cook me something.",
            "missing_details": [{"description": f"DETAIL-{i}", "importance": str(imp), "inquiry": f"Ask about {i}?",
                                 "options": [f"OPT-{i}a", f"OPT-{i}b"]} for i, imp in enumerate(importances)]}


def judge_says(*index_lists, related=True):
    return [json.dumps({"analysis": "ok", "is_task_related": related, "covered_detail_indices": list(x)})
            for x in index_lists]


def responder(*texts):
    return [json.dumps({"thought": f"thinking {i}", "response": t}) for i, t in enumerate(texts)]


def make(importances, user_replies, judge_replies, **kw):
    user = ScriptedChatModel(user_replies, cycle=False)
    judge = ScriptedChatModel(judge_replies, cycle=False)
    env = IntentionEnv(record(importances), user=user, judge=judge, **kw)
    env.reset()
    return env, user, judge


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


# ------------------------------------------------------------------------------------ rewards
@pytest.mark.parametrize("importances", [[3], [2], [1], [3, 1], [2, 2], [1, 1], [2, 1, 1], [3, 3, 3],
                                         [1, 1, 1], [2, 1, 1, 1], [1, 1, 1, 1], [3, 2, 2, 1, 1]])
def test_reward_by_top_importance_minus_penalty(importances):
    n = len(importances)
    env, _, _ = make(importances + [1], responder("answer"), judge_says(range(n)))
    _, reward, terminated, _, info = env.step("[action] a broad question")
    assert reward == expected_reward(importances)  # plain float arithmetic, as UserRL (0.7 - 0.2 != 0.5)
    assert not terminated and info["remaining"] == 1 and info["covered_indices"] == list(range(n))


def test_no_coverage_and_not_task_related_give_zero():
    env, _, _ = make([3, 2], responder("a", "b"), judge_says([]) + judge_says([0, 1], related=False))
    assert env.step("[action] how is the weather?")[1] == 0.0
    _, r, _, _, info = env.step("[action] tell me a joke")
    assert r == 0.0 and info["remaining"] == 2


def test_only_newly_covered_details_count_and_indices_follow_the_remaining_list():
    # details 0 (imp 1), 1 (imp 3), 2 (imp 2). Cover 1 first; then index 1 means the former detail 2.
    env, _, judge = make([1, 3, 2], responder("a", "b", "c"), judge_says([1], [1], [0]))
    rewards, ends = [], []
    for q in ["main thing?", "second thing?", "last thing?"]:
        _, r, term, trunc, info = env.step(f"[action] {q}")
        rewards.append(r)
        ends.append((term, trunc))
    assert rewards == [expected_reward([3]), expected_reward([2]), expected_reward([1])]
    assert ends == [(False, False), (False, False), (True, False)]
    second_prompt = judge.calls[1][1]["content"]
    assert "DETAIL-1" not in second_prompt and "0. [LOW] DETAIL-0" in second_prompt
    assert "1. [MEDIUM] DETAIL-2" in second_prompt and "Ask about 2?" in second_prompt
    assert "OPT-" not in second_prompt


def test_repeated_out_of_range_negative_and_string_indices():
    env, _, _ = make([2, 1, 1], responder("a"), [json.dumps(
        {"is_task_related": True, "covered_detail_indices": [0, 0, "1", 7, -1, 1.0, True, " 2"]})])
    _, r, _, _, info = env.step("[action] q")
    assert info["covered_indices"] == [0, 1] and r == expected_reward([2, 1]) and info["remaining"] == 1


def test_truncated_at_max_steps_with_details_left():
    env, _, _ = make([3, 3], responder("a", "b"), judge_says([], [0]), max_steps=2)
    assert env.step("[action] q1")[2:4] == (False, False)
    _, r, term, trunc, _ = env.step("[action] q2")
    assert r == 1.0 and (term, trunc) == (False, True)


def test_all_covered_in_one_question_terminates():
    env, _, _ = make([3, 2], responder("a"), judge_says([1, 0]))
    _, r, term, trunc, info = env.step("[action] everything?")
    assert r == expected_reward([3, 2]) and term and not trunc and info["coverage"] == 1.0


# ------------------------------------------------------------------------------------ what each side sees
def test_responder_sees_no_missing_details_and_only_its_response_reaches_the_agent():
    env, user, judge = make([3], [json.dumps({"thought": "PRIVATE", "response": "I am vegetarian."})], judge_says([0]))
    obs, _, _, _, info = env.step("[action] Any dietary needs?")
    assert obs["feedback"] == "I am vegetarian." and "PRIVATE" not in obs["feedback"]
    assert info["user_thought"] == "PRIVATE" and info["user_utterance"] == "I am vegetarian."
    seen = "\n".join(m["content"] for m in user.calls[0])
    assert "Cook me something." in seen and "Cooking" in seen and "Any dietary needs?" in seen
    assert "DETAIL-" not in seen and "OPT-" not in seen and "Ask about" not in seen
    judged = judge.calls[0][1]["content"]
    assert "DETAIL-0" in judged and "Any dietary needs?" in judged


def test_responder_sees_record_option_reproduces_userrl():
    env, user, _ = make([3], responder("ok"), judge_says([0]), responder_sees_record=True)
    env.step("[action] q")
    assert "DETAIL-0" in user.calls[0][1]["content"] and "OPT-0a" in user.calls[0][1]["content"]


def test_history_window_and_choices():
    env, user, judge = make([1] * 6, responder(*"abcde"), judge_says(*[[]] * 5))
    for q in ["[action] q1", "[answer] q2", "[search] q3", "[action] q4", "[action] q5"]:
        env.step(q)
    last_user, last_judge = user.calls[-1][1]["content"], judge.calls[-1][1]["content"]
    assert "Helper: [search] q3" in last_user and "Helper: q4" in last_user and "q1" not in last_user
    assert "Helper: q2" in last_user and "You: b" in last_user  # the last 3 exchanges: q2, [search] q3, q4
    assert "Q1: q2\nA1: b" in last_judge and "Q3: q4\nA3: d" in last_judge and "q1" not in last_judge
    assert "The helper now asks: q5" in last_user


def test_plain_text_responder_reply_is_the_response():
    env, _, _ = make([3], ["<think>\nhm\n</think>\n\nI want it quick."], judge_says([0]), user_thinking=True)
    obs, _, _, _, info = env.step("[action] q")
    assert obs["feedback"] == "I want it quick." and info["user_thought"] == "hm"


# ------------------------------------------------------------------------------------ INVALID paths
def test_judge_unparseable_once_is_retried():
    env, _, judge = make([2, 1], responder("a"), ["I think it covers the first one."] + judge_says([0]))
    _, r, _, _, _ = env.step("[action] q")
    assert r == expected_reward([2]) and len(judge.calls) == 2


@pytest.mark.parametrize("bad", ["no json", json.dumps({"analysis": "x"}),
                                 json.dumps({"covered_detail_indices": "0"})])
def test_judge_unparseable_twice_is_invalid(bad):
    env, _, judge = make([2], responder("a"), [bad, bad])
    with pytest.raises(InvalidEpisode, match="judge's answer did not parse twice"):
        env.step("[action] q")
    assert len(judge.calls) == 2


def test_refusing_responder_is_invalid_without_asking_the_judge():
    env, user, judge = make([2], ["As an AI language model, I cannot pretend to be a person asking for help."],
                            judge_says([0]))
    with pytest.raises(InvalidEpisode, match="refused its role"):
        env.step("[action] q")
    assert len(user.calls) == 1 and judge.calls == []


def test_responder_json_without_response_retried_then_invalid():
    bad = json.dumps({"thought": "only a thought"})
    env, user, _ = make([2], [bad] + responder("fine"), judge_says([0]))
    assert env.step("[action] q")[0]["feedback"] == "fine" and len(user.calls) == 2
    env, user, _ = make([2], [bad, bad], judge_says([0]))
    with pytest.raises(InvalidEpisode, match="responder's answer did not parse twice"):
        env.step("[action] q")


# ------------------------------------------------------------------------------------ data and tasks
def test_shipped_data_and_tasks_resolve():
    for name in ("all_intentions_test.json", "all_intentions_train.json"):
        data = json.loads((DATA_DIR / name).read_text())
        assert data and all(set(r) == {"id", "category", "task", "missing_details"} for r in data)
        assert all(set(d) == {"description", "importance", "inquiry", "options"}
                   for r in data for d in r["missing_details"])
    tasks = shipped_tasks("test", ["IntentionGym"])
    assert 5 <= len(tasks) and shipped_tasks("train", ["IntentionGym"]) == []
    test_ids = {r["id"] for r in json.loads((DATA_DIR / "all_intentions_test.json").read_text())}
    for t in tasks:
        assert t.id in test_ids and t.data_source == "interact_intention"
        env = make_env(t, user=ScriptedChatModel(responder("x")), judge=ScriptedChatModel(judge_says([])))
        obs, info = env.reset()
        assert t.create_kwargs["task"] in obs["feedback"] and env.max_steps == 15
        assert t.reward_model["ground_truth"] == ", ".join(d["description"] for d in env.intention["missing_details"])


def _write(tmp_path, train, test):
    (tmp_path / "all_intentions_train.json").write_text(json.dumps(train))
    (tmp_path / "all_intentions_test.json").write_text(json.dumps(test))
    return tmp_path


def _task_with_id(tid):
    [t] = shipped_tasks("test", ["IntentionGym"])[:1]
    t.create_kwargs["id"] = tid
    return t


def test_malformed_record_names_file_record_and_field(tmp_path):
    bad = record([2], "B")
    bad["missing_details"][0]["importance"] = "4"
    d = _write(tmp_path, [record([1], "A")], [record([3], "C"), bad])
    with pytest.raises(EnvError, match=r"all_intentions_test\.json, record 1 .*missing_details\[0\]: "
                                       r"field 'importance' is '4', not one of 1, 2, 3"):
        make_env(_task_with_id("C"), data_dir=d)
    del bad["missing_details"][0]["description"]
    d = _write(tmp_path, [record([1], "A")], [bad])
    with pytest.raises(EnvError, match=r"record 0 .*missing field 'description'"):
        make_env(_task_with_id("B"), data_dir=d)
    d = _write(tmp_path, [{"id": "A", "task": "t"}], [])
    with pytest.raises(EnvError, match=r"all_intentions_train\.json, record 0 .*missing field 'missing_details'"):
        make_env(_task_with_id("A"), data_dir=d)


def test_lookup_train_then_test_and_unknown_id(tmp_path):
    d = _write(tmp_path, [record([1], "A")], [record([3, 3], "B")])
    assert len(make_env(_task_with_id("B"), data_dir=d).intention["missing_details"]) == 2
    assert make_env(_task_with_id("A"), data_dir=d).intention["id"] == "A"
    with pytest.raises(EnvError, match="no task with id 'NOPE'"):
        make_env(_task_with_id("NOPE"), data_dir=d)
    with pytest.raises(EnvError, match="no task with id 'NOPE'"):
        make_env(_task_with_id("NOPE"))


# ------------------------------------------------------------------------------------ end to end
def test_episode_through_the_runner(tok):
    [task] = shipped_tasks("test", ["IntentionGym"])[:1]
    n = len(json.loads((DATA_DIR / "all_intentions_test.json").read_text())[0]["missing_details"])
    # 4 details (importances 3, 3, 2, 1): ask about one, two at once, a vague one, then the last
    assert n == 4
    user = ScriptedChatModel([json.dumps({"thought": f"SECRET-{i}", "response": f"reply {i}"}) for i in range(4)],
                             cycle=False)
    judge = ScriptedChatModel(judge_says([0], [0, 1], []) + ["not json"] + judge_says([0]), cycle=False)
    env = make_env(task, user=user, judge=judge)
    agent = ScriptedAgent(tok, [tool_call_text("action", f"question {i}") for i in range(4)])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)],
                          EpisodeConfig(max_turns=10))
    assert traj.status == "ok" and traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 4
    assert traj.turn_rewards == [expected_reward([3]), expected_reward([3, 2]), 0.0, expected_reward([1])]
    assert traj.user_thoughts == [f"SECRET-{i}" for i in range(4)]
    assert traj.user_utterances == [f"reply {i}" for i in range(4)]
    assert "SECRET" not in tok.decode(agent.prompts[-1]) and "reply 2" in tok.decode(agent.prompts[-1])


def test_invalid_episode_through_the_runner(tok):
    [task] = shipped_tasks("test", ["IntentionGym"])[:1]
    env = make_env(task, user=ScriptedChatModel(responder("sure")), judge=ScriptedChatModel(["???", "still ???"]))
    agent = ScriptedAgent(tok, [tool_call_text("action", "What do you need?")])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)],
                          EpisodeConfig(max_turns=4))
    assert traj.status == "invalid" and "did not parse twice" in traj.invalid_reason
    assert traj.meta["end_reason"] == "invalid"

    env = make_env(task, user=ScriptedChatModel(["As an AI language model, I cannot pretend to need help."]),
                   judge=ScriptedChatModel(judge_says([0])))
    [traj] = run_episodes(ScriptedAgent(tok, [tool_call_text("action", "q")]), None,
                          [EpisodeTask(env=env, agent_messages=task.prompt)], EpisodeConfig(max_turns=4))
    assert traj.status == "invalid" and "refused its role" in traj.invalid_reason
