"""SOUL tasks socsci210, alignx, behaviorchain, social_r1, humanllm (envs/soul): shipped samples, the policy's view,
the rewards (accuracy, socsci210's scale closeness, humanllm's reciprocal rank) on hand-worked replies, verl-row
loading, and the errors bad records raise."""

import json

import pytest

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul import alignx, behaviorchain, humanllm, social_r1, socsci210  # noqa: F401 (register)
from mimesis_jax.envs.soul.base import load_records, make_env, sample_records, task_info

COUNTS = {"socsci210": 4, "alignx": 4, "behaviorchain": 3, "social_r1": 4, "humanllm": 3}
WHERE = "bad.jsonl, record 7"


def env_for(task, i):
    env = make_env(task, sample_records(task)[i])
    env.reset()
    return env


def _sample(task, i=0):
    return dict(sample_records(task)[i])


BC_ROW = {"persona_name": "Ida", "current_context": "The bus is late again.", "right_option_letter": "C",
          "options_dict": {"A": "She waits.", "B": "She calls a taxi.", "C": "She walks.", "D": "She goes home."}}


def _raw(**changes):
    """A behaviorchain record in OdysSim's form ({'raw': <JSON row>}); a change to None drops the field."""
    row = {**BC_ROW, **changes}
    return {"raw": json.dumps({k: v for k, v in row.items() if v is not None})}


@pytest.mark.parametrize("task", sorted(COUNTS))
def test_registered_and_samples_load(task):
    info = task_info(task)
    assert (info.family, info.multi_turn, info.real_format) == ("choice", False, True)
    assert len(sample_records(task)) == COUNTS[task]


@pytest.mark.parametrize("task,i,expected", [
    ("socsci210", 0, ["works as a school nurse", "support building the bus line",
                      "one whole number on the scale from 1 to 7"]),
    ("socsci210", 1, ["Would you sign up for the community garden?", "yes or no (or 1 for yes, 0 for no)"]),
    ("socsci210", 2, ["3 = the local paper", "number of the chosen response option (from 1 to 4)"]),
    ("socsci210", 3, ["closing one branch library on Sundays", "scale from 0 to 10"]),  # from conversations
    ("alignx", 0, ["A 31-year-old consultant who is away", "Case 2 -- post: Should I get a cat or a dog?",
                   "## Reply A\nA fiddle-leaf fig", "## Reply B\nA snake plant"]),
    ("alignx", 1, ["Enjoys slow hobbies", "They wrote: Making fresh pasta", "## Reply A\nYes! The slow process"]),
    ("alignx", 2, ["A private person in their forties", "They picked: Thanks, I can't make it."]),  # raw names
    ("alignx", 3, ["Nothing is known about this person", "## Reply A\nOutside. Fresh air"]),
    ("behaviorchain", 0, ["retired lighthouse keeper", "Chapter 2\nHer niece Pia arrives",
                          "Step 2. Situation: Pia offers to pay for groceries. | What they did: Edda refuses",
                          "what Edda Marlow did", "D. She posts the letter back to the sender unopened."]),
    ("behaviorchain", 1, ["jokes his way out", "covering for his friend Lev",
                          "Step 1: the foreman asks where Lev is", "A. Tomasz cracks a joke"]),
    ("behaviorchain", 2, ["## The story so far\n(none)", "B. She drops them at the night shelter"]),
    ("social_r1", 0, ["Felix returned it with a flat tyre", "B. Annoyed"]),
    ("social_r1", 1, ["Rafa praised Ines's report", "B) He wanted to look supportive"]),   # from prompt
    ("social_r1", 2, ["hide the last slice of cake", "A. Behind the milk"]),            # from conversations
    ("humanllm", 0, ["Purchase history:\nHistory 1: running belt with bottle holder\nHistory 2: merino base layer",
                     "History 4: meal prep containers\n", "A: wireless earbuds\nB: yoga mat", "T: phone tripod",
                     "5 different letters from A to T"]),
    ("humanllm", 1, ["first flat and is learning to cook.\nHistory 1: saucepan set\nHistory 2: chef's knife",
                     "H: noise-cancelling headphones\n", "from A to H"]),
    ("humanllm", 2, ["long days at the desk.\nHistory 1: laptop stand", "E: monitor stand", "from A to E"]),
])
def test_view_shows_the_record(task, i, expected):
    view = make_env(task, sample_records(task)[i]).reset()
    assert [m["role"] for m in view] == ["user"]
    for text in expected:
        assert text in view[0]["content"]


