"""SOUL machinery: answer and score parsing, record loading (JSONL / JSON / parquet, verl extra_info rows), the
registry, the judge's one retry, and the HiToM worked example."""

import json

import pytest

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul import base, hitom  # noqa: F401 -- registers hitom
from mimesis_jax.envs.soul.base import JudgeEnv, parse_choice, parse_exact, parse_score
from mimesis_jax.chat.base import ChatResponse, ScriptedChatModel

L4 = ["A", "B", "C", "D"]


@pytest.mark.parametrize("text,expected", [
    ("Thinking... <answer>B</answer>", "B"),
    ("<answer>(c)</answer>", "C"),
    ("<answer>A</answer> wait, no: <answer>D</answer>", "D"),
    ("<answer>E</answer>", None),                          # not an option
    ("so \\boxed{C}", "C"),
    ("The answer is (B).", "B"),
    ("Final answer: D", "D"),
    ("Answer: A. Actually the answer is C", "C"),          # the last statement wins
    ("B", "B"), ("(a)", "A"), ("C. the red box", "C"), ("**D**", "D"),
    ("the green bag", "B"),                                # an option's text
    ("I am not sure.", None), ("", None), (None, None),
])
def test_parse_choice(text, expected):
    assert parse_choice(text, L4, {"A": "red box", "B": "green bag", "C": "blue tin", "D": "shelf"}) == expected


@pytest.mark.parametrize("text,expected", [
    ("<answer> Paris </answer>", "Paris"), ("blah\nAnswer: 42 apples", "42 apples"), ("no answer here", None),
    ("<answer></answer>", None),
])
def test_parse_exact(text, expected):
    assert parse_exact(text) == expected
    assert base.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"


@pytest.mark.parametrize("text,lo,hi,expected", [
    ('{"score": 7}', 1, 10, 7.0), ('```json\n{"score": 3.5, "why": "ok"}\n```', 1, 5, 3.5),
    ("Reasoning...\nScore: 4", 1, 5, 4.0), ("**Score**: 0.25", 0, 1, 0.25),
])
def test_parse_score(text, lo, hi, expected):
    assert parse_score(text, lo, hi) == expected


@pytest.mark.parametrize("text,match", [
    ('{"score": 11}', r"outside \[1, 10\]"), ("no number", "no 'score'"), ('{"score": true}', "must be a number"),
    ('{"score": "high"}', "must be a number"),
])
def test_parse_score_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_score(text, 1, 10)


def _hitom_row(**kw):
    row = {"story": "S.", "question": "Where?", "choices": "A. box, B. bag", "correct_answer": "bag"}
    row.update(kw)
    return row


def test_records_jsonl_json_parquet_and_verl_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = [_hitom_row(), _hitom_row(correct_answer="box")]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    (tmp_path / "a.json").write_text(json.dumps(rows))
    # OdysSim's verl parquet: the task's fields sit in `extra_info`
    pq.write_table(pa.Table.from_pylist([{"data_source": "hitom", "prompt": [{"role": "user", "content": "x"}],
                                          "extra_info": r} for r in rows]), tmp_path / "a.parquet")
    for name in ("a.jsonl", "a.json", "a.parquet"):
        recs = base.load_records("hitom", tmp_path / name)
        assert [r["correct_answer"] for r in recs] == ["bag", "box"]
    env = base.make_env("hitom", recs[0])
    env.reset()
    assert env.step("t", "<answer>B</answer>").reward == 1.0


@pytest.mark.parametrize("content,match", [
    ('{"story": "S", "question": "q", "choices": "A. x, B. y"}\n', r"record 0 \(task hitom\): missing field "
                                                                     r"'correct_answer'"),
    (json.dumps(_hitom_row(story=3)) + "\n", "field 'story' must be str"),
    (json.dumps(_hitom_row(correct_answer="sofa")) + "\n", "'sofa' is not one of the choices"),
    (json.dumps(_hitom_row()) + "\n{bad\n", "line 2: not valid JSON"),
    ("", "holds no records"),
])
def test_bad_records_are_named(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(EnvError, match=match):
        base.load_records("hitom", p)


def test_registry_errors():
    with pytest.raises(EnvError, match="unknown SOUL task 'nope'"):
        base.task_info("nope")
    with pytest.raises(EnvError, match="registered twice"):
        @base.register
        class Dup(base.ChoiceEnv):
            name, protocol, reward_doc, record_format = "hitom", "p", "r", "f"
    with pytest.raises(EnvError, match="'reward_doc' must be set"):
        @base.register
        class NoDoc(base.ChoiceEnv):
            name, protocol, record_format = "x", "p", "f"
    with pytest.raises(EnvError, match="max_turns must be a positive integer"):
        base.make_env("hitom", _hitom_row(), max_turns=0)


class _Judged(JudgeEnv):
    """A two-turn judged task (not registered): a partner answers once, then the judge scores 1-5."""

    name = "judged_test"
    multi_turn = True
    max_policy_turns = 2
    score_range = (1.0, 5.0)

    def initial_messages(self):
        return [{"role": "user", "content": "Play a shy tourist asking for directions."}]

    def partner_messages(self):
        return [{"role": "system", "content": "You are a local."}] + [
            {"role": "user" if m["role"] == "assistant" else "assistant", "content": m["content"]}
            for m in self.view[1:]]

    def judge_messages(self):
        dialogue = "\n".join(f"{m['role']}: {m['content']}" for m in self.view)
        return [{"role": "user", "content": f"Rate 1-5 how shy the tourist is.\n{dialogue}"}]


def test_judge_env_partner_turns_retry_and_invalid():
    judge = ScriptedChatModel(["I'd say high.", '{"score": 4}'])
    partner = ScriptedChatModel(["<think>\nlost tourist\n</think>\n\nTake the second left."])
    env = _Judged({}, judge=judge, partner=partner)
    env.reset()
    t1 = env.step("nervous", "Um, s-sorry, where is the station?")
    assert t1 == SimTurn(done=False, messages=[{"role": "user", "content": "Take the second left."}])
    assert partner.calls[0][1:] == [{"role": "user", "content": "Um, s-sorry, where is the station?"}]
    t2 = env.step(None, "Th-thanks...")
    assert t2.done and t2.reward == (4 - 1) / (5 - 1) and t2.info["judge_score"] == 4.0
    assert len(judge.calls) == 2 and judge.calls[1][-1]["role"] == "user" and "could not be read" in \
        judge.calls[1][-1]["content"]
    assert "Th-thanks..." in judge.calls[0][0]["content"]
    env = _Judged({}, judge=ScriptedChatModel(["nope", "still nope"]), partner=partner)
    env.reset()
    env.step(None, "hi")
    with pytest.raises(InvalidEpisode, match="judge answer unparseable twice"):
        env.step(None, "bye")
    env = _Judged({}, judge=judge, partner=ScriptedChatModel([ChatResponse("", finish_reason="error",
                                                                           meta={"error": "503"})]))
    env.reset()
    with pytest.raises(InvalidEpisode, match="partner model call failed: 503"):
        env.step(None, "hi")
    env = _Judged({}, judge=judge, partner=partner)
    env.reset()
    assert env.step("never closed", None) == SimTurn(done=True, reward=0.0,
                                                      info={"end": "no_utterance", "policy_turns": 1})
