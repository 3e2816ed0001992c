"""The ABCD realistic-behaviour environment: replay view, fixed agent, judge, Eq 12-13 reward, report, config."""

import json

import pytest

from mimesis_jax.envs.abcd import dataset as abcd
from mimesis_jax.envs.abcd.env import (
    BehaviourEnv, BehaviourEnvConfig, behaviour_report, make_behaviour_env, policy_text, replay_messages,
)
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.abcd.behaviour import ALL_IDS, BEHAVIOURS, CARD_FIELDS
from mimesis_jax.chat.base import ChatModel, ChatResponse, ScriptedChatModel

CONVS = {c.convo_id: c for c in abcd.load_conversations(abcd.SAMPLE_PATH)}
KB = abcd.load_kb(abcd.KB_PATH)
GUIDELINES = abcd.load_guidelines(abcd.GUIDELINES_PATH)


def verdict(e=0.8, p=0.6, n=0.9, c=0.7, meta=False, rationale="fine"):
    return json.dumps({"e": e, "p": p, "n": n, "c": c, "meta_narration": meta, "rationale": rationale})


def env_for(cid=1102, behaviour="B2", agent=("A1", "A2", "A3"), judge=(verdict(),), **config):
    return make_behaviour_env(CONVS[cid], agent=ScriptedChatModel(list(agent), cycle=False),
                              judge=ScriptedChatModel(list(judge), cycle=False), behaviour=behaviour,
                              config=BehaviourEnvConfig(**config))


# Eq 12 with the default weights (e 2.0, p 1.5, n 0.75, c 0.75; sum 5.0) on verdict()'s scores:
REWARD = (2.0 * 0.8 + 1.5 * 0.6 + 0.75 * 0.9 + 0.75 * 0.7) / 5.0  # = 0.74
REWARD_META = (0.75 * 0.9 + 0.75 * 0.7) / 5.0  # Eq 13: e = p = 0 -> 0.24


# ------------------------------------------------------------------------------------ reset
@pytest.mark.parametrize("cid,behaviour", [(1101, "B1"), (1102, "B7"), (1103, "N"), (1104, "B13"), (1105, "B9")])
def test_reset_view_on_each_sample(cid, behaviour):
    record = CONVS[cid]
    env = env_for(cid, behaviour)
    view = env.reset(seed=0)
    system = view[0]
    assert system["role"] == "system"
    sc = record.scenario
    for value in (sc["flow"], sc["subflow"], *sc["personal"].values(), sc["order"]["order_id"],
                  *sc["product"]["names"], "[END]"):
        assert str(value) in system["content"]
    for f in CARD_FIELDS[1:]:
        assert getattr(BEHAVIOURS[behaviour], f) in system["content"]
    replay = abcd.identity_verification_turns(record)
    dialogue = view[1:]
    # replayed customer turns are user messages, verbatim and in order
    assert [m["content"] for m in dialogue if m["role"] == "user"] == [t for s, t in replay if s == "customer"]
    # every agent turn is the last line of an assistant message, verbatim and in order (the other assistant
    # messages end with an action note, the replay's closing line or the greeting)
    fixed = ("Thanks, I have your account open now. Let's carry on.",
             "Hello, you've reached customer support. What can I do for you today?")
    last_lines = [m["content"].split("\n")[-1] for m in dialogue if m["role"] == "assistant"]
    assert [line for line in last_lines if not line.startswith("[action: ") and line not in fixed] == \
        [t for s, t in replay if s == "agent"]
    notes = [line for m in dialogue if m["role"] == "assistant" for line in m["content"].split("\n")
             if line.startswith("[action: ")]
    assert notes == [f"[action: {t}]" for s, t in replay if s == "action"]
    assert dialogue[-1]["role"] == "assistant"  # the customer (the policy) speaks next
    assert env.transcript() == dialogue


