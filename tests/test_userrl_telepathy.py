"""TelepathyGym (envs/userrl/telepathy.py): questions to the user, judged guesses and their reward branches,
INVALID paths, the gym end to end through the episode runner, and the entity loader."""

import json

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import tool_call_text
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.userrl import DATA_DIR, make_env, shipped_tasks
from mimesis_jax.envs.userrl.tasks import Task
from mimesis_jax.envs.userrl.telepathy import TelepathyGym, load_entities
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

ENTITIES = json.loads((DATA_DIR / "all_entities_refined.json").read_text())
REFUSAL = "As an AI language model, I cannot pretend to have something in mind."


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def entity(title):
    return next(e for e in ENTITIES if e["title"] == title)


def verdict(judgment, feedback="ok", fenced=True):
    body = json.dumps({"thought": "compare", "judgment": judgment, "feedback": feedback})
    return f"```json\n{body}\n```" if fenced else body


def task_for(title, **create):
    return Task(gym="TelepathyGym", id=title, prompt=[{"role": "system", "content": "sys"}],
                create_kwargs={"title": title, **create})


def env_for(title, user=("Yes",), judge=("x",), **options):
    env = make_env(task_for(title), user=ScriptedChatModel(list(user)), judge=ScriptedChatModel(list(judge)),
                   **options)
    env.reset()
    return env


# ------------------------------------------------------------------------------------ questions
def test_question_goes_to_the_user_who_sees_the_target():
    user = ScriptedChatModel(["<think>\nAn octopus lives in the sea.\n</think>\n\nYes", "No"])
    env = make_env(task_for("Octopus"), user=user, judge=ScriptedChatModel(["x"]))
    obs, info = env.reset()
    assert "TelepathyGym" in obs["feedback"] and info["category"] == "animal"
    obs, reward, term, trunc, info = env.step("[action] Does it live in water?")
    assert (obs["feedback"], reward, term, trunc) == ("Yes", 0.0, False, False)
    assert info["user_thought"] == "An octopus lives in the sea." and info["user_utterance"] == "Yes"
    system, question = user.calls[0]
    assert entity("Octopus")["target_entity"] in system["content"]
    assert question == {"role": "user", "content": "Does it live in water?"}
    obs, reward, *_ = env.step("[action] Does it fly?")
    assert obs["feedback"] == "No" and reward == 0.0 and len(user.calls[1]) == 2  # stateless
    assert env.clue_history == [("Does it live in water?", "Yes"), ("Does it fly?", "No")]


def test_user_answers_verbatim_or_from_userrl_json_and_search():
    env = env_for("Volcano", user=['{"thought": "lava is hot", "response": "Yes"}', "Maybe", '{"answer": "Yes"}'])
    obs, _, _, _, info = env.step("[action] Is it hot?")
    assert obs["feedback"] == "Yes" and info["user_thought"] == "lava is hot" and info["user_utterance"] == "Yes"
    obs, reward, term, _, _ = env.step("[search] volcano facts")  # answered as a question, as UserRL
    assert (obs["feedback"], reward, term) == ("Maybe", 0.0, False)
    assert env.clue_history == [("Is it hot?", "Yes")]  # a search is not a clue (UserRL)
    with pytest.raises(InvalidEpisode, match="without a 'response'"):
        env.step("[action] Is it alive?")


def test_refusing_user_and_invalid_text():
    env = env_for("Sushi", user=[REFUSAL])
    obs, reward, term, _, info = env.step("no prefix at all")
    assert obs["feedback"] == TelepathyGym.invalid_action_feedback and reward == 0.0 and not term
    with pytest.raises(InvalidEpisode, match="as_an_ai"):
        env.step("[action] Is it food?")


# ------------------------------------------------------------------------------------ guesses
def test_wrong_guess_then_correct_guess():
    judge = ScriptedChatModel([verdict("No", "Not quite, keep going."), verdict("Yes", "You got it!", fenced=False)])
    env = make_env(task_for("Lighthouse"), user=ScriptedChatModel(["Yes"]), judge=judge)
    env.reset()
    obs, reward, term, trunc, info = env.step("[answer] Windmill")
    assert (obs["feedback"], reward, term, trunc) == ("Not quite, keep going.", 0.0, False, False)
    assert info["correct"] is False and info["best_score"] == 0.0
    obs, reward, term, _, info = env.step("[answer] A lighthouse")
    best = 0.0
    expected = max(0.0, 1.0 - best)  # rule: score 1.0 for a correct guess, minus the best so far
    assert (obs["feedback"], reward, term) == ("You got it!", expected, True) and info["best_score"] == 1.0
    target = entity("Lighthouse")["target_entity"]
    assert target in judge.calls[0][1]["content"] and "Windmill" in judge.calls[0][1]["content"]
    assert env.clue_history[-1] == ("A lighthouse", "You got it!")


def test_judgment_spelling_empty_feedback_and_shaping():
    env = env_for("Saxophone", judge=[verdict(" yes. ", "")])
    obs, reward, term, *_ = env.step("[answer] saxophone")
    assert reward == 1.0 and term and obs["feedback"]  # empty judge feedback -> a fixed text
    env = env_for("Saxophone", judge=[verdict("No"), verdict("YES!")], reward_scale=0.5, step_penalty=0.1)
    _, r1, *_ = env.step("[action] Is it brass?")
    _, r2, *_ = env.step("[answer] trumpet")
    _, r3, term, *_ = env.step("[answer] sax")
    assert r1 == max(0.0, 0.0 * 0.5 - 0.1 * 1) == 0.0 and r2 == 0.0
    assert r3 == pytest.approx(max(0.0, min(1.0, 1.0 * 0.5 - 0.1 * 3))) and term
    env = env_for("Saxophone", judge=[verdict("No")], step_penalty=0.25, normalize_rewards=False)
    _, r1, *_ = env.step("[action] q")
    _, r2, *_ = env.step("[answer] clarinet")
    assert (r1, r2) == (pytest.approx(-0.25), pytest.approx(-0.5))


