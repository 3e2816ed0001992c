"""SOUL group 3: coser, sotopia, mirrorbench, userllm (envs/soul; Stage I joint RL, Eq 4). Scripted judges and
partners; every reward is worked out by hand here."""

import json

import pytest

import mimesis_jax.envs.soul.coser  # noqa: F401 -- registers the tasks
import mimesis_jax.envs.soul.mirrorbench  # noqa: F401
import mimesis_jax.envs.soul.sotopia  # noqa: F401
import mimesis_jax.envs.soul.userllm  # noqa: F401
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.soul import load_records, make_env, sample_records, task_info
from mimesis_jax.chat.base import ScriptedChatModel

COSER_JSON = json.dumps({"storyline_consistency": {"reasoning": "close", "score": 7}, "character_fidelity": 5,
                         "anthropomorphism": {"score": 4}, "storyline_quality": {"score": "10"}})
COSER_R = ((7 - 1) / 9 + (5 - 1) / 9 + (4 - 1) / 9 + (10 - 1) / 9) / 4
SOTOPIA_SCORES = {"believability": 8, "relationship": 2, "knowledge": 4, "secret": -2, "social_rules": 0,
                  "financial_and_material_benefits": 1, "goal": 6}
# weighted mean of (s - lo) / (hi - lo): (0.5*0.8 + 1*0.7 + 1*0.4 + 0.5*0.8 + 0.5*1 + 0.5*0.6 + 2*0.6) / 6 = 3.9 / 6
SOTOPIA_MEAN = (0.5 * 0.8 + 1 * 0.7 + 1 * 0.4 + 0.5 * 0.8 + 0.5 * 1.0 + 0.5 * 0.6 + 2 * 0.6) / 6


def sotopia_json(risk="low", **override):
    return json.dumps({**{k: {"reasoning": "r", "score": v} for k, v in SOTOPIA_SCORES.items()}, **override,
                       "naturalness_risk": risk})


SOTOPIA_SPEAK = json.dumps({"action_type": "speak", "argument": "Morning! Got a minute about the van?"})
# task -> (sample index, policy replies, partner replies, good judge answer, expected reward, rubric marker)
EPISODES = {
    "coser": (0, ["[Stay calm.] (sets down the lamp) Evening, Maud.", "The forty crowns, Maud."],
              ["Maud Renner: (without looking up) Elias."], COSER_JSON, COSER_R, "storyline_consistency"),
    "sotopia": (0, [SOTOPIA_SPEAK, "I start early, you see."], ['{"action_type": "speak", "argument": "Sure."}'],
                sotopia_json("medium"), SOTOPIA_MEAN / 2, "financial_and_material_benefits"),
    "mirrorbench": (0, ["User: have rice n eggs, quick dinner?", "dont have soy sauce"], ["Try egg fried rice."],
                    '{"reasoning": "close", "score": 0.7}', (0.7 - 0.0) / (1.0 - 0.0), "Judge only the USER turns"),
    # prism: intent {plan, cheap, weekend, trip, lisbon}, reply {any, tips, lisbon, budget}: overlap 1/4;
    # no end marker and is_last_turn false: termination 1; detector HUMAN: 1
    "userllm": (0, ["any tips for lisbon on a budget"], [], "HUMAN", (0.25 + 1 + 1) / 3, "HUMAN or AI"),
}
MAX_TURNS = {"coser": 2, "sotopia": 2, "mirrorbench": 2, "userllm": 1}


def run(task, record, replies, judge, partner=None, **opts):
    env = make_env(task, record, judge=judge, partner=partner, **opts)
    view = env.reset()
    turns = []
    for reply in replies:
        turns.append(env.step(None, reply))
        view += [{"role": "assistant", "content": reply}] + turns[-1].messages
        if turns[-1].done:
            break
    return env, view, turns


@pytest.mark.parametrize("task,count", [("coser", 3), ("sotopia", 3), ("mirrorbench", 3), ("userllm", 6)])
def test_samples_load_and_register(task, count):
    assert len(sample_records(task)) == count
    info = task_info(task)
    assert (info.family, info.multi_turn, info.real_format) == ("judge", task != "userllm", True)


