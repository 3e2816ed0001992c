"""Simulator evaluation (mimesis_jax/eval: conversations, usi, sim_judges, soul_eval, simulator): the JSONL
format and its errors, the 19 User-Sim Index features on hand-written conversations, Eq 15 Dice / dimensions /
ECE / Eq 16 USI5 end to end, the Eq 14 fidelity index, the Turing test and style similarity with scripted judges,
SOUL aggregation and one tiny SOUL run, and the `evalsim` command. Every expected number is worked by hand."""

import argparse
import json
import math
import os
import random
import re

import pytest

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.commands import evalsim as simulator
from mimesis_jax.eval import sim_judges, soul_eval, usi
from mimesis_jax.eval.conversations import load_conversations, pair_by_task, parse_conversation
from mimesis_jax.chat.base import ScriptedChatModel

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mimesis_jax", "eval", "data",
                       "samples")
# assistant turns full of feature triggers: only user turns may count
NOISE = "Actually, please tell me: are you sure? Thanks!! Order #W1234567, ana_b_12. I think so."


def conv(user_turns, *, cid="c", task="t", source="simulator", success=None, difficulty=None):
    msgs = []
    for u in user_turns:
        msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": NOISE}]
    return parse_conversation({"id": cid, "task_id": task, "source": source, "messages": msgs, "success": success,
                               "difficulty": difficulty}, "test")


def write_jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return str(path)


def row(cid, task, source, turns, success=None, difficulty=None):
    msgs = [m for u in turns for m in ({"role": "user", "content": u}, {"role": "assistant", "content": "Sure."})]
    return {"id": cid, "task_id": task, "source": source, "messages": msgs, "success": success,
            "difficulty": difficulty}


def zeros(**values):
    out = {f: 0.0 for f in usi.FEATURE_NAMES}
    out.update(values)
    return out


# ------------------------------------------------------------------------------------ format
def test_shipped_samples_load_and_pair_by_task():
    sim = load_conversations(os.path.join(SAMPLES, "simulator.jsonl"), "simulator")
    hum = load_conversations(os.path.join(SAMPLES, "human.jsonl"), "human")
    assert [c.id for c in sim] == ["s1", "s2", "s3", "s4"] and [c.id for c in hum] == ["h1", "h2", "h3", "h4"]
    assert (sim[0].task_id, sim[0].success, sim[0].difficulty) == ("retail_3", True, 0.7)
    pairs, unpaired = pair_by_task(sim, hum)
    assert [(p.simulator.id, p.human.id) for p in pairs] == [("s1", "h1"), ("s2", "h2"), ("s3", "h3"), ("s4", "h4")]
    assert unpaired == []
    # tasks: airline_6 d=0.1 sim 0 / human 0; retail_8 d=0.3 sim 1 / human 0; airline_2 d=0.5 1/1; retail_3 d=0.7 1/1
    # -> ECE = 1/4 * |1 - 0| = 0.25
    assert usi.usi(sim, hum)["ece"] == pytest.approx(0.25)


def test_pairing_cycles_human_references_and_reports_unpaired():
    sim = [conv(["a"], cid=f"s{i}", task=t) for i, t in enumerate(["t1", "t1", "t1", "t2", "t9"])]
    hum = [conv(["a"], cid=f"h{i}", task=t, source="human") for i, t in enumerate(["t1", "t2", "t1"])]
    pairs, unpaired = pair_by_task(sim, hum)
    assert [(p.simulator.id, p.human.id) for p in pairs] == [("s0", "h0"), ("s1", "h2"), ("s2", "h0"), ("s3", "h1")]
    assert unpaired == ["s4"]