def test_unparseable_judge_is_retried_once_then_invalid():
    for bad in ["It is correct", verdict("Probably"), json.dumps({"judgment": "Yes"})]:
        judge = ScriptedChatModel([bad, verdict("Yes")])
        env = make_env(task_for("Marie Curie"), user=ScriptedChatModel(["Yes"]), judge=judge)
        env.reset()
        _, reward, term, *_ = env.step("[answer] Marie Curie")
        assert reward == 1.0 and term and len(judge.calls) == 2 and judge.calls[0] == judge.calls[1]
    env = env_for("Marie Curie", judge=["nope", "nope again"])
    with pytest.raises(InvalidEpisode, match="did not parse twice"):
        env.step("[answer] Ada Lovelace")


def test_turn_limit_truncates():
    env = env_for("Octopus", user=["No"], judge=[verdict("No")], max_steps=2)
    assert env.step("[action] a")[3] is False
    _, reward, term, trunc, _ = env.step("[answer] squid")
    assert trunc and not term and reward == 0.0 and env.done
    assert make_env(task_for("Octopus", max_turns=15)).max_steps == 15
    assert make_env(task_for("Octopus")).max_steps == TelepathyGym.default_max_steps == 15


# ------------------------------------------------------------------------------------ end to end
def test_episode_through_the_runner(tok):
    task = next(t for t in shipped_tasks("test", ["TelepathyGym"]) if t.id == "Sherlock Holmes")
    thought = "Holmes is fictional, so no."
    user = ScriptedChatModel([f"<think>\n{thought}\n</think>\n\nNo"])
    judge = ScriptedChatModel([verdict("No", "Not this one."), verdict("Yes", "Correct!")])
    env = make_env(task, user=user, judge=judge)
    agent = ScriptedAgent(tok, [tool_call_text("action", "Is it a real person?"),
                                tool_call_text("answer", "Hercule Poirot"),
                                tool_call_text("answer", "Sherlock Holmes")])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)],
                          EpisodeConfig(max_turns=16), tokenizer=tok)
    assert traj.status == "ok" and traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 3
    assert traj.turn_rewards == [0.0, 0.0, 1.0]
    assert traj.user_utterances == ["No", None, None] and traj.user_thoughts == [thought, None, None]
    assert [i["feedback"] for i in traj.env_info] == ["No", "Not this one.", "Correct!"]
    seen = tok.decode(agent.prompts[2])
    assert "Not this one.\nReward: 0.0" in seen and thought not in seen


def test_invalid_episode_through_the_runner(tok):
    task = shipped_tasks("test", ["TelepathyGym"])[0]
    env = make_env(task, user=ScriptedChatModel([REFUSAL]), judge=ScriptedChatModel(["x"]))
    agent = ScriptedAgent(tok, [tool_call_text("action", "Is it an animal?")])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)], tokenizer=tok)
    assert traj.status == "invalid" and "as_an_ai" in traj.invalid_reason
    env = make_env(task, user=ScriptedChatModel(["Yes"]), judge=ScriptedChatModel(["??"]))
    agent = ScriptedAgent(tok, [tool_call_text("answer", "Octopus")])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)], tokenizer=tok)
    assert traj.status == "invalid" and "did not parse twice" in traj.invalid_reason


# ------------------------------------------------------------------------------------ loader
def test_shipped_data_and_tasks_load():
    entities = load_entities(DATA_DIR / "all_entities_refined.json")
    assert len(entities) == len(ENTITIES) == 8
    tasks = shipped_tasks("test", ["TelepathyGym"])
    assert len(tasks) == 8 and not shipped_tasks("train", ["TelepathyGym"])
    for t in tasks:
        env = make_env(t)
        assert env.entity["title"] == t.id and env.entity["category"] == t.create_kwargs["category"]
        assert t.reward_model["ground_truth"] == env.entity["target_entity"]
        assert t.data_source == "interact_telepathygym"
        assert t.prompt[1]["content"].startswith(env.entity["description"])
    assert make_env(task_for("entity_003")).entity["title"] == "Marie Curie"  # by id, as UserRL
    assert make_env(task_for("RUBIK'S CUBE")).entity["id"] == "entity_004"


def test_malformed_record_duplicate_id_and_unknown_title(tmp_path):
    data = json.loads(json.dumps(ENTITIES))
    del data[2]["target_entity"]
    (tmp_path / "all_entities_refined.json").write_text(json.dumps(data))
    with pytest.raises(EnvError, match=r"all_entities_refined\.json, record 2: missing field 'target_entity'"):
        make_env(task_for("Octopus"), data_dir=tmp_path)
    dup = tmp_path / "dup"
    dup.mkdir()
    data = json.loads(json.dumps(ENTITIES))
    data[5]["id"] = data[0]["id"]
    (dup / "all_entities_refined.json").write_text(json.dumps(data))
    with pytest.raises(EnvError, match="record 5: duplicate id 'entity_001'"):
        make_env(task_for("Octopus"), data_dir=dup)
    with pytest.raises(EnvError, match="no entity with title or id 'Unicorn'"):
        make_env(task_for("Unicorn"))
