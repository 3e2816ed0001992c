"""PersuadeGym: stance rewards (relative to the previous stance), termination, the private thought, the persuadee
retry, INVALID paths, the shipped data and tasks, and a whole episode through the runner."""

import json

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import tool_call_text
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.userrl import load_tasks, make_env, shipped_tasks
from mimesis_jax.envs.userrl.common import DATA_DIR
from mimesis_jax.envs.userrl.persuade import PersuadeEnv
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

SCALE = ["Strongly Agree", "Agree", "Partly Agree", "Neutral", "Partly Disagree", "Disagree", "Strongly Disagree"]
STATEMENT = {"id": "T1", "claim": "Cats are better than dogs", "argument": "Cats are quiet and independent."}


def expected_reward(prev: str, new: str) -> float:
    """The rule written out: levels toward disagreement relative to the previous stance, /6, 6 places, 0 if <= 0."""
    moved = SCALE.index(new) - SCALE.index(prev)
    return 0.0 if moved <= 0 else min(1.0, round(moved / 6, 6))


def reply(stance, response="I hear you.", thought="hmm"):
    return json.dumps({"thought": thought, "response": response, "stance": stance})


def make(replies, **kw):
    user = ScriptedChatModel(replies, cycle=False)
    env = PersuadeEnv(dict(STATEMENT), user=user, **kw)
    env.reset()
    return env, user


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


# ------------------------------------------------------------------------------------ rewards
@pytest.mark.parametrize("target", SCALE)
def test_reward_for_each_move_from_strongly_agree(target):
    env, _ = make([reply(target)])
    _, reward, terminated, truncated, info = env.step(f"[answer] argument toward {target}")
    assert reward == expected_reward("Strongly Agree", target)
    assert terminated == (target == "Strongly Disagree") and not truncated
    assert info["stance"] == target and info["previous_stance"] == "Strongly Agree"


def test_rewards_are_relative_to_the_previous_stance_not_the_best():
    path = ["Agree", "Agree", "Disagree", "Partly Agree", "Neutral", "Strongly Agree", "Strongly Disagree"]
    env, _ = make([reply(s) for s in path])
    prev, got, ends = "Strongly Agree", [], []
    for s in path:
        _, r, term, trunc, info = env.step(f"[answer] push toward {s}")
        assert r == expected_reward(prev, s) and info["levels_moved"] == SCALE.index(s) - SCALE.index(prev)
        got.append(r)
        ends.append(term)
        prev = s
    # 1 level, none, 4 levels, moved back (0), 1 level below the best so far still pays, back again, 6 levels
    assert got == [0.166667, 0.0, 0.666667, 0.0, 0.166667, 0.0, 1.0]
    assert ends == [False] * 6 + [True]
    with pytest.raises(EnvError, match="episode has ended"):
        env.step("[answer] more")


def test_stance_matching_tolerates_case_and_spaces():
    env, _ = make([reply("  partly   DISAGREE. ")])
    _, r, _, _, info = env.step("[answer] x")
    assert info["stance"] == "Partly Disagree" and r == expected_reward("Strongly Agree", "Partly Disagree")


def test_truncated_at_max_steps_without_reaching_strongly_disagree():
    env, _ = make([reply("Agree"), reply("Partly Agree")], max_steps=2)
    assert env.step("[answer] a")[2:4] == (False, False)
    _, r, terminated, truncated, _ = env.step("[answer] b")
    assert (terminated, truncated) == (False, True) and r == expected_reward("Agree", "Partly Agree")


# ------------------------------------------------------------------------------------ what each side sees
def test_only_the_response_reaches_the_agent_and_the_thought_is_private():
    env, user = make([reply("Neutral", response="Fair point about noise.", thought="SECRET-THOUGHT")])
    obs, _, _, _, info = env.step("[answer] Dogs protect homes.")
    assert obs["feedback"] == "Fair point about noise."
    assert "SECRET" not in obs["feedback"] and "Neutral" not in obs["feedback"]
    assert info["user_thought"] == "SECRET-THOUGHT" and info["user_utterance"] == "Fair point about noise."
    assert info["to_user"] is None
    [msgs] = user.calls
    assert [m["role"] for m in msgs] == ["system", "user"]
    assert "Cats are better than dogs" in msgs[1]["content"] and "Cats are quiet" in msgs[1]["content"]
    assert "Dogs protect homes." in msgs[1]["content"] and "Strongly Agree" in msgs[1]["content"]