GOOD = {"id": "x1", "task_id": "t", "source": "human", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("line, expect", [
    ("{not json", r"line 2: not valid JSON"),
    (json.dumps({**GOOD, "id": "x2", "messages": [{"role": "tool", "content": "x"}]}),
     r"line 2 \(id x2\): field 'messages\[0\]\.role'"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "task_id"} | {"id": "x2"}),
     r"line 2 \(id x2\): missing field 'task_id'"),
    (json.dumps({**GOOD, "id": "x2", "source": "simulator"}), r"line 2 \(id x2\): field 'source' is 'simulator'"),
    (json.dumps({**GOOD, "id": "x1"}), r"line 2 \(id x1\): field 'id' 'x1' is already used on line 1"),
    (json.dumps({**GOOD, "id": "x2", "difficulty": 1.5}), r"line 2 \(id x2\): field 'difficulty'"),
    (json.dumps({**GOOD, "id": "x2", "success": "yes"}), r"line 2 \(id x2\): field 'success'"),
    (json.dumps({**GOOD, "id": "x2", "messages": [{"role": "user", "content": 3}]}),
     r"line 2 \(id x2\): field 'messages\[0\]\.content'"),
    (json.dumps({**GOOD, "id": "x2", "messages": []}), r"line 2 \(id x2\): field 'messages' must be a non-empty list"),
])
def test_loader_errors_name_file_line_and_field(tmp_path, line, expect):
    path = write_jsonl(tmp_path / "h.jsonl", [GOOD, line])
    with pytest.raises(EnvError, match=re.escape(path) + ", " + expect):
        load_conversations(path, "human")


# ------------------------------------------------------------------------------------ the 19 features
def test_d1_features():
    c = conv(["Hello, I would like to return my order \u2014 please.",  # 9 words: polite, formal
              "ok thanks!",                                              # 2 words: polite, ack-only, short
              "I would like to return my order today",                   # 8 words: formal, repeats "i would like"
              "which order number?"])                                    # 3 words: short, id confusion, info question
    counts = [9, 2, 8, 3]
    mean = sum(counts) / 4
    cv = math.sqrt(sum((x - mean) ** 2 for x in counts) / 4) / mean
    assert usi.conversation_features(c) == pytest.approx(zeros(
        politeness_rate=2 / 4, short_msg_rate=2 / 4, formality_rate=2 / 4, ack_only_rate=1 / 4, verbosity_cv=cv,
        repeat_rate=1 / 4, id_confuse_rate=1 / 4,
        info_frontload=(9 + 2) / 22, user_words_per_turn=22 / 4, opening_words=9,
        info_q_rate=1 / 4))


def test_d2_features():
    c = conv(["Hi, my email is ana.lopez@example.com and my user id is ana_lopez_1234.",  # 16 words, 2 ids
              "The order is #W2378156.",                                                # 4 words, 1 id
              "yes",                                                                     # 1 word, ack-only
              "Also the code ZFA04Y."])                                                  # 4 words, 1 id
    counts = [16, 4, 1, 4]
    mean = 25 / 4
    cv = math.sqrt(sum((x - mean) ** 2 for x in counts) / 4) / mean
    assert usi.conversation_features(c) == pytest.approx(zeros(
        short_msg_rate=1 / 4, ack_only_rate=1 / 4, verbosity_cv=cv,
        info_frontload=(16 + 4) / 25, id_density=(2 + 1 + 0 + 1) / 4, user_words_per_turn=mean, opening_words=16))


def test_d3_d4_features():
    c = conv(["I think my flight was cancelled, maybe?",           # 7: hedge; question with "was" -> info
              "Are you sure? You said it was refundable.",         # 8: pushback question; accusation
              "What do you mean by credit?",                       # 6: clarification question
              "I\u2019m absolutely certain, this is ridiculous!!",  # 6: certainty; emotion ("’" read as "'")
              "Actually, forget it. When does the next one leave?"])  # 9: pivot; info question
    counts = [7, 8, 6, 6, 9]
    mean = 36 / 5
    cv = math.sqrt(sum((x - mean) ** 2 for x in counts) / 5) / mean
    assert usi.conversation_features(c) == pytest.approx(zeros(
        verbosity_cv=cv, info_frontload=(7 + 8) / 36, user_words_per_turn=mean, opening_words=7,
        uncertainty_rate=1 / 5, certainty_rate=1 / 5, pushback_q_rate=1 / 5, clarify_q_rate=1 / 5,
        info_q_rate=2 / 5, emotion_rate=1 / 5, accusation_rate=1 / 5, pivot_rate=1 / 5))


