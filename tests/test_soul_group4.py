"""SOUL group 4: the six Humanual tasks (one reply as a real person, six-dimension judge x length factor) and the
SimulatorArena tasks sim_math / sim_doc (multi-turn user role-play against a fixed assistant, style judges and
feature fulfilment, sim_doc's document rating)."""

import json

import pytest

from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.soul import base, humanual, sim_arena  # noqa: F401 -- registers the tasks
from mimesis_jax.chat.base import ScriptedChatModel

HUMANUAL = ["humanual_book", "humanual_chat", "humanual_email", "humanual_news", "humanual_opinion",
            "humanual_politics"]
ALL = HUMANUAL + ["sim_math", "sim_doc"]
DIMS = ("stance", "emotion", "belief", "value", "goal", "communication")


def _dims_json(*scores):
    return json.dumps({d: {"reason": "r", "score": s} for d, s in zip(DIMS, scores)})


# ------------------------------------------------------------------------------------------ all tasks
@pytest.mark.parametrize("name", ALL)
def test_samples_load_and_registry(name):
    recs = base.sample_records(name)
    info = base.task_info(name)
    assert 3 <= len(recs) <= 10
    assert (info.family, info.multi_turn, info.real_format) == ("judge", name.startswith("sim_"), True)


# ------------------------------------------------------------------------------------------ Humanual
@pytest.mark.parametrize("name,setting_words,context_words,persona_words", [
    ("humanual_book", "review page for a book", "The Lantern Keeper's Daughter", "Retired schoolteacher"),
    ("humanual_chat", "chatting with an AI assistant", "how do i reverse a list in python\nYou can use",
     "Undergraduate in a first programming course"),
    ("humanual_email", "an email thread you received", "Subject: Q3 pipeline review", "gas-trading analyst"),
    ("humanual_news", "a news video online", "bike lane network for downtown, construction starts next spring."
                                             "\nFinally!", "Delivery driver"),
    ("humanual_opinion", "online discussion forum", "labeled them. Am I wrong", "Graduate student"),
    ("humanual_politics", "blog post about politics", "four-day school week", "Rural parent"),
])
def test_humanual_view_holds_persona_setting_and_context(name, setting_words, context_words, persona_words):
    env = base.make_env(name, base.sample_records(name)[0])
    view = env.reset()
    assert [m["role"] for m in view] == ["system", "user"]
    assert persona_words in view[0]["content"] and setting_words in view[0]["content"]
    assert "<response></response>" in view[0]["content"]
    assert context_words in view[1]["content"]


def test_humanual_prompt_formats():
    msgs = [{"role": "p1", "content": "Post text."}, {"role": "u2", "content": "A comment."}]
    for prompt in (msgs, json.dumps(msgs)):
        assert humanual.context_text(prompt, "w") == "Post text.\nA comment."
    assert humanual.context_text("plain [not json", "w") == "plain [not json"
    assert humanual.context_text('{"a": 1}', "w") == '{"a": 1}'  # JSON but not a message list: kept as text


REF_30 = " ".join(f"w{i}" for i in range(30))  # 30 word tokens: the length factor applies


def _hrec(completion=REF_30):
    return {"prompt": "Post: is pineapple on pizza fine?", "persona": "Chef from Naples.", "completion": completion}


@pytest.mark.parametrize("name", HUMANUAL)
def test_humanual_reward_is_dimension_mean_times_length_factor(name):
    judge = ScriptedChatModel([_dims_json(0.9, 0.6, 0.3, 0.6, 0.9, 0.3)])
    env = base.make_env(name, _hrec(), judge=judge)
    env.reset()
    turn = env.step("private", "Some chatter <response>No. Never, it is a crime!</response>")  # 6 tokens
    mean = (0.9 + 0.6 + 0.3 + 0.6 + 0.9 + 0.3) / 6
    factor = 6 / (0.3 * 30)
    assert turn.done and turn.reward == min(1.0, mean * factor)
    assert turn.info["judge_score"] == mean and turn.info["length_factor"] == factor
    assert turn.info["response"] == "No. Never, it is a crime!"
    prompt = judge.calls[0][0]["content"]
    assert env.prompt("rubric") in prompt and "No. Never, it is a crime!" in prompt and REF_30 in prompt
    assert "is pineapple on pizza fine?" in prompt and len(judge.calls) == 1