def test_replay_folding_written_out():
    env = env_for(1101)
    view = env.reset()
    assert view[1:] == [
        {"role": "user", "content": "hey there, the jacket I got is not the color in the picture"},
        {"role": "assistant", "content": "Hello! Sorry to hear that. Could I get your full name so I can look at "
                                         "your account?"},
        {"role": "user", "content": "Marisol Okafor"},
        {"role": "assistant", "content": "[action: Account has been pulled up for Marisol Okafor.]\nThank you "
                                         "Marisol. To confirm the purchase I'll need your username, email and "
                                         "order ID."},
        {"role": "user", "content": "username is mokafor412, email mokafor412@email.com"},
        {"role": "user", "content": "order 5820931746"},
        {"role": "assistant", "content": "[action: Purchase validation in progress ...]\nThanks, I have your "
                                         "account open now. Let's carry on."},
    ]
    # an action run followed by a customer turn is an assistant message of its own; a run of two is one message
    assert replay_messages([("customer", "hi, my name is Ola Berg"), ("action", "Account found."),
                            ("action", "Note added."), ("customer", "order 42"), ("action", "Order checked.")]) == [
        {"role": "user", "content": "hi, my name is Ola Berg"},
        {"role": "assistant", "content": "[action: Account found.]\n[action: Note added.]"},
        {"role": "user", "content": "order 42"},
        {"role": "assistant", "content": "[action: Order checked.]\nThanks, I have your account open now. "
                                         "Let's carry on."}]
    # nothing to replay (FAQ flow): one agent greeting
    view = env_for(1105).reset()
    assert view[1:] == [{"role": "assistant",
                         "content": "Hello, you've reached customer support. What can I do for you today?"}]


# ------------------------------------------------------------------------------------ a full episode
def test_full_episode_ends_at_max_user_turns():
    env = env_for(1102, "B2", max_user_turns=3)
    assert (env.domain, env.policy_role, env.thinking, env.multi_turn, env.max_policy_turns) == \
        ("abcd_behaviour", "user", True, True, 3)
    view = env.reset()
    t1 = env.step("they should hurry", "it's 415 Cedar Ave")
    assert (t1.done, t1.messages, t1.reward) == (False, [{"role": "assistant", "content": "A1"}], None)
    t2 = env.step(None, "oh and also change the phone number")
    assert t2.messages == [{"role": "assistant", "content": "A2"}]
    t3 = env.step("done", "and it has to be done today")
    assert t3.done and t3.messages == []
    assert t3.reward == pytest.approx(REWARD) and REWARD == pytest.approx(0.74)
    assert t3.info == {"behaviour": "B2", "reward": t3.reward, "scores": {"e": 0.8, "p": 0.6, "n": 0.9, "c": 0.7},
                       "meta_narration": False, "meta_source": None, "meta_match": None, "meta_candidates": [],
                       "judge_rationale": "fine", "end": "max_user_turns", "user_turns": 3}
    # the fixed agent: its system prompt carries the policy and the required actions; the customer is "user"
    calls = env.agent.calls
    assert len(calls) == 2
    sys_msg = calls[0][0]
    assert sys_msg["role"] == "system"
    assert "Manage Account (changes to the customer's account details) > Change Address" in sys_msg["content"]
    assert "- Never change account details before identity verification succeeds." in sys_msg["content"]
    assert "3. Verify Identity (kb query): Verify the customer before changing anything." in sys_msg["content"]
    assert "1. pull-up-account\n2. record-reason\n3. verify-identity\n4. update-account" in sys_msg["content"]
    assert calls[0][1:] == view[1:] + [{"role": "user", "content": "it's 415 Cedar Ave"}]
    assert calls[1][1:] == view[1:] + [{"role": "user", "content": "it's 415 Cedar Ave"},
                                       {"role": "assistant", "content": "A1"},
                                       {"role": "user", "content": "oh and also change the phone number"}]
    assert env.transcript() == calls[1][1:] + [{"role": "assistant", "content": "A2"},
                                               {"role": "user", "content": "and it has to be done today"}]
    # the judge: rubric + one request holding the card and the whole transcript, replay marked as context
    (judge_call,) = env.judge.calls
    assert [m["role"] for m in judge_call] == ["system", "user"]
    request = judge_call[1]["content"]
    assert "B2 Incremental goalpost shifting" in request
    for f in CARD_FIELDS[2:]:
        assert getattr(BEHAVIOURS["B2"], f) in request
    assert "Customer: I moved last month and need to update the address on my account" in request
    assert request.index("Customer: 77 Harbor Rd") < request.index("# Simulated part")
    assert ("# Simulated part (rate the customer's messages here)\nCustomer: it's 415 Cedar Ave\nAgent: A1\n"
            "Customer: oh and also change the phone number\nAgent: A2\nCustomer: and it has to be done today"
            ) in request
    with pytest.raises(EnvError, match="has ended"):
        env.step(None, "hello?")