def test_single_turn_edges_and_a_conversation_without_user_turns():
    # one turn: CV 0, nothing to repeat; ack-only needs a word ("..." has none) and every word in the phrase list
    assert usi.conversation_features(conv(["..."]))["ack_only_rate"] == 0.0
    f = usi.conversation_features(conv(["Got it, thank you. Sounds good"]))
    assert (f["ack_only_rate"], f["verbosity_cv"], f["repeat_rate"], f["short_msg_rate"]) == (1.0, 0.0, 0.0, 0.0)
    assert usi.conversation_features(conv(["ok fine but why"]))["ack_only_rate"] == 0.0
    bad = parse_conversation({"id": "z", "task_id": "t", "source": "human",
                              "messages": [{"role": "assistant", "content": "hello"}]}, "f.jsonl, line 4")
    with pytest.raises(EnvError, match=r"f.jsonl, line 4 \(id z\): field 'messages' has no user turn"):
        usi.conversation_features(bad)


def test_feature_file_errors_name_the_feature(tmp_path):
    text = open(usi.FEATURES_PATH, encoding="utf-8").read()
    bad = tmp_path / "f.toml"
    bad.write_text(text.replace('kind = "words_cv"', 'kind = "magic"'), encoding="utf-8")
    with pytest.raises(EnvError, match=r"features\.verbosity_cv: 'kind' must be one of"):
        usi.load_features(bad)
    bad.write_text(text.replace("'\\bmaybe\\b'", "'(maybe'"), encoding="utf-8")
    with pytest.raises(EnvError, match=r"features\.uncertainty_rate\.patterns: bad regex"):
        usi.load_features(bad)
    bad.write_text(text.replace("[features.pivot_rate]", "[features.pivot_rates]"), encoding="utf-8")
    with pytest.raises(EnvError, match=r"missing \['pivot_rate'\], unknown \['pivot_rates'\]"):
        usi.load_features(bad)


# ------------------------------------------------------------------------------------ Dice, dimensions, ECE, USI5
def test_usi_end_to_end_on_four_conversations():
    sim = [conv(["ok"], cid="s1", task="t1", success=True, difficulty=0.1),
           conv(["please help me"], cid="s2", task="t2", success=True, difficulty=0.9)]
    hum = [conv(["ok thanks"], cid="h1", task="t1", source="human", success=False),
           conv(["help me now please"], cid="h2", task="t2", source="human", success=True)]
    out = usi.usi(sim, hum)
    # simulator means: politeness (0+1)/2, short (1+1)/2, ack (1+0)/2, frontload 1, words/turn & opening (1+3)/2
    # human means:     politeness (1+1)/2, short (1+0)/2, ack (1+0)/2, frontload 1, words/turn & opening (2+4)/2
    f = out["features"]
    assert (f["politeness_rate"]["sim"], f["politeness_rate"]["human"]) == (0.5, 1.0)
    assert f["politeness_rate"]["dice"] == pytest.approx(2 * 0.5 / 1.5)
    assert f["short_msg_rate"]["dice"] == pytest.approx(2 * 0.5 / 1.5)
    assert f["user_words_per_turn"]["dice"] == pytest.approx(2 * 2 / 5)
    assert f["emotion_rate"] == {"sim": 0.0, "human": 0.0, "dice": 1.0}
    d1 = 100 * (2 / 3 + 2 / 3 + 5 * 1) / 7
    d2 = 100 * (1 + 1 + 0.8 + 0.8) / 4
    assert out["dimensions"] == pytest.approx({"D1": d1, "D2": d2, "D3": 100.0, "D4": 100.0})
    # t1 (difficulty 0.1, bin 0): sim 1 vs human 0; t2 (0.9, bin 4): 1 vs 1 -> ECE = 1/2 * 1 + 1/2 * 0
    assert out["ece"] == pytest.approx(0.5) and out["n_ece_tasks"] == 2
    assert out["ece_bins"][0] == {"lo": 0.0, "hi": 0.2, "n": 1, "sim_rate": 1.0, "human_rate": 0.0}
    assert out["ece_bins"][4] == {"lo": 0.8, "hi": 1.0, "n": 1, "sim_rate": 1.0, "human_rate": 1.0}
    assert [b["n"] for b in out["ece_bins"][1:4]] == [0, 0, 0]
    assert out["usi5"] == pytest.approx((d1 + d2 + 100 + 100 + 100 * (1 - 0.5)) / 5)