def test_humanual_short_reference_and_untagged_reply():
    # a real reply under 20 tokens is never length-gated; a reply without tags counts whole; bare numbers accepted
    judge = ScriptedChatModel([json.dumps({d: 0.5 for d in DIMS})])
    env = base.make_env("humanual_news", _hrec("Nope."), judge=judge)
    env.reset()
    turn = env.step(None, "  Absolutely not.  ")
    assert turn.reward == 0.5 and turn.info["length_factor"] == 1.0 and turn.info["response"] == "Absolutely not."
    # a reply longer than 30% of the reference gets the full factor
    assert humanual.length_factor(" ".join(["x"] * 9), REF_30) == 1.0


@pytest.mark.parametrize("utterance", [None, "<response>  </response>", "   "])
def test_humanual_empty_reply_scores_zero_without_judge(utterance):
    judge = ScriptedChatModel([_dims_json(1, 1, 1, 1, 1, 1)])
    env = base.make_env("humanual_book", _hrec(), judge=judge)
    env.reset()
    turn = env.step(None, utterance)
    assert turn.done and turn.reward == 0.0 and judge.calls == []


def test_humanual_judge_retry_then_invalid():
    judge = ScriptedChatModel(["I think it is decent.", _dims_json(1, 1, 1, 1, 1, 0.4)])
    env = base.make_env("humanual_chat", _hrec("ok"), judge=judge)
    env.reset()
    assert env.step(None, "sure").reward == (1 + 1 + 1 + 1 + 1 + 0.4) / 6
    assert len(judge.calls) == 2 and "could not be read" in judge.calls[1][-1]["content"]
    for bad in (["no json", "still none"], [_dims_json(1, 1, 1, 1, 1, 1.5), json.dumps({"stance": 1})]):
        env = base.make_env("humanual_chat", _hrec("ok"), judge=ScriptedChatModel(bad))
        env.reset()
        with pytest.raises(InvalidEpisode, match="judge answer unparseable twice"):
            env.step(None, "sure")


@pytest.mark.parametrize("record,match", [
    ({"prompt": "p", "completion": "c"}, "missing field 'persona'"),
    ({"prompt": "p", "persona": "x", "completion": 3}, "field 'completion' must be str"),
    ({"prompt": 7, "persona": "x", "completion": "c"}, "field 'prompt' must be str or list"),
    ({"prompt": [{"role": "a"}], "persona": "x", "completion": "c"}, "field 'prompt' item 0 must be a message"),
    ({"prompt": [], "persona": "x", "completion": "c"}, "field 'prompt' is an empty message list"),
    ({"prompt": "p", "persona": "x", "completion": "  "}, "field 'completion' is empty"),
])
def test_humanual_bad_records(tmp_path, record, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(record) + "\n")
    with pytest.raises(EnvError, match=rf"bad.jsonl, record 0 \(task humanual_politics\): .*{match}"):
        base.load_records("humanual_politics", p)


# ------------------------------------------------------------------------------------------ SimulatorArena
def _style_judge(writing=4, interaction=3, verdicts=("Match", "No Match"), rating=7):
    """Answers each judge prompt by its kind (the order of calls does not matter)."""
    def reply(messages):
        text = messages[0]["content"]
        if "WRITING STYLE" in text:
            return f'Comparison done. {{"key_differences": ["shorter"], "similarity_score": {writing}}}'
        if "INTERACTION STYLE" in text:
            return f'{{"key_differences": [], "similarity_score": "{interaction}"}}'
        if "numbered feature" in text:
            return json.dumps({"results": [{"feature_name": "f", "analysis": "a", "classification": v}
                                           for v in verdicts]})
        return f'{{"analysis": "fine", "rating": {rating}}}'
    return ScriptedChatModel(reply)