def test_end_marker_ends_early_without_agent_call():
    env = env_for(1101, "B10")
    env.reset()
    t = env.step(None, "never mind, I'll figure it out\n[END]")
    assert t.done and t.info["end"] == "customer_ended" and t.info["user_turns"] == 1
    assert env.agent.calls == [] and t.reward == pytest.approx(REWARD)


def test_agent_thinking_is_removed():
    env = env_for(agent=("<think>check policy</think>\nSure, one moment.",))
    env.reset()
    assert env.step(None, "hi").messages == [{"role": "assistant", "content": "Sure, one moment."}]


# ------------------------------------------------------------------------------------ Eq 13 and weights
def test_meta_narration_from_judge_flag():
    env = env_for(judge=(verdict(meta=True),), max_user_turns=1)
    env.reset()
    t = env.step(None, "where is my package")
    assert t.reward == pytest.approx(REWARD_META) and REWARD_META == pytest.approx(0.24)
    assert (t.info["meta_narration"], t.info["meta_source"], t.info["meta_match"]) == (True, "judge", None)
    assert t.info["scores"] == {"e": 0.8, "p": 0.6, "n": 0.9, "c": 0.7}  # reported before Eq 13


def test_meta_narration_from_pattern():
    env = env_for(max_user_turns=2)
    env.reset()
    env.step(None, "ok the address is 415 Cedar Ave")
    t = env.step(None, "*sighs* (acting impatient) how long does this take")
    assert t.reward == pytest.approx(REWARD_META)
    assert (t.info["meta_narration"], t.info["meta_source"], t.info["meta_match"]) == (True, "pattern", "*sighs*")

    env = env_for(judge=(verdict(meta=True),), max_user_turns=1)
    env.reset()
    assert env.step(None, "I will now act like an annoyed customer").info["meta_source"] == "both"

    env = env_for(max_user_turns=1, pattern_check=False)
    env.reset()
    t = env.step(None, "*sighs* fine")
    assert t.reward == pytest.approx(REWARD) and t.info["meta_source"] is None


def test_replayed_human_turns_are_not_pattern_checked():
    record = CONVS[1102]
    original = [record.original[0], ("customer", "*sighs* I moved")] + list(record.original[2:])
    odd = abcd.Conversation(record.convo_id, record.scenario, original)
    env = BehaviourEnv(odd, agent=ScriptedChatModel(["A"]), judge=ScriptedChatModel([verdict()]), kb=KB,
                       guidelines=GUIDELINES, behaviour="B2", config=BehaviourEnvConfig(max_user_turns=1))
    assert env.reset()[2] == {"role": "user", "content": "*sighs* I moved"}
    assert env.step(None, "the new one is 415 Cedar Ave").info["meta_source"] is None


def test_weights_and_zeroed_keys_are_configurable():
    env = env_for(max_user_turns=1, weights={"e": 1.0, "p": 1.0, "n": 1.0, "c": 1.0})
    env.reset()
    assert env.step(None, "hi").reward == pytest.approx((0.8 + 0.6 + 0.9 + 0.7) / 4)  # 0.75
    env = env_for(judge=(verdict(meta=True),), max_user_turns=1, meta_narration_zeroed=("e",))
    env.reset()
    assert env.step(None, "hi").reward == pytest.approx((1.5 * 0.6 + 0.75 * 0.9 + 0.75 * 0.7) / 5.0)  # 0.42