def test_ece_needs_success_on_both_sides_and_consistent_difficulty():
    sim = [conv(["ok"], cid="s1", task="t1", success=True, difficulty=0.1)]
    hum = [conv(["ok"], cid="h1", task="t1", source="human")]  # no success: no ECE task
    out = usi.usi(sim, hum)
    assert (out["ece"], out["usi5"], out["n_ece_tasks"]) == (None, None, 0)
    hum = [parse_conversation({"id": "h1", "task_id": "t1", "source": "human", "success": False, "difficulty": 0.5,
                               "messages": [{"role": "user", "content": "ok"}]}, "h.jsonl, line 1")]
    with pytest.raises(EnvError, match=r"h.jsonl, line 1 \(id h1\): field 'difficulty' 0.5 differs from 0.1"):
        usi.usi(sim, hum)


# ------------------------------------------------------------------------------------ judges
def test_answer_parsers():
    assert sim_judges.parse_verdict("They write alike.\nVerdict: MATCH") is True
    assert sim_judges.parse_verdict("**Verdict:** mismatch") is False
    assert sim_judges.parse_verdict('{"match": false, "reason": "x"}') is False
    assert sim_judges.parse_verdict("<think>\nverdict: mismatch?\n</think>\n\nYes.") is True
    for bad in ("It does not match.", "", "maybe"):
        with pytest.raises(ValueError):
            sim_judges.parse_verdict(bad)
    assert sim_judges.parse_human("The typos give it away. Human: B") == "B"
    assert sim_judges.parse_human("the human user is in conversation A") == "A"
    assert sim_judges.parse_human("first") == "A" and sim_judges.parse_human('{"human": 2}') == "B"
    for bad in ("The human is a careful writer.", "both"):
        with pytest.raises(ValueError):
            sim_judges.parse_human(bad)
    assert sim_judges.parse_style('{"writing": 4, "interaction": {"score": 2}}') == {"writing": 4.0,
                                                                                   "interaction": 2.0}
    assert sim_judges.parse_style("Writing style: 3/5\nInteraction: 5") == {"writing": 3.0, "interaction": 5.0}
    with pytest.raises(ValueError, match="outside"):
        sim_judges.parse_style('{"writing": 7, "interaction": 2}')


def _pairs(n):
    sim = [conv([f"simulated user {i} speaking"], cid=f"s{i}", task=f"t{i}") for i in range(n)]
    hum = [conv([f"real human {i} here"], cid=f"h{i}", task=f"t{i}", source="human") for i in range(n)]
    return pair_by_task(sim, hum)[0]


def _case(text):
    return int(re.search(r"simulated user (\d+)", text).group(1))


def test_fidelity_index_with_a_scripted_judge_and_an_invalid_case():
    def judge_fn(messages):
        text = messages[0]["content"]
        case, dim = _case(text), re.search(r"## Dimension: (.+)", text).group(1)
        if case == 0:
            return "Verdict: MISMATCH" if dim == "pacing" else "Verdict: MATCH"
        if case == 1:
            if dim == "persona":
                return '{"match": false}'
            if dim == "style" and len(messages) == 1:
                return "hard to say"  # unreadable once: asked again, then read
            return "**Verdict:** match"
        return "no idea" if dim == "style" else "Verdict: MATCH"  # case 2: style unreadable twice -> INVALID
    judge = ScriptedChatModel(judge_fn)
    out = sim_judges.fidelity(_pairs(3), judge, workers=4)
    # valid cases 0 and 1: persona [1, 0], style [1, 1], technical [1, 1], interaction [1, 1], pacing [0, 1]
    assert out["dimensions"] == {"persona": 50.0, "style": 100.0, "technical_competency": 100.0,
                                 "interaction_flow": 100.0, "pacing": 50.0}
    assert out["fi"] == (50 + 100 + 100 + 100 + 50) / 5
    assert (out["n_cases"], out["n_invalid"]) == (2, 1)
    assert out["invalid"][0]["case"] == "s2" and out["invalid"][0]["dimension"] == "style"
    assert "unparseable twice" in out["invalid"][0]["reason"]
    assert len(judge.calls) == 15 + 2  # one retry for case 1's style, one for case 2's
    retry = [c for c in judge.calls if len(c) == 3]
    assert all(c[1]["role"] == "assistant" and "could not be read" in c[2]["content"] for c in retry)