def test_view_leaves_out_what_it_should():
    assert "How to learn a language fast?" not in env_for("alignx", 0).view[0]["content"]  # n_icl = 2 of 3 pairs
    content = env_for("humanllm", 0).view[0]["content"]
    assert "Candidate 1" not in content and "Candidate 2: yoga mat" not in content


@pytest.mark.parametrize("task,i,reply,reward,predicted", [
    # socsci210 ordinal 1..7, gold 5: r = 1 - |clip(pred) - 5| / 6
    ("socsci210", 0, "She likes buses. <answer>5</answer>", 1.0, 5.0),
    ("socsci210", 0, "<answer>3</answer>", 1 - 2 / 6, 3.0),
    ("socsci210", 0, "<answer>1</answer>", 1 - 4 / 6, 1.0),
    ("socsci210", 0, "<answer>9</answer>", 1 - 2 / 6, 9.0),          # clipped to 7
    ("socsci210", 0, "<answer>5.5</answer>", 0.0, None),
    ("socsci210", 0, "<answer>five</answer>", 0.0, None),
    ("socsci210", 0, "5", 0.0, None),                               # no tag
    # ordinal 0..10, gold 2
    ("socsci210", 3, "<answer>7</answer>", 1 - 5 / 10, 7.0),
    ("socsci210", 3, "<answer>-3</answer>", 1 - 2 / 10, -3.0),     # clipped to 0
    # binary, gold 1 (yes)
    ("socsci210", 1, "<answer>Yes</answer>", 1.0, 1.0),
    ("socsci210", 1, "<answer>1</answer>", 1.0, 1.0),
    ("socsci210", 1, "<answer>no</answer>", 0.0, 0.0),
    ("socsci210", 1, "<answer>maybe</answer>", 0.0, None),
    # categorical 1..4, gold 3: exact match only
    ("socsci210", 2, "<answer>3</answer>", 1.0, 3.0),
    ("socsci210", 2, "<answer>4</answer>", 0.0, 4.0),
    ("socsci210", 2, "<answer>yes</answer>", 0.0, None),
    # alignx: index 3 puts chosen at B, index 10 at A
    ("alignx", 0, "Low effort wins. <answer>B</answer>", 1.0, "B"),
    ("alignx", 0, "<answer>A</answer>", 0.0, "A"),
    ("alignx", 0, "I cannot tell.", 0.0, None),
    ("alignx", 1, "<answer>A</answer>", 1.0, "A"),
    ("alignx", 1, "<answer>C</answer>", 0.0, None),
    ("behaviorchain", 0, "She is discreet. <answer>A</answer>", 1.0, "A"),
    ("behaviorchain", 0, "<answer>C</answer>", 0.0, "C"),
    ("behaviorchain", 0, "no idea", 0.0, None),
    ("behaviorchain", 1, "<answer>A</answer>", 1.0, "A"),          # gold 'a' read as A
    ("behaviorchain", 2, "<answer>B</answer>", 1.0, "B"),
    ("social_r1", 0, "<answer>B</answer>", 1.0, "B"),
    ("social_r1", 0, "<answer>D</answer>", 0.0, "D"),
    ("social_r1", 0, "<answer>E</answer>", 0.0, None),             # not an option line of the prompt
    ("social_r1", 1, "<answer>B</answer>", 1.0, "B"),              # gold from answer_text 'B) ...'
    ("social_r1", 2, "<answer>A</answer>", 1.0, "A"),
    ("social_r1", 3, "<answer>B</answer>", 1.0, "B"),
    ("social_r1", 3, "<answer>E</answer>", 0.0, "E"),              # inline options: any letter counts
    # humanllm: 1 / rank of the gold (record 0: D, record 1: G) among the 5 letters
    ("humanllm", 0, "Runner. <answer>D,A,B,C,E</answer>", 1.0, ["D", "A", "B", "C", "E"]),
    ("humanllm", 0, "<answer>A,B,D,C,E</answer>", 1 / 3, ["A", "B", "D", "C", "E"]),
    ("humanllm", 0, "<answer>A,B,C,E,F</answer>", 0.0, ["A", "B", "C", "E", "F"]),
    ("humanllm", 0, "<answer>D,A,B,C</answer>", 0.0, None),        # four letters
    ("humanllm", 0, "<answer>D,D,A,B,C</answer>", 0.0, None),      # repeated letter
    ("humanllm", 0, "<answer>d,a,b,c,e</answer>", 0.0, None),      # lower case
    ("humanllm", 0, "D,A,B,C,E", 0.0, None),                       # no tag
    ("humanllm", 1, "<answer>A,B,G,C,D</answer>", 1 / 3, ["A", "B", "G", "C", "D"]),
    ("humanllm", 1, "<answer>G,I,A,B,C</answer>", 0.0, None),      # only 8 candidates: I does not exist
])
def test_reward(task, i, reply, reward, predicted):
    turn = env_for(task, i).step("thinking", reply)
    assert turn.done and turn.reward == pytest.approx(reward, abs=1e-12)
    assert turn.info["predicted"] == predicted
    assert turn.info["parsed"] is (predicted is not None)