@pytest.mark.parametrize("task,index,expect,partner", [
    ("coser", 0, ["You are Elias Thorne", "The Lamplighter's Debt", "avoids talking about the debt",
                  "my daughter's passage", "### Maud Renner", "inner thoughts in square brackets"], None),
    ("coser", 1, ["You are Ines Okafor", "altered", "put actions in round brackets", "Environment: Fog rolls in."],
     "Environment: Fog rolls in."),
    ("sotopia", 0, ["You are Priya Nair", "Priya Nair wants Jonas Berg to stop parking", "night-shift nurse",
                    "before 7 am", "Relationship: neighbours", "Jonas Berg's background: unknown"], None),
    ("sotopia", 1, ["You are Ana Duarte", "at least 150 euros", "Relationship: know each other by name",
                    'Lucas Moreau said: "Hi, how much?"'], '{"action_type": "speak", "argument": "Hi, how much?"}'),
    ("mirrorbench", 0, ["leftover rice and eggs", "Write the next user message."], None),
    ("mirrorbench", 2, ["why the sky looks orange", "AI: Hello!\n\nWrite the next user message."], "Hello!"),
    ("userllm", 0, ["in order to plan a cheap weekend trip to Lisbon", "first message"], None),
    ("userllm", 1, ["repotting a root-bound fern", "roots coming out the bottom", "<|endconversation|>"], None),
])
def test_reset_puts_the_record_in_the_view(task, index, expect, partner):
    p = ScriptedChatModel([partner]) if partner else None
    env = make_env(task, sample_records(task)[index], judge=ScriptedChatModel(["unused"]), partner=p)
    text = "\n".join(m["content"] for m in env.reset())
    for s in expect:
        assert s in text, s
    assert "assistant language model" not in text  # userllm's intent prefix is dropped
    if p:
        assert len(p.calls) == 1  # the partner opens when the policy's side does not


@pytest.mark.parametrize("task", sorted(EPISODES))
def test_judged_reward(task):
    index, replies, partner, answer, expected, marker = EPISODES[task]
    judge = ScriptedChatModel([answer])
    env, _, turns = run(task, sample_records(task)[index], replies, judge, ScriptedChatModel(partner or ["-"]),
                        max_turns=MAX_TURNS[task])
    assert [t.done for t in turns] == [False] * (len(replies) - 1) + [True]
    assert turns[-1].reward == pytest.approx(expected)
    assert len(judge.calls) == 1
    seen = "\n".join(m["content"] for m in judge.calls[0])
    assert marker in seen
    assert replies[-1] in seen


@pytest.mark.parametrize("task,bad", [
    ("coser", COSER_JSON.replace('"10"', "11")), ("sotopia", sotopia_json("extreme")),
    ("mirrorbench", '{"score": 1.5}'), ("userllm", "HUMAN or AI, hard to say")])
def test_unparseable_judge_is_asked_again_then_invalid(task, bad):
    index, replies, partner, answer, expected, _ = EPISODES[task]
    record = sample_records(task)[index]
    judge = ScriptedChatModel([bad, answer], cycle=False)
    _, _, turns = run(task, record, replies, judge, ScriptedChatModel(partner or ["-"]), max_turns=MAX_TURNS[task])
    assert turns[-1].reward == pytest.approx(expected) and len(judge.calls) == 2
    assert "could not be read" in judge.calls[1][-1]["content"]
    with pytest.raises(InvalidEpisode, match="unparseable twice"):
        run(task, record, replies, ScriptedChatModel([bad]), ScriptedChatModel(partner or ["-"]),
            max_turns=MAX_TURNS[task])


@pytest.mark.parametrize("task", sorted(EPISODES))
def test_no_utterance_scores_zero_without_a_judge(task):
    judge = ScriptedChatModel(["unused"])
    env = make_env(task, sample_records(task)[0], judge=judge, partner=ScriptedChatModel(["-"]))
    env.reset()
    turn = env.step("thinking...", None)
    assert (turn.done, turn.reward, judge.calls) == (True, 0.0, [])


@pytest.mark.parametrize("task", ["coser", "sotopia", "mirrorbench"])
def test_empty_reply_ends_the_dialogue_and_is_judged(task):
    index, replies, partner, answer, expected, _ = EPISODES[task]
    judge = ScriptedChatModel([answer])
    _, _, turns = run(task, sample_records(task)[index], [replies[0], "  "], judge, ScriptedChatModel(partner))
    assert turns[-1].info["end"] == "empty_reply" and turns[-1].info["policy_turns"] == 2
    assert turns[-1].reward == pytest.approx(expected) and len(judge.calls) == 1