def test_think_block_and_json_thought_are_both_kept_private():
    env, _ = make(["<think>\nouter idea\n</think>\n\n" + reply("Agree", thought="inner idea")], user_thinking=True)
    obs, _, _, _, info = env.step("[answer] x")
    assert info["user_thought"] == "outer idea\n\ninner idea" and obs["feedback"] == "I hear you."


def test_history_and_previous_stance_reach_the_next_prompt():
    env, user = make([reply("Agree", response="First answer."), reply("Agree")])
    env.step("[answer] First argument.")
    env.step("[action] Second argument.")
    second = user.calls[1][1]["content"]
    assert "First argument." in second and "First answer." in second and "Second argument." in second
    assert "# Your stance before this argument\nAgree" in second


def test_choices_action_answer_search_as_userrl():
    env, user = make([reply("Agree"), reply("Agree"), reply("Agree")])
    env.step("[action] plain action")
    env.step("[answer] plain answer")
    env.step("[search] looked up")
    latest = [c[1]["content"].split("# The persuader's newest argument\n")[1].split("\n")[0] for c in user.calls]
    assert latest == ["plain action", "plain answer", "[search] looked up"]


def test_missing_prefix_is_an_invalid_action_without_a_model_call():
    env, user = make([reply("Agree")])
    obs, r, term, trunc, info = env.step("no prefix here")
    assert r == 0.0 and not term and "invalid_action" in info and user.calls == []


# ------------------------------------------------------------------------------------ INVALID paths
def test_unparseable_once_is_retried():
    env, user = make(["I simply disagree with you.", reply("Partly Agree", response="OK then.")])
    obs, r, _, _, info = env.step("[answer] x")
    assert len(user.calls) == 2 and user.calls[0] == user.calls[1]
    assert obs["feedback"] == "OK then." and r == expected_reward("Strongly Agree", "Partly Agree")


@pytest.mark.parametrize("bad", ["no json at all", reply("Somewhat Agree"), json.dumps({"stance": "Agree"}),
                                 json.dumps({"response": "hi"})])
def test_unparseable_twice_is_invalid(bad):
    env, user = make([bad, bad])
    with pytest.raises(InvalidEpisode, match="persuadee's answer did not parse twice"):
        env.step("[answer] x")
    assert len(user.calls) == 2


def test_refusing_persuadee_is_invalid_at_once():
    env, user = make(["As an AI language model, I cannot pretend to hold opinions.", reply("Agree")])
    with pytest.raises(InvalidEpisode, match="refused its role"):
        env.step("[answer] x")
    assert len(user.calls) == 1


def test_refusal_inside_the_json_is_invalid():
    env, _ = make([reply("Agree", response="As an AI language model, I have no stance.")])
    with pytest.raises(InvalidEpisode, match="refused its role"):
        env.step("[answer] x")


# ------------------------------------------------------------------------------------ data and tasks
def test_shipped_data_and_tasks_resolve():
    data = json.loads((DATA_DIR / "all_statements_refined.json").read_text())
    assert 5 <= len(data) <= 8 and all(set(r) == {"id", "claim", "argument"} for r in data)
    train, test = shipped_tasks("train", ["PersuadeGym"]), shipped_tasks("test", ["PersuadeGym"])
    assert train and test and not {t.id for t in train} & {t.id for t in test}
    for t in train + test:
        env = make_env(t, user=ScriptedChatModel([reply("Agree")]))
        obs, info = env.reset()
        assert t.create_kwargs["claim"] in obs["feedback"] and info["initial_stance"] == "Strongly Agree"
        assert t.reward_model["claim"] == t.create_kwargs["claim"] and t.data_source == "interact_persuade"
        assert [m["role"] for m in t.prompt] == ["system", "user"] and env.max_steps == 15


def test_max_turns_create_argument_sets_the_limit():
    [t] = shipped_tasks("test", ["PersuadeGym"])[:1]
    t.create_kwargs["max_turns"] = 3
    assert make_env(t).max_steps == 3 and make_env(t, max_steps=5).max_steps == 5


def _write(tmp_path, records):
    (tmp_path / "all_statements_refined.json").write_text(json.dumps(records))
    return tmp_path


