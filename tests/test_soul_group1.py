"""SOUL tasks, group 1 (fantom, paratomi, lifechoices, mistakes, twinvoice): every one is a single-turn,
judge-free choice task. Samples load, the view carries the record, replies score exactly, bad records are named."""

import json
import re

import pytest

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul import base, fantom, lifechoices, mistakes, paratomi, twinvoice  # noqa: F401

TASKS = {"fantom": 6, "paratomi": 4, "lifechoices": 3, "mistakes": 4, "twinvoice": 3}


def _env(name, index):
    env = base.make_env(name, base.sample_records(name)[index])
    return env, env.reset()


@pytest.mark.parametrize("name,count", TASKS.items())
def test_samples_load_and_register(name, count):
    assert len(base.sample_records(name)) == count
    info = base.task_info(name)
    assert (info.family, info.multi_turn, info.real_format) == ("choice", False, True)
    for i in range(count):  # every sample renders and has a gold answer
        env, view = _env(name, i)
        assert view[-1]["role"] == "user" and env.gold()


@pytest.mark.parametrize("name,index,roles,present,absent", [
    ("fantom", 0, ["user"], ["Dario: I'm back. What did I miss?", "(b) Dario believes Noor and Yuki were chatting",
                             "## Notes\n(none)"], []),
    ("fantom", 2, ["user"], ["Dario left before the move was mentioned and was told something else.",
                             "Does Dario know which city his sister moved to"], ["(none)"]),
    ("paratomi", 1, ["user"], ["Lev strolled into the attic. The kite was inside the blue trunk. Lev carried",
                               "Where is the kite really?\n\nCandidate locations: blue_trunk, green_basket"], ["['"]),
    ("paratomi", 3, ["user"], ["Ines came into the laundry. The sock was in the black envelope.",
                               "Where was the sock at the beginning?"], ["Candidate locations"]),
    ("lifechoices", 0, ["user"], ["Marta Velez (from: The Salt Ledger)", "refused a bribe from the harbour master",
                                  "permanent mooring", "What does Marta do?",
                                  "A. Sign the report to secure her family's future.\nB. Refuse and report"], []),
    ("lifechoices", 2, ["user"], ["Elsbeth Rook (from: unknown)", "A. Decline and leave with the next northbound"],
     []),
    ("mistakes", 0, ["system", "user"], ["(one of A, B, C, D)", "What is 3 + 4 × 2?",
                                         "A. 11\nB. 14\nC. 10\nD. 24", "Carries out operations from left to right"],
     []),
    ("mistakes", 1, ["system", "user"], ["(one of A, B, C)", "A. 1/5\nB. 1/3\nC. They are equal"], ["D."]),
    ("mistakes", 2, ["system", "user"], ["Round 2.46 to one decimal place.", "truncating the extra digits"], []),
    ("twinvoice", 0, ["user"], ["- rain again. of course. lol\n- my dog ate", "long weekend?",
                                "B. hiking if the rain lets me"], []),
    ("twinvoice", 1, ["user"], ["- Thank you for your thoughtful reply; I appreciate the nuance.",
                                "A. lol no\nB. I would gently push back", "C. WRONG!!!"], ["D."]),
])
def test_view_carries_the_record(name, index, roles, present, absent):
    _, view = _env(name, index)
    assert [m["role"] for m in view] == roles
    text = "\n".join(m["content"] for m in view)
    for s in present:
        assert s in text
    for s in absent:
        assert s not in view[-1]["content"]


_P, _R = 1 / 4, 1 / 4  # fact F1 below: 1 common token of 4 answer tokens and 4 gold tokens (article dropped)


