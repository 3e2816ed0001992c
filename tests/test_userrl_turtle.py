"""TurtleGym (envs/userrl/turtle.py): host questions, rubric-judged answers and their reward branches, INVALID
paths, the gym end to end through the episode runner, and the story loader."""

import json

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import tool_call_text
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.userrl import DATA_DIR, make_env, shipped_tasks, turtle
from mimesis_jax.envs.userrl.tasks import Task
from mimesis_jax.envs.userrl.turtle import TurtleGym, load_stories
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

STORIES = json.loads((DATA_DIR / "all_stories_refined.json").read_text())
REFUSAL = "As an AI language model, I cannot pretend to be a riddle host."


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def raw(title):
    return next(s for s in STORIES.values() if s["new_title"] == title)


def weights(title):
    return [c["score"] for c in raw(title)["evaluation"]]


def rubric_score(title, judgments):
    """The rule: sum of weight * judgment over the rubric, in order, from 0.0 (not normalised)."""
    total = 0.0
    for w, j in zip(weights(title), judgments):
        total += w * j
    return total


def judge_reply(judgments, fenced=True):
    body = json.dumps({"scores": [{"statement": f"point {i}", "thought": "ok", "score": j}
                                  for i, j in enumerate(judgments)], "feedback": "Nice."})
    return f"```json\n{body}\n```" if fenced else body


def task_for(title, **create):
    return Task(gym="TurtleGym", id=title, prompt=[{"role": "system", "content": "sys"}],
                create_kwargs={"title": title, **create})


def env_for(title, user=("Yes",), judge=(), **options):
    env = make_env(task_for(title), user=ScriptedChatModel(list(user)), judge=ScriptedChatModel(list(judge) or ["x"]),
                   **options)
    env.reset()
    return env


# ------------------------------------------------------------------------------------ questions
def test_question_goes_to_the_host_and_its_answer_is_the_feedback():
    user = ScriptedChatModel(["<think>\nThe audience is deaf, so yes.\n</think>\n\nYes", "No"])
    env = make_env(task_for("The Silent Applause"), user=user, judge=ScriptedChatModel(["x"]))
    obs, info = env.reset()
    assert "TurtleGym" in obs["feedback"] and info["total_criteria"] == 3
    obs, reward, term, trunc, info = env.step("[action] Was the audience deaf?")
    assert (obs["feedback"], reward, term, trunc) == ("Yes", 0.0, False, False)
    assert info["user_thought"] == "The audience is deaf, so yes." and info["user_utterance"] == "Yes"
    assert info["to_user"] is None and info["step"] == 1
    system, question = user.calls[0]
    story = raw("The Silent Applause")
    assert system["role"] == "system" and story["new_surface"] in system["content"]
    assert story["new_bottom"] in system["content"]
    assert question == {"role": "user", "content": "Was the audience deaf?"}
    assert "0.5" not in system["content"]  # the rubric weights never reach the host
    obs, reward, *_ = env.step("[action] Was it raining?")
    assert obs["feedback"] == "No" and reward == 0.0
    assert len(user.calls[1]) == 2  # stateless: every question is a fresh call, as UserRL


def test_host_answers_are_forwarded_verbatim_or_from_userrl_json():
    env = env_for("The Cold Soup", user=['```json\n{"thought": "teeth pulled", "response": "Yes"}\n```',
                                         "Maybe, it does not matter.", '{"thought": "hmm"}'])
    obs, reward, _, _, info = env.step("[action] Did he have dental surgery?")
    assert obs["feedback"] == "Yes" and info["user_utterance"] == "Yes" and info["user_thought"] == "teeth pulled"
    obs, *_ = env.step("[action] Was the soup gazpacho?")
    assert obs["feedback"] == "Maybe, it does not matter."  # UserRL does not constrain the host's text
    with pytest.raises(InvalidEpisode, match="without a 'response'"):
        env.step("[action] Was the chef his brother?")