# ------------------------------------------------------------------------------------ coser
def test_coser_partner_view_early_end_ignored_and_late_end_honoured():
    partner = ScriptedChatModel(["Maud Renner: [Not now.] (smiles) By spring.", "Maud Renner: Enough. <END SCENE>",
                                 "Environment: The clocks strike eight.\n<END SCENE>"], cycle=False)
    judge = ScriptedChatModel([COSER_JSON])
    replies = ["[Be firm.] Evening, Maud.", "Spring is late this year.", "(leaves) Good night.", "never reached"]
    env, view, turns = run("coser", sample_records("coser")[0], replies, judge, partner)
    # turn 2's early marker is dropped and the scene goes on; turn 3's ends it (min_policy_turns = 3)
    assert [t.done for t in turns] == [False, False, True]
    assert turns[0].messages[0]["content"] == "Maud Renner: (smiles) By spring."  # the partner's thought hidden
    assert turns[1].messages[0]["content"] == "Maud Renner: Enough."
    assert turns[2].info["end"] == "partner_ended" and turns[2].reward == pytest.approx(COSER_R)
    last = partner.calls[-1]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "Someone else plays Elias Thorne" in last[0]["content"]
    assert last[1]["content"] == "The scene begins.\n\nElias Thorne: Evening, Maud."  # thought removed, named
    assert last[2]["content"] == "Maud Renner: [Not now.] (smiles) By spring."  # its own turn, as written
    assert last[5]["content"].startswith("Elias Thorne: (leaves) Good night.\n\n(Write what happens next")
    scene = judge.calls[0][1]["content"]
    assert "Elias Thorne: Evening, Maud." in scene and "The clocks strike eight." in scene
    assert "<END SCENE>" not in scene and "[Be firm.]" not in scene and "[Not now.]" not in scene
    rubric = judge.calls[0][0]["content"]
    assert "Maud Renner: (keeps her eyes on a watch)" in rubric and "[I must not lose my temper.]" not in rubric


def test_coser_stops_at_max_turns_and_character_option():
    partner = ScriptedChatModel(["Maud Renner: Hm."])
    env, _, turns = run("coser", sample_records("coser")[0], ["a", "b", "c"], ScriptedChatModel([COSER_JSON]),
                        partner, max_turns=2)
    assert len(turns) == 2 and turns[-1].info["end"] == "judged" and len(partner.calls) == 1
    env = make_env("coser", sample_records("coser")[0], partner=ScriptedChatModel(["Elias Thorne: Evening."]),
                   character="Maud Renner")
    view = env.reset()  # Elias speaks first, so the partner opens
    assert "You are Maud Renner" in view[0]["content"] and view[1]["content"].endswith("Elias Thorne: Evening.")
    # an end marker alone, too early: the policy is told the scene goes on
    _, _, turns = run("coser", sample_records("coser")[0], ["a", "b"], ScriptedChatModel([COSER_JSON]),
                      ScriptedChatModel(["<END SCENE>"]))
    assert turns[0].messages[0]["content"] == "(The scene goes on. It is Elias Thorne's turn.)"
    with pytest.raises(EnvError, match="'Ghost' is not one of the scene's speaking characters"):
        make_env("coser", sample_records("coser")[0], character="Ghost")


# ------------------------------------------------------------------------------------ sotopia
def act(kind, argument=""):
    return json.dumps({"action_type": kind, "argument": argument})