@pytest.mark.parametrize("name,index,reply,reward,predicted", [
    # fantom multiple-choice (gold index 1 -> b)
    ("fantom", 0, "He missed it. <answer>(b)</answer>", 1.0, "B"),
    ("fantom", 0, "<answer>a</answer>", 0.0, "A"),
    ("fantom", 0, "The answer is b.", 0.0, None),                                   # no tag
    ("fantom", 0, "<answer>neither</answer>", 0.0, None),
    # fantom list (correct Noor, Yuki; wrong Dario)
    ("fantom", 1, "<answer>Noor, Yuki</answer>", 1.0, "Noor, Yuki"),
    ("fantom", 1, "<answer>Noor, Yuki, Dario</answer>", 0.0, "Noor, Yuki, Dario"),   # a wrong name
    ("fantom", 1, "<answer>Noor</answer>", 0.0, "Noor"),                             # a name missing
    ("fantom", 1, "<answer>Noorah and Yukiko</answer>", 0.0, "Noorah and Yukiko"),   # not whole words
    ("fantom", 3, "<answer>dario, noor and yuki</answer>", 1.0, "dario, noor and yuki"),  # str gold, no wrong
    # fantom binary (gold no:long -> no; gold yes)
    ("fantom", 2, "<answer>No, he does not know.</answer>", 1.0, "No, he does not know."),
    ("fantom", 2, "<answer>Yes</answer>", 0.0, "Yes"),
    ("fantom", 2, "<answer>yes, or no, hard to say</answer>", 0.0, "yes, or no, hard to say"),  # hedge
    ("fantom", 4, "<answer>Yes, she heard it herself.</answer>", 1.0, "Yes, she heard it herself."),
    ("fantom", 4, "<answer>She knows.</answer>", 0.0, "She knows."),  # ' knows ' needs a word after it
    # fantom fact: token F1
    ("fantom", 5, "<answer>Lisbon for a design job</answer>", 1.0, "Lisbon for a design job"),
    ("fantom", 5, "<answer>She moved to Lisbon</answer>", 2 * _P * _R / (_P + _R), "She moved to Lisbon"),
    ("fantom", 5, "<answer>Porto</answer>", 0.0, "Porto"),
    # paratomi (gold wooden_crate, other candidate tin_bucket)
    ("paratomi", 0, "Hana did not see the move. <answer>wooden_crate</answer>", 1.0, "wooden_crate"),
    ("paratomi", 0, "<answer>wooden_crate or tin_bucket</answer>", 0.0, "wooden_crate or tin_bucket"),
    ("paratomi", 0, "<answer>tin_bucket</answer>", 0.0, "tin_bucket"),
    ("paratomi", 0, "<answer>big_wooden_crate</answer>", 0.0, "big_wooden_crate"),
    ("paratomi", 0, "Hana looks in the wooden_crate.", 0.0, None),
    ("paratomi", 3, "<answer>in the Black_Envelope</answer>", 1.0, "in the Black_Envelope"),
    # lifechoices (gold B; record 1: "B. ..." gold over 3 options)
    ("lifechoices", 0, "<answer>B</answer>", 1.0, "B"),
    ("lifechoices", 0, "<answer>A</answer>", 0.0, "A"),
    ("lifechoices", 0, "Hard to say what she would do.", 0.0, None),
    ("lifechoices", 1, "<answer>b</answer>", 1.0, "B"),
    ("lifechoices", 1, "<answer>D</answer>", 0.0, None),                         # not an offered letter
    # mistakes (gold = the misconception's wrong option)
    ("mistakes", 0, "Left to right: 3 + 4 = 7, times 2 is 14. <answer>B</answer>", 1.0, "B"),
    ("mistakes", 0, "<answer>A</answer>", 0.0, "A"),                             # the correct answer
    ("mistakes", 0, "I would say fourteen.", 0.0, None),
    ("mistakes", 1, "<answer>D</answer>", 0.0, None),                            # D is not offered
    ("mistakes", 2, "<answer>B</answer>", 1.0, "B"),                             # target_option 'b'
    # twinvoice (record 2: gold index 3 -> D)
    ("twinvoice", 2, "The lyrical one. <answer>D</answer>", 1.0, "D"),
    ("twinvoice", 2, "<answer>B</answer>", 0.0, "B"),
    ("twinvoice", 2, "no idea", 0.0, None),
])
def test_reply_scores(name, index, reply, reward, predicted):
    env, _ = _env(name, index)
    turn = env.step("thinking", reply)
    assert turn.done and turn.reward == pytest.approx(reward, abs=1e-12)
    assert turn.info["predicted"] == predicted and turn.info["parsed"] == (predicted is not None)
    assert turn.info["correct"] == (reward == 1.0)


# Issue 22: the default reader is OdysSim's (tests/test_soul_odyssim.py); these cases assert the earlier forgiving
# reader, kept behind lenient=True (moved here from test_reply_scores, assertions unchanged).
@pytest.mark.parametrize("name,index,reply,reward,predicted", [
    ("paratomi", 0, "Answer: the wooden_crate", 1.0, "the wooden_crate"),
    ("lifechoices", 0, "Refuse and report the harbour master to the regional council.", 1.0, "B"),
])
def test_reply_scores_lenient(name, index, reply, reward, predicted):
    env = base.make_env(name, base.sample_records(name)[index], lenient=True)
    env.reset()
    turn = env.step("thinking", reply)
    assert turn.done and turn.reward == pytest.approx(reward, abs=1e-12)
    assert turn.info["predicted"] == predicted and turn.info["parsed"] == (predicted is not None)
    assert turn.info["correct"] == (reward == 1.0)