def test_turing_order_is_seeded_and_a_first_saying_judge_scores_the_human_first_share():
    n, seed = 12, 3
    rng = random.Random(seed)
    human_first = [rng.random() < 0.5 for _ in range(n)]
    assert 0 < sum(human_first) < n
    judge = ScriptedChatModel(["first"])
    out = sim_judges.turing(_pairs(n), judge, seed=seed, workers=1)
    a = 100 * sum(human_first) / n
    assert out == {"a": a, "distance": abs(a - 50), "n_pairs": n, "n_invalid": 0, "invalid": []}
    for call in judge.calls:  # the human conversation is shown as A exactly in the human-first pairs
        text = call[0]["content"]
        j = _case(text)
        a_block = text.split("## Conversation A")[1].split("## Conversation B")[0]
        assert ("real human" in a_block) == human_first[j]


def test_turing_with_a_perfect_judge_and_an_invalid_pair():
    def judge_fn(messages):
        text = messages[0]["content"]
        if "simulated user 0 " in text:
            return "cannot tell"
        a_block = text.split("## Conversation A")[1].split("## Conversation B")[0]
        return "Human: A" if "real human" in a_block else "Human: B"
    out = sim_judges.turing(_pairs(5), ScriptedChatModel(judge_fn), seed=0)
    assert (out["a"], out["distance"], out["n_pairs"], out["n_invalid"]) == (100.0, 50.0, 4, 1)
    assert out["invalid"][0]["case"] == "s0"


def test_style_similarity_means_over_valid_pairs():
    answers = {0: '{"writing": 4, "interaction": 2}', 1: "writing: 3\ninteraction: 5", 2: "five and five"}
    out = sim_judges.style(_pairs(3), ScriptedChatModel(lambda m: answers[_case(m[0]["content"])]), workers=2)
    assert (out["writing"], out["interaction"]) == ((4 + 3) / 2, (2 + 5) / 2)
    assert (out["n_pairs"], out["n_invalid"]) == (2, 1)


# ------------------------------------------------------------------------------------ SOUL
def test_soul_axes_assign_every_task_once():
    from mimesis_jax.envs import soul

    axes = soul_eval.load_axes()
    assert sorted(axes) == soul.task_names() and len(axes) == 23
    assert {a: sum(v == a for v in axes.values()) for a in soul_eval.AXES} == {"CONV": 6, "SS": 3, "COG": 5,
                                                                            "ROLE": 4, "EVAL": 5}


def test_soul_aggregation_by_hand():
    scores = {"hitom": [60, 80, 70], "fantom": [40, 40, 40], "userllm": [50, 70, 60], "alignx": [None, 30, 20]}
    out = soul_eval.aggregate(scores)
    s3 = math.sqrt(3)
    hitom = out["tasks"]["hitom"]
    assert (hitom["mean"], hitom["se"], hitom["seeds"]) == (70, pytest.approx(10 / s3), [60, 80, 70])
    assert out["tasks"]["fantom"] == {"mean": 40, "se": 0.0, "seeds": [40, 40, 40]}
    alignx = out["tasks"]["alignx"]
    # alignx lacks seed 0: its own mean over 2 seeds (sample std of 30, 20 is 7.07 -> SE 5), but out of the index
    assert (alignx["mean"], alignx["se"], alignx["seeds"]) == (25, pytest.approx(5.0), [None, 30, 20])
    assert out["excluded_tasks"] == ["alignx"]
    # COG per seed: (60+40)/2, (80+40)/2, (70+40)/2 = 50, 60, 55; CONV: userllm alone
    assert out["axes"]["COG"] == pytest.approx({"mean": 55, "se": 5 / s3})
    assert out["axes"]["CONV"] == pytest.approx({"mean": 60, "se": 10 / s3}) and set(out["axes"]) == {"COG", "CONV"}
    # index per seed: (60+40+50)/3, (80+40+70)/3, (70+40+60)/3 = 50, 63.33, 56.67 -> sample std 6.67
    assert out["index"] == pytest.approx({"mean": (50 + 190 / 3 + 170 / 3) / 3, "se": (20 / 3) / s3})
    with pytest.raises(EnvError, match="same number"):
        soul_eval.aggregate({"hitom": [1, 2], "fantom": [1]})
    with pytest.raises(EnvError, match="task 'nope' has no axis"):
        soul_eval.aggregate({"nope": [1]})
    with pytest.raises(EnvError, match=r"task 'hitom', seed 1: score must be a number in \[0, 100\]"):
        soul_eval.aggregate({"hitom": [1, 120]})