def test_sotopia_leave_rules_and_partner_view():
    # turn indices (both sides): policy 0, partner 1 (early leave: ignored), policy 2, partner 3, policy 4,
    # partner 5 (leave after 5 turns: ends)
    partner = ScriptedChatModel([act("leave"), act("non-verbal communication", "shrugs"), act("leave")], cycle=False)
    judge = ScriptedChatModel([sotopia_json("low")])
    replies = [SOTOPIA_SPEAK, "plain words count as speech", act("action", "hands him a coffee"), "unused"]
    env, view, turns = run("sotopia", sample_records("sotopia")[0], replies, judge, partner)
    assert [t.done for t in turns] == [False, False, True] and turns[-1].info["end"] == "partner_left"
    assert turns[0].messages[0]["content"] == "Jonas Berg left the conversation"
    assert turns[1].messages[0]["content"] == "Jonas Berg [non-verbal communication] shrugs"
    assert turns[-1].reward == pytest.approx(SOTOPIA_MEAN)
    last = partner.calls[-1]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "You are Jonas Berg" in last[0]["content"] and "fined for parking" in last[0]["content"]
    assert last[1]["content"] == ('The conversation starts now.\n\nPriya Nair said: "Morning! Got a minute about '
                                  'the van?"')
    assert last[3]["content"] == 'Priya Nair said: "plain words count as speech"'
    assert last[5]["content"] == "Priya Nair [action] hands him a coffee"
    history = judge.calls[0][0]["content"]
    assert "Score only Priya Nair" in history and "Jonas Berg left the conversation" in history


def test_sotopia_policy_leave_and_risk_divisors():
    partner = ScriptedChatModel([act("speak", "ok")])
    replies = [act("leave"), "hi", "so", act("leave"), "unused"]  # policy turns at indices 0 (ignored), 2, 4, 6
    for risk, k in (("low", 1), ("Medium", 2), ("HIGH", 4)):
        _, _, turns = run("sotopia", sample_records("sotopia")[0], replies, ScriptedChatModel([sotopia_json(risk)]),
                          partner)
        assert len(turns) == 4 and turns[-1].info["end"] == "policy_left"
        assert turns[-1].reward == pytest.approx(SOTOPIA_MEAN / k)
        assert turns[-1].info["judge_score"]["naturalness_risk"] == risk.lower()
    # the extremes: every dimension at its top (and at its bottom)
    top = dict(believability=10, relationship=5, knowledge=10, secret=0, social_rules=0,
               financial_and_material_benefits=5, goal=10)
    _, _, turns = run("sotopia", sample_records("sotopia")[2], ["a"], ScriptedChatModel([sotopia_json(**top)]),
                      partner, max_turns=1)
    assert turns[-1].reward == 1.0


# ------------------------------------------------------------------------------------ mirrorbench
def test_mirrorbench_schedule_follows_the_real_turns():
    # real: user, assistant, user, user, assistant, user -> 4 policy turns; replies after turns 1 and 3 only
    partner = ScriptedChatModel(["Sure, about what?", "Here's a draft."], cycle=False)
    judge = ScriptedChatModel(['{"score": 0.25}'])
    env, _, turns = run("mirrorbench", sample_records("mirrorbench")[1], ["hey help w a letter", "heater broke",
                                                                          "make it firm", "thx"], judge, partner)
    assert [t.messages[0]["content"] for t in turns[:3]] == [
        "AI: Sure, about what?\n\nWrite the next user message.", "Write the next user message.",
        "AI: Here's a draft.\n\nWrite the next user message."]
    assert turns[3].done and turns[3].reward == 0.25 and env.max_policy_turns == 4
    last = partner.calls[-1]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "user"]
    assert "USER: heater broke 2 days ago, its freezing" in last[0]["content"]
    proxy = judge.calls[0][0]["content"].split("## Simulated conversation")[1]
    assert "USER: hey help w a letter\nASSISTANT: Sure, about what?\nUSER: heater broke" in proxy


def test_mirrorbench_max_turns_cuts_the_reference():
    judge = ScriptedChatModel(['{"score": 1}'])
    env, _, turns = run("mirrorbench", sample_records("mirrorbench")[2], ["why orange sky"], judge,
                        ScriptedChatModel(["Hello!"]), max_turns=1)
    real = judge.calls[0][0]["content"].split("## Simulated conversation")[0]
    assert turns[-1].reward == 1.0 and "why is the sky orange" in real and "same reason" not in real


# ------------------------------------------------------------------------------------ userllm
@pytest.mark.parametrize("reply,mentioned,reward", [
    ("is it the linen closet?", 1, 0.0), ("linen closet or bookshelf?", 2, 0.0),
    ("linen closet, refrigerator, mailbox, oven, or bookshelf?", 5, 0.0), ("linen closet refrigerator mailbox", 3, 1.0),
    ("where do ppl keep spare blankets", 0, 1.0), ("ovens are hot, right?", 0, 1.0)])