def test_malformed_record_names_file_record_and_field(tmp_path):
    [t] = shipped_tasks("train", ["PersuadeGym"])[:1]
    d = _write(tmp_path, [{"id": t.id, "claim": "c", "argument": "a"}, {"id": "X2", "claim": "c"}])
    with pytest.raises(EnvError, match=r"all_statements_refined\.json, record 1 .*missing field 'argument'"):
        make_env(t, data_dir=d)
    d = _write(tmp_path, [{"id": t.id, "claim": 5, "argument": "a"}])
    with pytest.raises(EnvError, match=r"record 0 .*field 'claim' must be str"):
        make_env(t, data_dir=d)
    d = _write(tmp_path, [{"id": "A", "claim": "c", "argument": "a"}, {"id": "A", "claim": "c", "argument": "a"}])
    with pytest.raises(EnvError, match="duplicate id 'A'"):
        make_env(t, data_dir=d)


def test_unknown_id_is_named(tmp_path):
    [t] = shipped_tasks("train", ["PersuadeGym"])[:1]
    t.create_kwargs["id"] = "NO-SUCH-ID"
    with pytest.raises(EnvError, match=r"all_statements_refined\.json: no statement with id 'NO-SUCH-ID'"):
        make_env(t)


def test_real_format_file_in_a_nested_folder(tmp_path):
    nested = tmp_path / "PersuadeGym" / "persuadegym" / "data"
    nested.mkdir(parents=True)
    _write(nested, [{"id": "GXQ", "claim": "Claim text", "argument": "Because."}])
    row = json.loads((DATA_DIR.parent / "tasks" / "persuade_test.jsonl").read_text().splitlines()[0])
    row["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"]["id"] = "GXQ"
    (tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    [t] = load_tasks(tmp_path / "t.jsonl")
    obs, _ = make_env(t, data_dir=tmp_path).reset()
    assert "Claim text" in obs["feedback"]


# ------------------------------------------------------------------------------------ end to end
def _episode_task(env, task):
    return EpisodeTask(env=env, agent_messages=task.prompt)


def test_episode_through_the_runner(tok):
    [task] = shipped_tasks("train", ["PersuadeGym"])[:1]
    user = ScriptedChatModel([reply("Partly Agree", "You make me think.", "HIDDEN-1"),
                              reply("Partly Agree", "Same.", "HIDDEN-2"),
                              "<<not json>>", reply("Strongly Disagree", "You win.", "HIDDEN-3")], cycle=False)
    env = make_env(task, user=user)
    agent = ScriptedAgent(tok, [tool_call_text("answer", "Argument one."), tool_call_text("answer", "Argument two."),
                                "no tool call here", tool_call_text("answer", "Argument three.")])
    [traj] = run_episodes(agent, None, [_episode_task(env, task)], EpisodeConfig(max_turns=8))
    assert traj.status == "ok" and traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 4
    assert traj.turn_rewards == [expected_reward("Strongly Agree", "Partly Agree"), 0.0, 0.0,
                                 expected_reward("Partly Agree", "Strongly Disagree")]
    assert traj.user_thoughts == ["HIDDEN-1", "HIDDEN-2", None, "HIDDEN-3"]
    assert traj.user_utterances == ["You make me think.", "Same.", None, "You win."]
    assert traj.env_info[0]["feedback"] == "You make me think." and traj.env_info[3]["stance"] == "Strongly Disagree"
    assert "invalid_action" in traj.env_info[2]
    agent_view = tok.decode(agent.prompts[-1])
    assert "You make me think." in agent_view and "HIDDEN" not in agent_view


def test_invalid_episode_through_the_runner(tok):
    [task] = shipped_tasks("test", ["PersuadeGym"])[:1]
    env = make_env(task, user=ScriptedChatModel(["As an AI language model, I cannot pretend to be persuaded."]))
    agent = ScriptedAgent(tok, [tool_call_text("answer", "Consider this.")])
    [traj] = run_episodes(agent, None, [_episode_task(env, task)], EpisodeConfig(max_turns=4))
    assert traj.status == "invalid" and "refused its role" in traj.invalid_reason
    assert traj.meta["end_reason"] == "invalid" and traj.turn_rewards == [0.0]

    env = make_env(task, user=ScriptedChatModel(["garbage", "more garbage"]))
    [traj] = run_episodes(ScriptedAgent(tok, [tool_call_text("answer", "x")]), None,
                          [_episode_task(env, task)], EpisodeConfig(max_turns=4))
    assert traj.status == "invalid" and "did not parse twice" in traj.invalid_reason