def test_search_is_answered_as_a_question_and_bad_text_is_invalid():
    user = ScriptedChatModel(["No"])
    env = make_env(task_for("The Black Window"), user=user, judge=ScriptedChatModel(["x"]))
    env.reset()
    obs, reward, term, _, _ = env.step("[search] Did he hate the sun?")
    assert (obs["feedback"], reward, term) == ("No", 0.0, False)
    assert user.calls[0][-1]["content"] == "Did he hate the sun?"
    obs, reward, term, _, info = env.step("just text, no prefix")
    assert obs["feedback"] == TurtleGym.invalid_action_feedback and reward == 0.0 and not term
    assert "invalid_action" in info and len(user.calls) == 1


def test_refusing_host_is_invalid():
    env = env_for("The Closed Cage", user=[REFUSAL])
    with pytest.raises(InvalidEpisode, match="as_an_ai"):
        env.step("[action] Did her husband close it?")


# ------------------------------------------------------------------------------------ answers
def test_answer_rewards_are_improvements_over_the_best_score():
    title = "The Wrong Umbrella"  # weights 0.4, 0.2, 0.3, 0.1
    plan = [[1, 0, 0.5, 0], [0, 0, 0, 0], [1, 1, 0.5, 1], [1, 1, 1, 1]]
    judge = ScriptedChatModel([judge_reply(p, fenced=(i % 2 == 0)) for i, p in enumerate(plan)])
    env = make_env(task_for(title), user=ScriptedChatModel(["Yes"]), judge=judge)
    env.reset()
    statements = [c["statement"] for c in raw(title)["evaluation"]]
    best, rewards = 0.0, []
    for i, judgments in enumerate(plan):
        obs, reward, term, trunc, info = env.step(f"[answer] story {i}")
        score = rubric_score(title, judgments)
        expected = max(0.0, score - best)
        best = max(best, score)
        rewards.append(reward)
        assert reward == expected and info["score"] == score and info["best_score"] == best
        covered = [s for s, j in zip(statements, judgments) if j == 1]
        assert info["covered"] == covered
        for s in statements:
            assert (s in obs["feedback"]) == (s in covered)
        lines = [turtle.COVERED_HEADER, *(f"- {s}" for s in covered), turtle.COVERED_FOOTER]
        assert obs["feedback"] == ("\n".join(lines) if covered else turtle.NONE_COVERED)
        assert term == (i == 3) and not trunc
    assert rewards == pytest.approx([0.55, 0.0, 0.3, 0.15])
    # the judge saw the story, the bottom and the numbered statements, never the weights
    msgs = judge.calls[0]
    assert "story 0" in msgs[1]["content"] and raw(title)["new_bottom"] in msgs[1]["content"]
    assert all(f"{k}. {s}" in msgs[1]["content"] for k, s in enumerate(statements, 1))
    assert "0.4" not in msgs[1]["content"] and "0.3" not in msgs[1]["content"]


def test_no_covered_statement_feedback_and_partial_scores():
    env = env_for("The Black Window", judge=[judge_reply([0.5, 0.5, 0])])
    obs, reward, term, _, info = env.step("[answer] He wanted privacy.")
    assert obs["feedback"] == turtle.NONE_COVERED and info["covered"] == []
    assert reward == rubric_score("The Black Window", [0.5, 0.5, 0]) == pytest.approx(0.4) and not term


def test_termination_threshold_and_float_tolerance():
    title = "The Quiet Night"  # weights 0.5, 0.2, 0.2, 0.1: the in-order float sum is 0.9999999999999999
    perfect = rubric_score(title, [1, 1, 1, 1])
    assert perfect < 1.0
    env = env_for(title, judge=[judge_reply([1, 1, 1, 1])])
    _, reward, term, _, _ = env.step("[answer] full story")
    assert reward == perfect and term  # default tolerance 1e-9: a perfect answer ends the episode
    exact = env_for(title, judge=[judge_reply([1, 1, 1, 1])], threshold_tolerance=0.0)
    _, reward, term, trunc, _ = exact.step("[answer] full story")
    assert reward == perfect and not term and not trunc  # UserRL's exact comparison
    # UserRL's gym-config default threshold 0.9 as an option
    low = env_for("The Silent Applause", judge=[judge_reply([1, 1, 0.5])], success_threshold=0.9)
    _, reward, term, _, _ = low.step("[answer] mostly right")
    assert reward == rubric_score("The Silent Applause", [1, 1, 0.5]) == pytest.approx(0.9) and term