def test_tiny_soul_run_hitom_and_a_judge_task():
    from mimesis_jax.envs.domains import SideModels, domain
    from mimesis_jax.chat.local import LocalChatModel
    from mimesis_jax.chat.specs import tiny_model

    config, params, tok = tiny_model("qwen3_5", 0)
    policy = LocalChatModel(config, params, tok, generation_role="assistant", enable_thinking=False, max_tokens=8)
    records = {"hitom": domain("hitom").samples(), "mirrorbench": domain("mirrorbench").samples()}
    # mirrorbench: the judge scores the proxy's user turns {"score": s}, r = s; mb-3's judge is unreadable twice
    judge = ScriptedChatModel(lambda m: "unreadable" if "why is the sky orange" in m[0]["content"]
                              else '{"score": 0.75}')
    partner = ScriptedChatModel(["Hi! What would you like to know today?"])  # mb-3 opens with the assistant
    run = soul_eval.evaluate(policy, records, SideModels(judge=judge, partner=partner), [0, 1], max_tokens=8,
                             tokenizer=tok)
    # greedy, the tiny model writes only newlines: no hitom answer (reward 0); an empty mirrorbench turn ends the
    # conversation, which is then judged: 0.75 for mb-1 and mb-2, INVALID for mb-3
    assert run["scores"] == {"hitom": [0.0, 0.0], "mirrorbench": [75.0, 75.0]}
    assert run["n_valid"] == {"hitom": 6, "mirrorbench": 4} and run["n_invalid"] == {"hitom": 0, "mirrorbench": 2}
    assert [(r["task"], r["seed"], r["record"]) for r in run["invalid"]] == [("mirrorbench", 0, 2),
                                                                             ("mirrorbench", 1, 2)]
    assert len(judge.calls) == 2 * (1 + 1 + 2)  # per seed: mb-1 and mb-2 once, mb-3 asked again
    out = soul_eval.soul_section(run)
    assert out["axes"] == {"COG": {"mean": 0.0, "se": 0.0}, "CONV": {"mean": 75.0, "se": 0.0}}
    assert out["index"] == {"mean": 37.5, "se": 0.0} and out["n_invalid"] == 2
    assert out["tasks"]["mirrorbench"]["n_invalid"] == 2


# ------------------------------------------------------------------------------------ the command
def _args(*argv):
    return simulator.add_args(argparse.ArgumentParser()).parse_args(list(argv))


def test_evalsim_command_usi_and_soul_scores(tmp_path, capsys):
    sim = write_jsonl(tmp_path / "sim.jsonl", [row("s1", "t1", "simulator", ["ok"], True, 0.1),
                                               row("s2", "t2", "simulator", ["please help me"], True, 0.9)])
    hum = write_jsonl(tmp_path / "hum.jsonl", [row("h1", "t1", "human", ["ok thanks"], False),
                                               row("h2", "t2", "human", ["help me now please"], True)])
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"hitom": [60, 80, 70], "fantom": [40, 40, 40]}))
    out = tmp_path / "out"
    assert simulator.run(_args("--conversations", sim, "--human", hum, "--soul-scores", str(scores),
                               "--name", "sim-x", "--out", str(out))) == 0
    res = json.load(open(out / "evalsim.json"))
    d1, d2 = 100 * (2 / 3 + 2 / 3 + 5) / 7, 90.0
    assert res["simulator"] == "sim-x" and set(res) == {"simulator", "usi", "soul"}
    assert res["usi"]["usi5"] == pytest.approx((d1 + d2 + 100 + 100 + 50) / 5)
    assert res["soul"]["index"] == pytest.approx({"mean": 55.0, "se": 5 / math.sqrt(3)})
    printed = capsys.readouterr().out
    assert "USI5 " in printed and "SOUL-Index 55.0 +/- 2.9" in printed


