"""ThoughtTrace SFT examples: target = <think> thought </think> utterance <|im_end|>, checked token by token."""

import json
import os

import numpy as np
import pytest

from helpers import expected_ids_mask
from mimesis_jax.data.chat import generation_prompt
from mimesis_jax.data.midtrain import RecordError
from mimesis_jax.data.thoughttrace import (REACTION_LABELS, REASON_LABELS, persona_prompt, render_thought,
                                           thoughttrace_example, thoughttrace_messages)
from mimesis_jax.data.tokenizer import load_tokenizer, samples_dir


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer("tiny", cache_dir=str(tmp_path_factory.mktemp("tok")))


RECORD = {
    "id": "user1_task1_conversation1", "task_summary": "Find a cheap blender.", "task_expectation": "Two options.",
    "survey_answers": [{"question": "age", "answer": "25-34"}, {"question": "occupation", "answer": "student"}],
    "messages": [
        {"type": "user", "content": "Which blender should I buy?",
         "reasons": [{"label": "task_motivation", "content": "Mine broke yesterday."}]},
        {"type": "assistant", "content": "Here are ten blenders with full specs...",
         "reactions": [{"label": "scope_fit", "content": "Way too many."}]},
        {"type": "user", "content": "Just two under $50 please.",
         "reasons": [{"label": "Content Expectation", "content": "I only want a shortlist."}]},
        {"type": "assistant", "content": "A and B.", "reactions": [{"label": "explicit_affirmation"}]},
    ],
}




def _plain(role, text):
    return [("c", "<|im_start|>", 0), ("t", role + "\n" + text, 0), ("c", "<|im_end|>", 0), ("t", "\n", 0)]


def _thinking_user(thought, utterance):
    return [("c", "<|im_start|>", 0), ("t", "user\n", 0), ("c", "<think>", 1), ("t", "\n", 1), ("t", thought + "\n", 1),
            ("c", "</think>", 1), ("t", "\n\n", 1), ("t", utterance, 1), ("c", "<|im_end|>", 1), ("t", "\n", 0)]


def test_thought_template():
    t1 = render_thought([], [("task_motivation", "Mine broke yesterday.")])
    assert t1 == "I'm writing this because of the goal I have in mind. Mine broke yesterday."
    t2 = render_thought([("scope_fit", "Way too many.")], [("content_expectation", "I only want a shortlist.")])
    assert t2 == ("That reply's scope didn't fit what I needed. Way too many.\n"
                  "I have a clear idea of what the answer should contain. I only want a shortlist.")
    assert render_thought([("explicit_affirmation", "")], []) == "That reply worked for me."
    assert len(REASON_LABELS) == 7 and len(REACTION_LABELS) == 5


def test_targets_token_by_token(tok):
    ex = thoughttrace_example(tok, RECORD)
    persona = "Your task: Find a cheap blender.\nWhat you expect from the assistant: Two options.\nAbout you: age: 25-34; occupation: student"
    ids, mask = expected_ids_mask(tok, _plain("system", persona)
                          + _thinking_user(render_thought([], [("task_motivation", "Mine broke yesterday.")]),
                                           "Which blender should I buy?")
                          + _plain("assistant", "Here are ten blenders with full specs...")
                          + _thinking_user(render_thought([("scope_fit", "Way too many.")],
                                                          [("content_expectation", "I only want a shortlist.")]),
                                           "Just two under $50 please."))
    np.testing.assert_array_equal(ex["tokens"], ids)
    np.testing.assert_array_equal(ex["loss_mask"], mask)
    # The reaction to the final reply explains no user turn: the example ends at the last user turn.
    assert tok.decode(ex["tokens"]).endswith("Just two under $50 please.<|im_end|>\n")


def test_each_target_follows_the_simulator_prompt(tok):
    ex = thoughttrace_example(tok, RECORD)
    gp = generation_prompt(tok, "user", enable_thinking=True)  # <|im_start|>user\n<think>\n
    m = ex["loss_mask"]
    starts = [i for i in range(1, len(m)) if m[i] and not m[i - 1]]
    assert len(starts) == 2
    for s in starts:  # the target span starts at <think>; the prompt's last two tokens are its first two
        assert ex["tokens"][s - 3:s + 2].tolist() == gp