def test_userllm_role_adherence(reply, mentioned, reward):
    judge = ScriptedChatModel(["unused"])
    _, _, turns = run("userllm", sample_records("userllm")[2], [reply], judge)
    assert (turns[0].reward, turns[0].info["judge_score"]["choices_mentioned"], judge.calls) == (reward, mentioned, [])


@pytest.mark.parametrize("index,reply,answer,reward,calls", [
    (4, "ok but who designed it tho", "REFUSED", 1.0, 1), (4, "sure, vintage tips pls", "accepted.", 0.0, 1),
    (4, "", "unused", 0.0, 0),
    # prism, is_last_turn true: the lone end marker -> overlap 0, termination 1, no detector call (0)
    (1, "<|endconversation|>", "unused", (0 + 1 + 0) / 3, 0),
    # text after the marker is dropped, the marker itself is a word (as in OdysSim): overlap
    # {fern} / {ok, thx, fern, saved, endconversation} = 1/5; the detector's thought is ignored: AI -> 0
    (1, "ok thx fern saved <|endconversation|> more text", "<think>HUMAN?</think>AI", (1 / 5 + 1 + 0) / 3, 1),
])
def test_userllm_prism_and_intent_adherence(index, reply, answer, reward, calls):
    judge = ScriptedChatModel([answer])
    _, _, turns = run("userllm", sample_records("userllm")[index], [reply], judge)
    assert turns[0].reward == pytest.approx(reward) and len(judge.calls) == calls
    if calls and index == 1:
        assert "ok thx fern saved\n" in judge.calls[0][0]["content"] and "more text" not in judge.calls[0][0]["content"]


# ------------------------------------------------------------------------------------ malformed records
def _edit(task, index, fn):
    rec = json.loads(json.dumps(sample_records(task)[index]))
    fn(rec)
    return rec


@pytest.mark.parametrize("task,index,edit,field", [
    ("coser", 0, lambda r: r.pop("circumstance"), "circumstance"),
    ("coser", 0, lambda r: r["circumstance"].update(book=3), "book"),
    ("coser", 0, lambda r: r.update(circumstance="{not json"), "circumstance"),
    ("coser", 0, lambda r: r["circumstance"]["dialogues"][1].pop("message"), "message"),
    ("coser", 0, lambda r: r["circumstance"].update(speaking_characters_w_env=["Environment"]),
     "speaking_characters_w_env"),
    ("coser", 0, lambda r: r.update(continue_from=2), "continue_from"),
    ("sotopia", 0, lambda r: r.pop("agent2_name"), "agent2_name"),
    ("sotopia", 0, lambda r: r.update(agent1_goal=["win"]), "agent1_goal"),
    ("sotopia", 0, lambda r: r.update(eval_position="agent3"), "eval_position"),
    ("sotopia", 0, lambda r: r.update(relationship=9), "relationship"),
    ("mirrorbench", 0, lambda r: r.update(turns="hi"), "turns"),
    ("mirrorbench", 0, lambda r: r["turns"][1].update(role="system"), "role"),
    ("mirrorbench", 0, lambda r: r["turns"][0].update(content=None), "content"),
    ("mirrorbench", 0, lambda r: r.update(turns=[{"role": "assistant", "content": "hi"}]), "turns"),
    ("userllm", 0, lambda r: r.update(source="reddit"), "source"),
    ("userllm", 0, lambda r: r.pop("is_last_turn"), "is_last_turn"),
    ("userllm", 0, lambda r: r.update(is_last_turn="maybe"), "is_last_turn"),
    ("userllm", 0, lambda r: r.update(intent=""), "intent"),
    ("userllm", 2, lambda r: r.update(choices={"label": ["A"], "text": []}), "choices"),
    ("userllm", 4, lambda r: r.pop("question"), "question"),
])
def test_malformed_record_names_file_record_and_field(tmp_path, task, index, edit, field):
    path = tmp_path / f"{task}.jsonl"
    good = json.dumps(sample_records(task)[0])
    path.write_text(good + "\n" + json.dumps({"extra_info": _edit(task, index, edit)}) + "\n")
    with pytest.raises(EnvError) as err:
        load_records(task, path)
    msg = str(err.value)
    assert str(path) in msg and "record 1" in msg and f"'{field}'" in msg, msg