def test_sim_math_dialogue_roles_and_turn_limit():
    rec = base.sample_records("sim_math")[0]
    partner = ScriptedChatModel(lambda msgs: f"<think>plan</think>Hint {len(msgs) // 2}")
    judge = _style_judge()
    env = base.make_env("sim_math", rec, judge=judge, partner=partner)
    view = env.reset()
    assert [m["role"] for m in view] == ["system", "user"]
    assert "Ninth grader who writes very short messages" in view[0]["content"] and "Query:" in view[0]["content"]
    assert "perimeter of 36 cm" in view[1]["content"]
    t1 = env.step("t", "Query: is the width 18")
    assert t1.done is False and t1.messages == [{"role": "user", "content": "Hint 1"}]
    first = partner.calls[0]
    assert [m["role"] for m in first] == ["system", "user"] and "Never hand over the full solution" in \
        first[0]["content"]
    assert "perimeter of 36 cm" in first[1]["content"] and first[1]["content"].endswith("\n\nis the width 18")
    for k in range(2, 8):
        turn = env.step(None, f"Response: step {k}")
        assert turn.done is False
    last = partner.calls[-1]
    assert [m["role"] for m in last[1:]] == ["user", "assistant"] * 6 + ["user"]
    assert last[-2:] == [{"role": "assistant", "content": "Hint 6"}, {"role": "user", "content": "step 7"}]
    end = env.step(None, "Response: so 72?")  # the 8th message: answered by the tutor, then judged once
    assert end.done and end.info["end"] == "max_turns" and len(partner.calls) == 8
    assert end.reward == (4 / 5 + 3 / 5 + 1 / 2) / 3
    assert end.info["terms"] == {"writing_style": 4 / 5, "interaction_style": 3 / 5, "interaction_fulfillment": 0.5}
    assert len(judge.calls) == 3
    writing, interaction, features = (c[0]["content"] for c in judge.calls)
    assert "i tried 36/2 = 18 so the width is 18?" in writing and "is the width 18\nstep 2" in writing
    assert "Notation: how often" in writing
    assert "- Student: is the width 18\n- AI Tutor: Hint 1" in interaction and "- AI Tutor: Hint 8" in interaction
    assert "- Student: ok\n- AI Tutor: Write length + width = 18 using w." in interaction
    assert "1. [interaction style] Message Length: Very short, usually under ten words." in features
    assert "2. [interaction style] Feedback Style: Frequently replies with a bare 'ok'." in features
    assert [m["role"] for m in env.transcript()] == ["user", "assistant"] * 8


def test_sim_math_policy_ends_and_turn_override():
    rec = base.sample_records("sim_math")[1]
    partner = ScriptedChatModel(["What do you get first?"])
    env = base.make_env("sim_math", rec, judge=_style_judge(writing=5, interaction=5, verdicts=("Match", "Match")),
                        partner=partner)
    env.reset()
    env.step(None, "Query: Does the order matter?")
    end = env.step(None, "Thanks, I get it now. terminate conversation")
    assert end.done and end.info["end"] == "simulator_ended" and len(partner.calls) == 1
    assert end.reward == (5 / 5 + 5 / 5 + 2 / 2) / 3 and end.info["messages_sent"] == 1
    env = base.make_env("sim_math", rec, judge=_style_judge(), partner=partner, max_turns=2)
    env.reset()
    assert env.step(None, "Query: a").done is False
    assert env.step(None, "Response: b").info["end"] == "max_turns"


def test_sim_math_no_features_and_raw_field():
    rec = base.sample_records("sim_math")[2]  # fields in 'raw' JSON, no target features
    assert rec["problem"] == "What is 15% of 240?" and rec["user_profile_text"].startswith("Impatient")
    judge = _style_judge(writing=2, interaction=4)
    env = base.make_env("sim_math", rec, judge=judge, partner=ScriptedChatModel(["Try 10% first."]))
    env.reset()
    env.step(None, "Query: 36?")
    end = env.finish("context_limit")  # the runner stops it: what was said is judged
    assert end.reward == (2 / 5 + 4 / 5) / 2 and end.info["end"] == "context_limit" and len(judge.calls) == 2


@pytest.mark.parametrize("utterance", ["terminate conversation", "Query:   ", None])
def test_sim_math_ending_before_any_message_scores_zero(utterance):
    judge, partner = _style_judge(), ScriptedChatModel(["x"])
    env = base.make_env("sim_math", base.sample_records("sim_math")[0], judge=judge, partner=partner)
    env.reset()
    end = env.step(None, utterance)
    assert end.done and end.reward == 0.0 and judge.calls == [] and partner.calls == []


def test_sim_arena_judge_retry_invalid_and_partner_failure():
    rec = base.sample_records("sim_math")[2]
    answers = ["cannot say", '{"similarity_score": 3}', '{"similarity_score": 9}', "similarity_score: 2"]
    env = base.make_env("sim_math", rec, judge=ScriptedChatModel(answers), partner=ScriptedChatModel(["ok"]))
    env.reset()
    env.step(None, "Query: hm")
    end = env.step(None, "terminate conversation")
    assert end.reward == (3 / 5 + 2 / 5) / 2  # one retry per judge: 9 is out of range; "key: x" is read too
    env = base.make_env("sim_math", rec, judge=ScriptedChatModel(["?", "??"]), partner=ScriptedChatModel(["ok"]))
    env.reset()
    env.step(None, "Query: hm")
    with pytest.raises(InvalidEpisode, match="judge answer unparseable twice"):
        env.step(None, "terminate conversation")
    env = base.make_env("sim_math", rec, judge=_style_judge(), partner=ScriptedChatModel(["<think>x</think>"]))
    env.reset()
    with pytest.raises(InvalidEpisode, match="partner model gave an empty reply"):
        env.step(None, "Query: hm")