def test_step_penalty_scale_and_normalisation():
    title = "The Silent Applause"  # weights 0.5, 0.3, 0.2
    env = env_for(title, judge=[judge_reply([0, 1, 0]), judge_reply([1, 1, 1])], reward_scale=2.0, step_penalty=0.1)
    _, r1, *_ = env.step("[action] q")
    _, r2, *_ = env.step("[answer] a")
    _, r3, term, *_ = env.step("[answer] b")
    s1, s2 = rubric_score(title, [0, 1, 0]), rubric_score(title, [1, 1, 1])
    assert r1 == max(0.0, min(1.0, 0.0 * 2.0 - 0.1 * 1)) == 0.0
    assert r2 == max(0.0, min(1.0, s1 * 2.0 - 0.1 * 2)) == pytest.approx(0.4)
    assert r3 == max(0.0, min(1.0, (s2 - s1) * 2.0 - 0.1 * 3)) == 1.0 and term  # clipped at 1
    raw_env = env_for(title, judge=[judge_reply([0, 1, 0])], step_penalty=0.1, normalize_rewards=False)
    _, r1, *_ = raw_env.step("[action] q")
    _, r2, *_ = raw_env.step("[answer] a")
    assert r1 == pytest.approx(-0.1) and r2 == pytest.approx(s1 - 0.2)
    with pytest.raises(EnvError, match="reward_scale"):
        env_for(title, reward_scale=0)
    with pytest.raises(EnvError, match="bad option"):
        env_for(title, no_such_option=1)


def test_turn_limit_truncates():
    env = env_for("The Cold Soup", user=["No"], max_steps=2)
    assert env.step("[action] a")[3] is False
    _, _, term, trunc, _ = env.step("[action] b")
    assert trunc and not term and env.done
    assert make_env(task_for("The Cold Soup", max_turns=7)).max_steps == 7
    assert make_env(task_for("The Cold Soup")).max_steps == TurtleGym.default_max_steps == 15


# ------------------------------------------------------------------------------------ judge failures
def test_unparseable_judge_is_retried_once_then_invalid():
    title = "First Candles"
    good = judge_reply([1, 0, 1, 0])
    for bad in ["I think it is mostly right.", judge_reply([1, 0, 1]), judge_reply([1, 0, 0.7, 0])]:
        judge = ScriptedChatModel([bad, good])
        env = make_env(task_for(title), user=ScriptedChatModel(["Yes"]), judge=judge)
        env.reset()
        _, reward, *_ = env.step("[answer] He had a transplant.")
        assert reward == rubric_score(title, [1, 0, 1, 0]) and len(judge.calls) == 2
        assert judge.calls[0] == judge.calls[1]
    env = env_for(title, judge=["no json here", "still none"])
    with pytest.raises(InvalidEpisode, match="did not parse twice"):
        env.step("[answer] a story")