@pytest.mark.parametrize("name", TASKS)
def test_no_utterance_scores_zero(name):
    env, _ = _env(name, 0)
    turn = env.step("never closed", None)
    assert (turn.done, turn.reward, turn.info["parsed"]) == (True, 0.0, False)


def _drop(*path):
    def f(r):
        for k in path[:-1]:
            r = r[k]
        del r[path[-1]]
    return f


def _set(value, *path):
    def f(r):
        for k in path[:-1]:
            r = r[k]
        r[path[-1]] = value
    return f


@pytest.mark.parametrize("name,index,mutate,match", [
    ("fantom", 0, _drop("context"), "missing field 'context'"),
    ("fantom", 0, _set(5, "context"), "field 'context' must be str, got int"),
    ("fantom", 1, _drop("complete_question"), r"missing field 'complete_question' \(or 'question'\)"),
    ("fantom", 0, _set("tom:belief:odd", "question_type"), "field 'question_type' 'tom:belief:odd' is not"),
    ("fantom", 0, _set(7, "correct_answer"), "field 'correct_answer' must be an option index 0-3"),
    ("fantom", 1, _set("[]", "correct_answer"), "field 'correct_answer' must be a non-empty list of names"),
    ("fantom", 2, _set("maybe", "correct_answer"), "field 'correct_answer' must be 'yes', 'no' or 'no:long'"),
    ("fantom", 5, _set(True, "correct_answer"), "field 'correct_answer' must be int or str or list, got bool"),
    ("paratomi", 0, _drop("question"), "missing field 'question'"),
    ("paratomi", 0, _set([1, 2], "story"), "field 'story' must list strings, got 1"),
    ("paratomi", 0, _set(3, "cands"), "field 'cands' must be str or list, got int"),
    ("paratomi", 0, _set(" ", "correct_answer"), "field 'correct_answer' is empty"),
    ("lifechoices", 0, _drop("character_name"), "missing field 'character_name'"),
    ("lifechoices", 0, _drop("Multiple Choice Question", "Scenario"),
     "field 'Multiple Choice Question': missing field 'Scenario'"),
    ("lifechoices", 0, _set(["only one"], "Multiple Choice Question", "Options"), "'Options' must list 2 to 4"),
    ("lifechoices", 1, _set("D", "Multiple Choice Question", "Correct Answer"),
     "'Correct Answer' 'D' is not one of the option letters A, B, C"),
    ("lifechoices", 0, _set("B", "Multiple Choice Question"), "field 'Multiple Choice Question' must be dict"),
    ("mistakes", 0, _drop("QuestionText"), "missing field 'QuestionText' or 'question'"),
    ("mistakes", 1, _set("D", "TargetOption"), "field 'TargetOption' 'D' is not one of the option letters A, B, C"),
    ("mistakes", 0, _set(2, "AnswerBText"), "field 'AnswerBText' must be str, got int"),
    ("mistakes", 0, lambda r: r.update(AnswerBText="", AnswerCText="", AnswerDText=None), "at least two options"),
    ("twinvoice", 0, _drop("history"), "missing field 'conversation_history' or 'history'"),
    ("twinvoice", 0, _set(4, "answer_idx"), "field 'answer_idx' 4 is not an index of the 4 choices"),
    ("twinvoice", 0, _set("1", "answer_idx"), "field 'answer_idx' must be int, got str"),
    ("twinvoice", 0, _set("[not json", "choices"), "field 'choices' must be a list or a JSON string of a list"),
    ("twinvoice", 0, _set(["only one"], "choices"), "field 'choices' must hold 2 to 4 non-empty strings"),
])
def test_bad_records_are_named(tmp_path, name, index, mutate, match):
    rows = [json.loads(line) for line in base.sample_path(name).read_text().splitlines()]
    record = rows[index]
    mutate(record)
    path = tmp_path / f"{name}.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(EnvError) as err:
        base.load_records(name, path)
    assert f"{path}, record 0 (task {name})" in str(err.value)
    assert re.search(match, str(err.value)), str(err.value)


def test_verl_rows_keep_the_task_notes(tmp_path):
    """OdysSim's verl rows carry the record in `extra_info`; FanToM's own notes field is also `extra_info`."""
    record = base.sample_records("fantom")[2] | {"correct_answer": "yes"}
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([{"data_source": "fantom", "extra_info": record}]))
    env = base.make_env("fantom", base.load_records("fantom", path)[0])
    assert "Dario left before the move was mentioned" in env.reset()[0]["content"]
    assert env.step(None, "<answer>yes</answer>").reward == 1.0
    mc = base.sample_records("fantom")[0] | {"correct_answer": "0"}  # a digit string index also works
    path.write_text(json.dumps([mc]))
    assert base.make_env("fantom", base.load_records("fantom", path)[0]).gold() == "A"