# Issue 22: moved from test_reward (assertions unchanged): spaces in the ranking are read only by the earlier
# forgiving reader, now behind lenient=True; OdysSim's strict pattern (the default) scores them 0.
@pytest.mark.parametrize("task,i,reply,reward,predicted", [
    ("humanllm", 0, "<answer>A, B, C, E, D</answer>", 1 / 5, ["A", "B", "C", "E", "D"]),
])
def test_reward_lenient(task, i, reply, reward, predicted):
    env = make_env(task, sample_records(task)[i], lenient=True)
    env.reset()
    turn = env.step("thinking", reply)
    assert turn.done and turn.reward == pytest.approx(reward, abs=1e-12)
    assert turn.info["predicted"] == predicted
    assert turn.info["parsed"] is (predicted is not None)


@pytest.mark.parametrize("task", sorted(COUNTS))
def test_no_utterance_scores_zero(task):
    turn = env_for(task, 0).step("thought only", None)
    assert (turn.done, turn.reward, turn.info["parsed"]) == (True, 0.0, False)


def test_humanllm_rank_info():
    info = env_for("humanllm", 0).step(None, "<answer>A,B,D,C,E</answer>").info
    assert (info["gold"], info["rank"], info["hit_at_5"], info["top1"]) == ("D", 3, True, False)
    info = env_for("humanllm", 0).step(None, "<answer>A,B,C,E,F</answer>").info
    assert (info["rank"], info["hit_at_5"]) == (None, False)


def test_verl_rows_are_unwrapped(tmp_path):
    """OdysSim's parquet rows keep each task's record in extra_info; behaviorchain's row is a JSON string there."""
    soc = {"prompt_text": "Participant: 50, farmer.\nQuestion: How much do you trust the weather service (1-5)?",
           "response": 4, "r_min": 1, "r_max": 5}
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": [], "extra_info": _raw()}) + "\n")
    [rec] = load_records("behaviorchain", path)
    env = make_env("behaviorchain", rec)
    assert "The bus is late again." in env.reset()[0]["content"]
    assert env.step(None, "<answer>C</answer>").reward == 1.0
    path.write_text(json.dumps({"extra_info": json.dumps(soc)}) + "\n")
    [rec] = load_records("socsci210", path)
    env = make_env("socsci210", rec)
    assert "trust the weather service" in env.reset()[0]["content"]
    assert env.step(None, "<answer>2</answer>").reward == pytest.approx(1 - 2 / 4)