def test_neutral_fixes_placement_at_one():
    env = env_for(behaviour="N", judge=(verdict(p=0.2),), max_user_turns=1)
    view = env.reset()
    neutral = BEHAVIOURS["N"]
    assert neutral.definition in view[0]["content"] and neutral.must_not in view[0]["content"]
    t = env.step(None, "thanks, the new address is 415 Cedar Ave")
    assert t.info["scores"] == {"e": 0.8, "p": 1.0, "n": 0.9, "c": 0.7}
    assert t.reward == pytest.approx((2.0 * 0.8 + 1.5 * 1.0 + 0.75 * 0.9 + 0.75 * 0.7) / 5.0)  # 0.86
    assert "p is always 1" in env.judge.calls[0][1]["content"]


# ------------------------------------------------------------------------------------ failures
def test_judge_retry_once_then_invalid():
    env = env_for(judge=("I think it went well.", verdict()), max_user_turns=1)
    env.reset()
    assert env.step(None, "hi").reward == pytest.approx(REWARD)
    retry = env.judge.calls[1]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert retry[2]["content"] == "I think it went well."
    assert "no JSON object" in retry[3]["content"]

    env = env_for(judge=(verdict(e=1.5), verdict(e=0.8)), max_user_turns=1)
    env.reset()
    assert env.step(None, "hi").reward == pytest.approx(REWARD)
    assert "score 'e' must be a number in [0, 1], got 1.5" in env.judge.calls[1][3]["content"]

    env = env_for(judge=("nope", verdict(meta="no")), max_user_turns=1)
    env.reset()
    with pytest.raises(InvalidEpisode, match="'meta_narration' must be true or false"):
        env.step(None, "hi")


@pytest.mark.parametrize("reply,reason", [
    (ChatResponse("", finish_reason="error", meta={"error": "endpoint down"}), "endpoint down"),
    (ChatResponse("   "), "no reply"),
    (ChatResponse("<think>still thinking", finish_reason="length"), "no reply"),
])
def test_agent_failure_is_invalid(reply, reason):
    env = env_for(agent=(reply,))
    env.reset()
    with pytest.raises(InvalidEpisode, match=reason):
        env.step(None, "hi")


def test_no_utterance_and_runner_finish():
    env = env_for()
    env.reset()
    t = env.step("I never closed my thought", None)
    assert (t.done, t.reward, t.info["end"], t.info["scores"], t.info["meta_narration"]) == \
        (True, 0.0, "no_utterance", None, None)
    assert env.judge.calls == [] and env.agent.calls == []
    env.reset()
    assert env.step(None, "  ").info["end"] == "no_utterance"

    env = env_for()
    env.reset()
    env.step(None, "hi")
    t = env.finish("context_limit")
    assert t.info["end"] == "context_limit" and t.reward == pytest.approx(REWARD)
    env = env_for()
    env.reset()
    t = env.finish("context_limit")
    assert (t.reward, t.info["scores"]) == (0.0, None) and env.judge.calls == []
    with pytest.raises(EnvError, match="reset"):
        env_for().step(None, "hi")


# ------------------------------------------------------------------------------------ behaviour assignment
@pytest.mark.parametrize("share", [1.0 / 3.0, 0.5])
def test_neutral_share_of_drawn_behaviours(share):
    agent, judge = ScriptedChatModel(["A"]), ScriptedChatModel([verdict()])
    cfg = BehaviourEnvConfig(neutral_share=share)
    drawn = [make_behaviour_env(CONVS[1101], agent=agent, judge=judge, seed=s, config=cfg).behaviour
             for s in range(3000)]
    assert abs(drawn.count("N") / 3000 - share) <= 0.03
    assert set(drawn) == set(ALL_IDS)
    env = make_behaviour_env(CONVS[1101], agent=agent, judge=judge, seed=7, config=cfg)
    assert env.behaviour == drawn[7]  # same record + seed: same behaviour (one GRPO group shares it)
    env.reset(seed=123)
    assert env.behaviour == drawn[7]  # reset never redraws