def test_reactions_on_the_user_message_are_accepted(tok):
    moved = json.loads(json.dumps(RECORD))
    moved["messages"][2]["reactions"] = moved["messages"][1].pop("reactions")
    a, b = thoughttrace_example(tok, moved), thoughttrace_example(tok, RECORD)
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    np.testing.assert_array_equal(a["loss_mask"], b["loss_mask"])


def test_unreported_turn_is_context_with_an_empty_think_block(tok):
    rec = json.loads(json.dumps(RECORD))
    del rec["messages"][0]["reasons"]
    msgs, targets = thoughttrace_messages(rec)
    assert targets == [3] and msgs[1]["reasoning"] == ""
    ex = thoughttrace_example(tok, rec)
    text = tok.decode(ex["tokens"])
    assert "<|im_start|>user\n<think>\n\n</think>\n\nWhich blender should I buy?<|im_end|>" in text
    assert "Which blender" not in tok.decode(ex["tokens"][ex["loss_mask"] == 1])


def test_persona_is_optional_and_survey_formats(tok):
    no_persona = thoughttrace_example(tok, RECORD, persona=False)
    assert not tok.decode(no_persona["tokens"]).startswith("<|im_start|>system")
    assert persona_prompt({"survey_answers": {"age": "30", "hobbies": ["chess", "running"]}}) == (
        "About you: age: 30; hobbies: chess, running")
    assert persona_prompt({}) is None
    with pytest.raises(RecordError, match="survey_answers"):
        persona_prompt({"survey_answers": 42}, "r")


@pytest.mark.parametrize("edit,match", [
    (lambda r: r["messages"][0]["reasons"][0].update(label="curiosity"), r"messages\[0\]\.reasons\[0\]: unknown reason label 'curiosity'"),
    (lambda r: r["messages"][1]["reactions"][0].update(label="angry"), r"messages\[1\]\.reactions\[0\]: unknown reaction label"),
    (lambda r: r["messages"][1].update(reasons=[{"label": "task_motivation"}]), "assistant message carries 'reasons'"),
    (lambda r: r["messages"][0].update(reasons="task_motivation"), "'reasons' must be a list"),
    (lambda r: [m.pop("reasons", None) or m.pop("reactions", None) for m in r["messages"]], "no user turn has a self-report"),
    (lambda r: r["messages"][0].update(type="narrator"), "unknown role 'narrator'"),
    (lambda r: r.update(task_summary=["x"]), "'task_summary' must be a string"),
])
def test_bad_records_name_record_and_message(tok, edit, match):
    rec = json.loads(json.dumps(RECORD))
    edit(rec)
    with pytest.raises(RecordError, match=match) as e:
        thoughttrace_example(tok, rec, where="tt.jsonl record 3 (line 4)")
    assert str(e.value).startswith("tt.jsonl record 3 (line 4)")


def test_label_spellings_are_normalised(tok):
    rec = json.loads(json.dumps(RECORD))
    rec["messages"][0]["reasons"][0]["label"] = "Task Motivation & Goal"
    rec["messages"][1]["reactions"] = ["Partial Satisfaction"]  # a bare label string
    msgs, _ = thoughttrace_messages(rec)
    assert msgs[1]["reasoning"].startswith(REASON_LABELS["task_motivation"])
    assert msgs[3]["reasoning"].startswith(REACTION_LABELS["partial_satisfaction"] + "\n")


def test_every_shipped_record_converts(tok):
    with open(os.path.join(samples_dir(), "thoughttrace_sample.jsonl"), encoding="utf-8") as f:
        records = [json.loads(line) for line in f]
    assert 50 <= len(records) <= 100
    for i, rec in enumerate(records):
        ex = thoughttrace_example(tok, rec, where=f"record {i}")
        targets = ex["tokens"][ex["loss_mask"] == 1]
        assert (targets == tok.think_start_id).sum() == (targets == tok.im_end_id).sum() >= 1