@pytest.mark.parametrize("task,record,names", [
    ("socsci210", {**_sample("socsci210"), "response": None}, ["'response'"]),
    ("socsci210", {**_sample("socsci210"), "response": "high"}, ["'response'"]),
    ("socsci210", {**_sample("socsci210"), "response": 9}, ["'response'", "outside the scale"]),
    ("socsci210", {**_sample("socsci210", 1), "response": 2}, ["'response'", "binary"]),
    ("socsci210", {**_sample("socsci210", 2), "response": 2.5}, ["'response'", "categorical"]),
    ("socsci210", {**_sample("socsci210"), "response_type": "likert"}, ["'response_type'"]),
    ("socsci210", {**_sample("socsci210"), "r_min": 7}, ["'r_max'"]),
    ("socsci210", {**_sample("socsci210"), "r_min": "1"}, ["'r_min'"]),
    ("socsci210", {"response": 3}, ["'prompt_text'", "'conversations'"]),
    ("socsci210", {"response": 3, "conversations": [{"messages": []}]}, ["'conversations'"]),
    ("alignx", {**_sample("alignx"), "chosen": None}, ["'chosen'"]),
    ("alignx", {**_sample("alignx"), "rejected": 5}, ["'rejected'"]),
    ("alignx", {**_sample("alignx"), "raw_prompt": "  "}, ["'raw_prompt'"]),
    ("alignx", {**_sample("alignx"), "rejected": _sample("alignx")["chosen"]}, ["'chosen'", "'rejected'"]),
    ("alignx", {**_sample("alignx"), "icl_pairs": [{"prompt": "p", "chosen": "c"}]}, ["'icl_pairs' item 0",
                                                                                     "'rejected'"]),
    ("alignx", {**_sample("alignx"), "ugc": "text"}, ["'ugc'"]),
    ("alignx", {**_sample("alignx"), "index": "3"}, ["'index'"]),
    ("alignx", {**_sample("alignx"), "n_icl": -1}, ["'n_icl'"]),
    ("behaviorchain", {"raw": "not json"}, ["'raw'"]),
    ("behaviorchain", {"raw": "[1, 2]"}, ["'raw'", "JSON object"]),
    ("behaviorchain", _raw(right_option_letter=None), ["field 'raw'", "'right_option_letter'"]),
    ("behaviorchain", _raw(right_option_letter="E"), ["'right_option_letter'"]),
    ("behaviorchain", _raw(current_context=""), ["'current_context'"]),
    ("behaviorchain", _raw(options_dict=None, options=["x", "y", "z"]), ["'options'"]),
    ("behaviorchain", _raw(options_dict={"A": "x", "B": "y", "C": "z"}), ["'options_dict'"]),
    ("behaviorchain", _raw(options_dict=None), ["'options'"]),
    ("behaviorchain", _raw(prior_chain=[{"context": 3}]), ["'prior_chain' item 0", "'context'"]),
    ("behaviorchain", _raw(history_truncated=[{"chapter_num": "1"}]), ["'history_truncated' item 0",
                                                                       "'chapter_content'"]),
    ("social_r1", {"answer_letter": "B"}, ["'prompt_text'", "'prompt'"]),
    ("social_r1", {**_sample("social_r1"), "answer_letter": "BC"}, ["'answer_letter'"]),
    ("social_r1", {**_sample("social_r1"), "answer_letter": "F"}, ["'answer_letter'", "A, B, C, D"]),
    ("social_r1", {"prompt_text": "Q?\nA. x\nB. y"}, ["'answer_letter'", "'answer_text'"]),
    ("social_r1", {"prompt_text": "Q?\nA. x\nB. y", "answer_text": "Because x"}, ["'answer_text'"]),
    ("humanllm", {**_sample("humanllm"), "candidates": None}, ["'candidates'"]),
    ("humanllm", {**_sample("humanllm"), "candidates": ["a", "b", "c", "d"]}, ["'candidates'", "got 4"]),
    ("humanllm", {**_sample("humanllm"), "candidates": [f"item {k}" for k in range(21)]}, ["'candidates'",
                                                                                          "got 21"]),
    ("humanllm", {**_sample("humanllm"), "candidates": ["a", "b", 3, "d", "e"], "answer_index": 0},
     ["'candidates' item 2"]),
    ("humanllm", {**_sample("humanllm", 1), "answer_index": 8}, ["'answer_index'"]),
    ("humanllm", {**_sample("humanllm"), "answer_index": "3"}, ["'answer_index'"]),
])
def test_bad_record_names_the_field(task, record, names):
    with pytest.raises(EnvError) as e:
        task_info(task).env_class.parse_record(record, WHERE)
    assert WHERE in str(e.value)
    for name in names:
        assert name in str(e.value)