# ------------------------------------------------------------------------------------ report
def test_behaviour_report_exact():
    infos = [{"behaviour": "B1", "reward": 0.5, "meta_narration": False},
             {"behaviour": "B1", "reward": 0.7, "meta_narration": True},
             {"behaviour": "B4", "reward": 0.3, "meta_narration": False},
             {"behaviour": "N", "reward": 1.0, "meta_narration": False},
             {"behaviour": "N", "reward": 0.0, "meta_narration": None}]  # a no_utterance episode
    report = behaviour_report(infos)
    assert list(report) == ["B1", "B4", "N", "behaviours", "overall"]
    assert report["B1"] == {"count": 2, "judged": 2, "mean_reward": pytest.approx(0.6), "meta_narration_rate": 0.5}
    assert report["B4"] == {"count": 1, "judged": 1, "mean_reward": pytest.approx(0.3), "meta_narration_rate": 0.0}
    assert report["N"] == {"count": 2, "judged": 1, "mean_reward": pytest.approx(0.5), "meta_narration_rate": 0.0}
    assert report["behaviours"] == {"count": 3, "judged": 3, "mean_reward": pytest.approx(1.5 / 3),
                                    "meta_narration_rate": pytest.approx(1 / 3)}
    assert report["overall"] == {"count": 5, "judged": 4, "mean_reward": pytest.approx(2.5 / 5),
                                 "meta_narration_rate": 0.25}
    assert behaviour_report([])["overall"] == {"count": 0, "judged": 0, "mean_reward": None,
                                               "meta_narration_rate": None}
    with pytest.raises(EnvError, match=r"info #1 field 'behaviour'"):
        behaviour_report([infos[0], {"behaviour": "B14", "reward": 0.5, "meta_narration": False}])
    with pytest.raises(EnvError, match=r"info #0 field 'reward'"):
        behaviour_report([{"behaviour": "B1", "reward": 1.2, "meta_narration": False}])


def test_report_from_real_episode_infos():
    infos = []
    for behaviour, meta in (("B3", False), ("B3", True)):
        env = env_for(behaviour=behaviour, judge=(verdict(meta=meta),), max_user_turns=1)
        env.reset()
        infos.append(env.step(None, "hello").info)
    assert behaviour_report(infos)["B3"] == {"count": 2, "judged": 2,
                                             "mean_reward": pytest.approx((REWARD + REWARD_META) / 2),
                                             "meta_narration_rate": 0.5}


# ------------------------------------------------------------------------------------ config and inputs
@pytest.mark.parametrize("key,value", [
    ("neutral_share", 1.5), ("neutral_share", True), ("max_user_turns", 0), ("max_user_turns", 2.0),
    ("weights", {"x": 1.0}), ("weights", {"e": -1.0}), ("weights", [1, 2]), ("meta_narration_zeroed", ("q",)),
    ("meta_narration_zeroed", "ep"), ("pattern_check", "yes"), ("end_marker", " "), ("agent_max_tokens", 0),
    ("judge_max_tokens", 1.5), ("agent_temperature", -0.1), ("judge_temperature", float("nan")),
])
def test_config_errors_name_the_key(key, value):
    with pytest.raises(EnvError, match=f"BehaviourEnvConfig: {key}"):
        BehaviourEnvConfig(**{key: value})


def test_config_from_dict():
    cfg = BehaviourEnvConfig.from_dict({"max_user_turns": 4, "weights": {"e": 3.0},
                                        "meta_narration_zeroed": ["e", "p", "c"]})
    assert cfg.max_user_turns == 4 and cfg.meta_narration_zeroed == ("e", "p", "c")
    assert cfg.weights == {"e": 3.0, "p": 1.5, "n": 0.75, "c": 0.75}
    with pytest.raises(EnvError, match="unknown key 'max_turns'"):
        BehaviourEnvConfig.from_dict({"max_turns": 4})