def test_sim_arena_fulfillment_needs_one_verdict_per_feature():
    assert sim_arena.parse_fulfillment('{"results": [{"classification": " no match "}, '
                                       '{"classification": "MATCH"}]}', 2) == [False, True]
    for text in ('{"results": [{"classification": "Match"}]}', '{"results": [{"classification": "Maybe"}, '
                                                               '{"classification": "Match"}]}'):
        with pytest.raises(ValueError):
            sim_arena.parse_fulfillment(text, 2)


def test_sim_doc_final_document_and_five_terms():
    rec = base.sample_records("sim_doc")[0]
    partner = ScriptedChatModel(["Here is a draft.", "Dear Library Team, ... (final)"])
    judge = _style_judge(writing=4, interaction=2, verdicts=("Match", "Match", "No Match"), rating=8)
    env = base.make_env("sim_doc", rec, judge=judge, partner=partner)
    view = env.reset()
    assert "Kind of document: cover letter" in view[0]["content"] and "used-book sale" in view[0]["content"]
    assert "High-school senior" in view[0]["content"] and "Message:" in view[1]["content"]
    assert env.step(None, "Message: can u help w my cover letter").messages[0]["content"] == "Here is a draft."
    assert partner.calls[0][1]["content"].startswith("I need help writing a document.\nKind of document: cover "
                                                     "letter") and partner.calls[0][1]["content"].endswith(
        "\n\ncan u help w my cover letter")
    end = env.step(None, "Message: perfect thx. terminate conversation")
    final_request = partner.calls[1]
    assert [m["role"] for m in final_request] == ["system", "user", "assistant", "user"]
    assert final_request[-1]["content"] == env.prompt("doc_final_request")
    assert end.info["final_document"] == "Dear Library Team, ... (final)"
    terms = {"document": 8 / 10, "writing_style": 4 / 5, "interaction_style": 2 / 5, "writing_fulfillment": 1.0,
             "interaction_fulfillment": 1 / 2}
    assert end.info["terms"] == terms and end.reward == sum(terms.values()) / 5
    rating = judge.calls[0][0]["content"]
    assert "Dear Library Team, ... (final)" in rating and "mentions the book sale, under 250 words" in rating
    features = judge.calls[3][0]["content"]
    assert "1. [writing style] Capitalization Patterns" in features and "- User: can u help w my cover letter" in \
        features and "3. [interaction style] Emotional Expression" in features


def test_sim_doc_without_features_has_two_style_terms_and_rating():
    rec = base.sample_records("sim_doc")[1]  # no target features, conversation given as text
    judge = _style_judge(writing=3, interaction=5, rating=6)
    env = base.make_env("sim_doc", rec, judge=judge, partner=ScriptedChatModel(["Draft one.", "Final."]))
    env.reset()
    env.step(None, "Message: We launch shared cookbooks next week.")
    end = env.step(None, "terminate conversation")
    assert end.reward == (6 / 10 + 3 / 5 + 5 / 5) / 3 and len(judge.calls) == 3
    assert "- User: We are launching shared cookbooks" in judge.calls[2][0]["content"]


@pytest.mark.parametrize("name,change,match", [
    ("sim_math", {"problem": None}, "missing field 'problem'"),
    ("sim_math", {"human_user_queries": 5}, "field 'human_user_queries' must be list or str"),
    ("sim_math", {"human_user_queries": ["a", 2]}, "field 'human_user_queries' must be a str or a list of str"),
    ("sim_math", {"human_public_conversation": [{"role": "tutor", "content": "x"}]},
     "field 'human_public_conversation' item 0 must be"),
    ("sim_math", {"target_interaction_style_features": [{"Feature Question": "q"}]},
     "field 'target_interaction_style_features' item 0 needs a non-empty str 'Feature Name'"),
    ("sim_math", {"target_interaction_style_features": [{"Feature Name": "Tone"}]},
     r"item 0 \('Tone'\) needs a non-empty str 'Feature Question Answer'"),
    ("sim_math", {"raw": "{not json"}, "field 'raw' is not valid JSON"),
    ("sim_doc", {"intent": None}, "missing field 'intent'"),
    ("sim_doc", {"target_writing_style_features": "lower case"}, "field 'target_writing_style_features' must be "
                                                                 "list"),
])
def test_sim_arena_bad_records(tmp_path, name, change, match):
    rec = json.loads((base.sample_path(name)).read_text().splitlines()[0])
    rec.update(change)
    rec = {k: v for k, v in rec.items() if v is not None}
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(rec) + "\n")
    with pytest.raises(EnvError, match=rf"bad.jsonl, record 0 \(task {name}\): .*{match}"):
        base.load_records(name, p)