def test_evalsim_command_judge_metrics_on_the_shipped_samples(tmp_path, monkeypatch):
    from mimesis_jax.chat import specs

    def judge_fn(messages):
        text = messages[0]["content"]
        if "## Dimension:" in text:
            return "Verdict: MATCH"
        if "## Conversation A" in text:
            return "first"
        return '{"writing": 4, "interaction": 3}'
    judge = ScriptedChatModel(judge_fn)
    built = []
    monkeypatch.setattr(specs, "chat_model_from_spec", lambda spec, **kw: built.append(spec.spec) or judge)
    out = tmp_path / "out"
    assert simulator.run(_args("--conversations", os.path.join(SAMPLES, "simulator.jsonl"), "--human",
                               os.path.join(SAMPLES, "human.jsonl"), "--judge", "http://judge:1/v1", "--judge-model",
                               "j", "--seed", "4", "--out", str(out))) == 0
    res = json.load(open(out / "evalsim.json"))
    assert built == ["http://judge:1/v1"] and res["simulator"] == "simulator"
    assert res["pairs"] == {"n": 4, "unpaired": []}
    assert res["fidelity"]["fi"] == 100.0 and res["fidelity"]["dimensions"]["pacing"] == 100.0
    rng = random.Random(4)
    a = 100 * sum(rng.random() < 0.5 for _ in range(4)) / 4
    assert (res["turing"]["a"], res["turing"]["distance"], res["turing"]["n_pairs"]) == (a, abs(a - 50), 4)
    assert (res["style"]["writing"], res["style"]["interaction"]) == (4.0, 3.0)
    assert len(judge.calls) == 4 * 5 + 4 + 4


def test_evalsim_command_tiny_simulator_on_two_choice_tasks(tmp_path):
    # hitom + lifechoices: 6 prompts of < 1024 tokens, the sampler shapes of the run above (no new compile)
    out = tmp_path / "out"
    assert simulator.run(_args("--simulator", "tiny", "--soul-tasks", "hitom,lifechoices", "--seeds", "2",
                               "--seed", "5", "--simulator-max-tokens", "8", "--out", str(out))) == 0
    soul = json.load(open(out / "evalsim.json"))["soul"]
    # greedy newlines answer nothing: every rollout valid with reward 0
    assert soul["tasks"]["hitom"] == {"mean": 0.0, "se": 0.0, "seeds": [0.0, 0.0], "n_valid": 6, "n_invalid": 0}
    assert soul["tasks"]["lifechoices"]["seeds"] == [0.0, 0.0]
    assert soul["axes"] == {"COG": {"mean": 0.0, "se": 0.0}, "ROLE": {"mean": 0.0, "se": 0.0}}
    assert soul["index"] == {"mean": 0.0, "se": 0.0} and soul["n_seeds"] == 2


@pytest.mark.parametrize("argv, expect", [
    ([], "nothing to evaluate"),
    (["--conversations", "X"], "--conversations and --human go together"),
    (["--soul-scores", "S", "--simulator", "tiny"], "pick one"),
    (["--simulator", "tiny", "--soul-tasks", "hitom,nope"], r"unknown SOUL task\(s\) \['nope'\]"),
    (["--simulator", "tiny", "--soul-tasks", "userllm"], r"'userllm' needs the fixed side\(s\) \['judge'\]"),
    (["--simulator", "http://127.0.0.1:9/v1", "--soul-tasks", "hitom"], "token-level policy"),
    (["--conversations", "BAD", "--human", "HUM"], r"line 1 \(id b\): field 'source' must be one of"),
])
def test_evalsim_command_bad_input_exits_2_naming_it(tmp_path, capsys, argv, expect):
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "b", "task_id": "t", "source": "robot", "messages": []}])
    hum = write_jsonl(tmp_path / "hum.jsonl", [row("h1", "t1", "human", ["ok"])])
    argv = [{"BAD": bad, "HUM": hum, "X": hum, "S": hum}.get(a, a) for a in argv]
    assert simulator.run(_args(*argv, "--out", str(tmp_path / "o"))) == 2
    assert re.search(expect, capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "o" / "evalsim.json")