def test_bad_inputs_name_the_record_and_field():
    record = CONVS[1101]
    agent, judge = ScriptedChatModel(["A"]), ScriptedChatModel([verdict()])
    with pytest.raises(EnvError, match="behaviour must be one of"):
        make_behaviour_env(record, agent=agent, judge=judge, behaviour="B0")
    with pytest.raises(EnvError, match="convo_id=1101.*kb: subflow 'return_color' is missing"):
        make_behaviour_env(record, agent=agent, judge=judge, kb={"jeans": []})
    with pytest.raises(EnvError, match="convo_id=1101.*guidelines: no entry matches 'product_defect'"):
        make_behaviour_env(record, agent=agent, judge=judge, guidelines={"Order Issue": {"subflows": {}}})
    bad = {"Product Defect": {"description": "d", "subflows": {"Return Due to Color": {"instructions": [],
                                                                                        "actions": [{"text": "t"}]}}}}
    with pytest.raises(EnvError, match=r"Return Due to Color'\]: field 'actions\[0\].button'"):
        make_behaviour_env(record, agent=agent, judge=judge, guidelines=bad)
    with pytest.raises(EnvError, match="judge must subclass ChatModel"):
        make_behaviour_env(record, agent=agent, judge=None)
    with pytest.raises(EnvError, match="abcd.Conversation"):
        make_behaviour_env({"convo_id": 1}, agent=agent, judge=judge)


def test_guidelines_names_matched_to_ids():
    def entry(text):
        return {"instructions": [f"say {text}"], "actions": [{"type": "interaction", "button": "Do", "text": text}]}
    guidelines = {"Billing Trouble": {"description": "money", "subflows": {
        "Late Refund Notice": entry("late"), "Charged Twice": entry("twice"), "Status Alpha": entry("a"),
        "Status Beta": entry("b")}}}
    assert policy_text(guidelines, "billing_trouble", "refund_late") == (
        "Case: Billing Trouble (money) > Late Refund Notice\nInstructions:\n- say late\nSteps:\n"
        "1. Do (interaction): late")
    assert "> Charged Twice" in policy_text(guidelines, "billing_trouble", "double_charged")
    assert "> Status Beta" in policy_text(guidelines, "billing_trouble", "status_beta")
    with pytest.raises(EnvError, match="'status' matches .* equally"):
        policy_text(guidelines, "billing_trouble", "status")
    with pytest.raises(EnvError, match="no entry matches 'gift_wrap'"):
        policy_text(guidelines, "billing_trouble", "gift_wrap")


def test_every_shipped_sample_has_policy_and_actions():
    for record in CONVS.values():
        env = make_behaviour_env(record, agent=ScriptedChatModel(["A"]), judge=ScriptedChatModel([verdict()]),
                                 behaviour="N")
        assert env.actions == KB[record.subflow]
        assert "Case: " in env.policy


def test_in_character_speech_keeps_e_and_p_and_the_judge_sees_the_candidates():
    """The four sentences issue 22 reported: the judge says no meta-narration, so e and p count (Eq 12 with the
    default weights on verdict()'s scores = 0.74, not Eq 13's 0.24); the candidates are in its request."""
    said = ["shipping it late is out of character for you guys", "In my role as office manager I ordered these",
            "As a frustrated customer, I want this fixed today", "I will pretend I did not hear that"]
    seen = []

    class Judge(ChatModel):
        def chat(self, messages, **_):
            seen.append(messages)
            return ChatResponse(text=verdict())

    judge = Judge()
    env = make_behaviour_env(CONVS[1102], agent=ScriptedChatModel(["A1", "A2", "A3"], cycle=False), judge=judge,
                             behaviour="B2", config=BehaviourEnvConfig(max_user_turns=4))
    env.reset()
    for u in said:
        t = env.step(None, u)
    assert t.done and t.reward == pytest.approx((2.0 * 0.8 + 1.5 * 0.6 + 0.75 * 0.9 + 0.75 * 0.7) / 5.0)
    assert (t.info["meta_narration"], t.info["meta_source"], t.info["meta_match"]) == (False, None, None)
    assert t.info["meta_candidates"] == ["out of character", "my role", "As a frustrated customer",
                                         "I will pretend"]
    request = seen[-1][1]["content"]
    for c in t.info["meta_candidates"]:
        assert f"- {c!r}" in request
    # the judge's flag still zeroes e and p on such a turn
    env = env_for(judge=(verdict(meta=True),), max_user_turns=1)
    env.reset()
    t = env.step(None, said[2])
    assert t.reward == pytest.approx(REWARD_META) and t.info["meta_source"] == "judge"
