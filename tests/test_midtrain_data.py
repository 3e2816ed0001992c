"""Role-flip mid-training examples: the loss covers user turns (+ their <|im_end|>) token by token, nothing else."""

import json
import os

import numpy as np
import pytest

from helpers import expected_ids_mask
from mimesis_jax.data.midtrain import RecordError, conversation_messages, midtrain_example
from mimesis_jax.data.tokenizer import load_tokenizer, samples_dir


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer("tiny", cache_dir=str(tmp_path_factory.mktemp("tok")))




def _turn(role, text, target):
    return [("c", "<|im_start|>", 0), ("t", role + "\n", 0), ("t", text, target), ("c", "<|im_end|>", target),
            ("t", "\n", 0)]


CONV = {"messages": [
    {"role": "system", "content": "You are Rui, 61, retired."},
    {"role": "user", "content": "  my printer prints blank pages  "},
    {"role": "assistant", "content": "Check the ink cartridges first."},
    {"role": "user", "content": "did that. still blank!!"},
    {"role": "assistant", "content": "Then run the head cleaning cycle."},
    {"role": "user", "content": "ok thx"},
    {"role": "assistant", "content": "You're welcome."},  # after the last user turn: dropped
]}


def test_loss_on_every_user_turn_token_by_token(tok):
    ex = midtrain_example(tok, CONV)
    ids, mask = expected_ids_mask(tok, _turn("system", "You are Rui, 61, retired.", 0)
                          + _turn("user", "my printer prints blank pages", 1)
                          + _turn("assistant", "Check the ink cartridges first.", 0)
                          + _turn("user", "did that. still blank!!", 1)
                          + _turn("assistant", "Then run the head cleaning cycle.", 0)
                          + _turn("user", "ok thx", 1))
    np.testing.assert_array_equal(ex["tokens"], ids)
    np.testing.assert_array_equal(ex["loss_mask"], mask)
    assert ex["tokens"].dtype == np.int32 and ex["loss_mask"].dtype == np.int32
    assert tok.decode(ex["tokens"][ex["loss_mask"] == 1]) == (
        "my printer prints blank pages<|im_end|>did that. still blank!!<|im_end|>ok thx<|im_end|>")


def test_last_user_turn_only(tok):
    ex = midtrain_example(tok, CONV, last_user_turn_only=True)
    full = midtrain_example(tok, CONV)
    np.testing.assert_array_equal(ex["tokens"], full["tokens"])
    assert tok.decode(ex["tokens"][ex["loss_mask"] == 1]) == "ok thx<|im_end|>"
    # The targets are the final tokens: what follows generation_prompt("user") at the end of the context.
    n = int(ex["loss_mask"].sum())
    assert ex["loss_mask"][-n - 1:].tolist() == [1] * n + [0]


def test_sharegpt_layout_and_record_system(tok):
    sharegpt = {"system": "You are Rui, 61, retired.", "conversations": [
        {"from": "human", "value": "my printer prints blank pages"}, {"from": "gpt", "value": "Check the ink cartridges first."},
        {"from": "human", "value": "did that. still blank!!"}, {"from": "gpt", "value": "Then run the head cleaning cycle."},
        {"from": "human", "value": "ok thx"}]}
    a, b = midtrain_example(tok, sharegpt), midtrain_example(tok, CONV)
    np.testing.assert_array_equal(a["tokens"], b["tokens"])
    np.testing.assert_array_equal(a["loss_mask"], b["loss_mask"])
    msgs = conversation_messages({"messages": [{"type": "user", "content": [{"type": "text", "text": "a"},
                                                                              {"type": "text", "text": "b"}]}]})
    assert msgs == [{"role": "user", "content": "ab"}]


def test_reasoning_is_dropped_and_thinking_is_off(tok):
    conv = {"messages": [{"role": "user", "content": "hi", "reasoning": "secret"},
                         {"role": "assistant", "content": "<think>\nplan\n</think>\n\nhello"},
                         {"role": "user", "content": "bye"}]}
    ex = midtrain_example(tok, conv)
    text = tok.decode(ex["tokens"])
    assert "secret" not in text and "plan" not in text and tok.think_start_id not in ex["tokens"]
    assert text.endswith("<|im_start|>user\nbye<|im_end|>\n")


@pytest.mark.parametrize("record,match", [
    ({"messages": [{"role": "assistant", "content": "hi"}]}, "no user turn"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}]}, r"messages\[1\]: unknown role"),
    ({"messages": [{"role": "user", "content": {"x": 1}}]}, r"messages\[0\]: content must be a string"),
    ({"text": "no conversation here"}, "no 'messages'"),
    ({"messages": "hello"}, "'messages' must be a list"),
    ({"messages": [{"role": "user", "content": "  "}, {"role": "assistant", "content": "?"},
                   {"role": "user", "content": "x"}]}, "user message 0 is empty"),
    ([1, 2], "must be a JSON object"),
])
def test_bad_records_are_named_errors(tok, record, match):
    with pytest.raises(RecordError, match=match) as e:
        midtrain_example(tok, record, where="corpus.jsonl record 7")
    assert str(e.value).startswith("corpus.jsonl record 7")


def test_every_shipped_conversation_converts(tok):
    n = 0
    for name in ("midtrain_everyday.jsonl", "midtrain_support.jsonl"):
        with open(os.path.join(samples_dir(), name), encoding="utf-8") as f:
            for i, line in enumerate(f):
                rec = json.loads(line)
                ex = midtrain_example(tok, rec, where=f"{name} record {i}")
                n_user = sum(m.get("role", m.get("from")) in ("user", "human")
                             for m in rec.get("messages", rec.get("conversations")))
                # One <|im_end|> target per user turn, and no assistant text among the targets.
                assert int((ex["tokens"][ex["loss_mask"] == 1] == tok.im_end_id).sum()) == n_user
                n += 1
    assert n == 300