# ------------------------------------------------------------------------------------ end to end
def test_episode_through_the_runner(tok):
    task = shipped_tasks("train", ["TurtleGym"])[0]
    assert task.id == "The Silent Applause" and task.prompt[-1]["role"] == "user"
    thought = "The hall is a school for deaf children."
    user = ScriptedChatModel([f"<think>\n{thought}\n</think>\n\nYes"])
    judge = ScriptedChatModel([judge_reply([1, 0, 0]), judge_reply([1, 1, 1])])
    env = make_env(task, user=user, judge=judge)
    replies = [tool_call_text("action", "Was the audience deaf?"),
               tool_call_text("answer", "The audience was deaf."),
               tool_call_text("answer", "Deaf audience, waved hands, her deaf brother taught her.")]
    agent = ScriptedAgent(tok, replies)
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)],
                          EpisodeConfig(max_turns=16), tokenizer=tok)
    assert traj.status == "ok" and traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 3
    s1 = rubric_score(task.id, [1, 0, 0])
    assert traj.turn_rewards == [0.0, s1, rubric_score(task.id, [1, 1, 1]) - s1] == pytest.approx([0.0, 0.5, 0.5])
    assert traj.user_utterances == ["Yes", None, None] and traj.user_thoughts == [thought, None, None]
    assert [i["feedback"] for i in traj.env_info][0] == "Yes"
    seen = tok.decode(agent.prompts[1])
    assert "Yes\nReward: 0.0" in seen and thought not in seen


def test_invalid_episode_through_the_runner(tok):
    task = shipped_tasks("test", ["TurtleGym"])[0]
    env = make_env(task, user=ScriptedChatModel(["Yes"]), judge=ScriptedChatModel(["??", "!!"]))
    agent = ScriptedAgent(tok, [tool_call_text("answer", "A guess.")])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)], tokenizer=tok)
    assert traj.status == "invalid" and "did not parse twice" in traj.invalid_reason
    env = make_env(task, user=ScriptedChatModel([REFUSAL]), judge=ScriptedChatModel(["x"]))
    agent = ScriptedAgent(tok, [tool_call_text("action", "Was she his mother?")])
    [traj] = run_episodes(agent, None, [EpisodeTask(env=env, agent_messages=task.prompt)], tokenizer=tok)
    assert traj.status == "invalid" and "as_an_ai" in traj.invalid_reason


# ------------------------------------------------------------------------------------ loader
def test_shipped_data_and_tasks_load():
    stories = load_stories(DATA_DIR / "all_stories_refined.json")
    assert len(stories) == len(STORIES) == 8
    assert {s["title"] for s in stories} == {s["new_title"] for s in STORIES.values()}
    train, test = shipped_tasks("train", ["TurtleGym"]), shipped_tasks("test", ["TurtleGym"])
    assert len(train) == 5 and len(test) == 3 and not {t.id for t in train} & {t.id for t in test}
    for t in train + test:
        env = make_env(t)
        assert env.story["surface"] == t.create_kwargs["surface"] == t.reward_model["surface"]
        assert t.data_source == "interact_turtlegym" and t.reward_model["ground_truth"] == env.story["bottom"]
        assert t.prompt[1]["content"].startswith(f"Title: {t.id}\nSurface: ")
    assert make_env(task_for("the silent applause")).story["title"] == "The Silent Applause"  # case-insensitive


def test_malformed_record_and_unknown_title(tmp_path):
    data = json.loads(json.dumps(STORIES))
    data["8"]["judgment"] = "No"  # skipped, as UserRL
    del data["14"]["evaluation"][1]["score"]
    path = tmp_path / "all_stories_refined.json"
    path.write_text(json.dumps(data))
    with pytest.raises(EnvError, match=r"all_stories_refined\.json, story '14'.*evaluation\[1\].*'score'"):
        make_env(task_for("The Silent Applause"), data_dir=tmp_path)
    del data["14"]
    path.write_text(json.dumps(data))
    assert make_env(task_for("The Silent Applause"), data_dir=tmp_path).story["title"] == "The Silent Applause"
    with pytest.raises(EnvError, match="no story titled 'The Closed Cage'"):
        make_env(task_for("The Closed Cage"), data_dir=tmp_path)
    with pytest.raises(EnvError, match="'The Missing Story'"):
        make_env(task_for("The Missing Story"))
    other = tmp_path / "sub"
    other.mkdir()
    (other / "all_stories_refined.json").write_text(json.dumps([1, 2]))
    with pytest.raises(EnvError, match="story ids"):
        make_env(task_for("x"), data_dir=other)
