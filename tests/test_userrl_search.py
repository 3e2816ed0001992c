"""SearchGym: every reward branch on scripted steps, INVALID judge paths, an end-to-end episode through
run_episodes, and the data/task loaders."""

import json

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import tool_call_text
from mimesis_jax.envs import userrl
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.userrl import search as sg
from mimesis_jax.envs.userrl.common import DATA_DIR
from mimesis_jax.envs.userrl.retriever import Passage, RetrieverError
from mimesis_jax.chat.base import ChatModel, ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

# the rule (docs/reference/environments.md / UserRL SearchGym): correct answer 1.0 and the episode ends, anything else 0.0
CORRECT, WRONG, NOTHING = 1.0, 0.0, 0.0
MAX_SEARCHES, TOP_K = 5, 5
QUESTIONS = {q["id"]: q for q in json.loads((DATA_DIR / "questions.json").read_text(encoding="utf-8"))}
REFUSAL = "As an AI language model, I cannot pretend to grade answers."


def verdict(judgment, feedback="ok"):
    return json.dumps({"reasoning": "compared", "judgment": judgment, "feedback": feedback})


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


@pytest.fixture(scope="module")
def tasks():
    return userrl.shipped_tasks("test", gyms=["SearchGym"])


def task_of(tasks, qid):
    return next(t for t in tasks if t.id == qid)


class CountingRetriever:
    def __init__(self, n=7, fail=False):
        self.n, self.fail, self.calls = n, fail, []

    def search(self, query, k=5):
        self.calls.append((query, k))
        if self.fail:
            raise RetrieverError("search service http://x: failed after 4 attempts; last error: HTTP 503")
        return [Passage(f"p{i}", f"Title {i}", f"text {i} about {query}", 10.0 - i) for i in range(self.n)]


def make(tasks, qid="Corvane-1", judge=None, **kw):
    judge = ScriptedChatModel([verdict("No")]) if judge is None else judge
    env = userrl.make_env(task_of(tasks, qid), judge=judge, **kw)
    env.reset()
    return env, judge


# ------------------------------------------------------------------------------------ search branches
def test_search_returns_top5_from_the_shipped_corpus(tasks):
    env, judge = make(tasks, "Corvane-6")
    obs, r, term, trunc, info = env.step("[search] Orrin Bridge city")
    fb = obs["feedback"]
    assert (r, term, trunc) == (NOTHING, False, False)
    assert "Orrin Bridge" in fb.splitlines()[1]  # best hit first: "1. <title>"
    assert fb.count("- Snippet: ") == len(info["results"]) <= TOP_K
    assert "orrin-bridge" in info["results"] and info["search_count"] == 1
    obs, r, *_ = env.step("[search] tallest building Palsgrove")
    assert "312 metres" in obs["feedback"] and r == NOTHING
    assert judge.calls == []


def test_only_top_k_results_are_shown(tasks):
    ret = CountingRetriever(n=9)
    env, _ = make(tasks, retriever=ret)
    obs, *_ = env.step("[search] anything")
    assert ret.calls == [("anything", TOP_K)]
    assert [line for line in obs["feedback"].splitlines() if line[:1].isdigit()] == [
        f"{i + 1}. Title {i}" for i in range(TOP_K)]
    env, _ = make(tasks, retriever=CountingRetriever(n=9), max_search_results=2)
    assert env.step("[search] x")[0]["feedback"].count("- Snippet:") == 2


def test_search_limit_empty_queries_count_and_later_searches_do_not_run(tasks):
    ret = CountingRetriever()
    env, _ = make(tasks, retriever=ret)
    obs, r, term, *_ = env.step("[search]   ")  # empty: answered, but it uses one of the searches
    assert obs["feedback"] == sg.SEARCH_EMPTY and (r, term) == (NOTHING, False) and ret.calls == []
    for i in range(MAX_SEARCHES - 1):
        obs, r, term, *_ = env.step(f"[search] q{i}")
        assert (r, term) == (NOTHING, False)
    assert len(ret.calls) == MAX_SEARCHES - 1
    for _ in range(2):
        obs, r, term, trunc, info = env.step("[search] one more")
        assert (r, term, trunc) == (NOTHING, False, False) and info["search_limit"]
        assert obs["feedback"] == sg.SEARCH_LIMIT.format(limit=MAX_SEARCHES)
    assert len(ret.calls) == MAX_SEARCHES - 1  # never called past the limit
    obs, r, term, *_ = env.step("[answer] Halvard Oune")  # answering still works
    assert (r, term) == (CORRECT, True)


def test_no_hits_and_backend_failure(tasks):
    env, _ = make(tasks)
    obs, r, term, _, info = env.step("[search] xylophonequark")
    assert "no results" in obs["feedback"] and info["results"] == [] and r == NOTHING
    env, _ = make(tasks, retriever=CountingRetriever(fail=True))
    obs, r, term, trunc, info = env.step("[search] x")
    assert obs["feedback"].startswith(sg.SEARCH_FAILED.format(error="")) and (r, term, trunc) == (NOTHING, False, False)
    assert "HTTP 503" in info["search_error"]


# ------------------------------------------------------------------------------------ answer branches
@pytest.mark.parametrize("answer", ["Halvard Oune", "halvard oune!", "  HALVARD-OUNE "])
def test_normalised_match_is_correct_without_the_judge(tasks, answer):
    env, judge = make(tasks, "Corvane-1")
    obs, r, term, trunc, info = env.step(f"[answer] {answer}")
    assert (r, term, trunc) == (CORRECT, True, False)
    assert obs["feedback"] == sg.ANSWER_CORRECT.format(answer=answer.strip())
    assert judge.calls == [] and info["judged_by"] == "match"
    with pytest.raises(EnvError, match="ended"):
        env.step("[answer] again")


def test_judge_yes_is_correct_and_sees_question_answer_reference(tasks):
    env, judge = make(tasks, "Corvane-2", judge=ScriptedChatModel([verdict("Yes", "You got it.")]))
    obs, r, term, _, info = env.step("[answer] the Ashe")
    assert (r, term) == (CORRECT, True) and info["judged_by"] == "judge"
    (call,) = judge.calls
    assert call[0]["role"] == "system" and "JSON" in call[0]["content"]
    user = call[1]["content"]
    assert QUESTIONS["Corvane-2"]["question"] in user and "the Ashe" in user and "River Ashe" in user
    assert "You got it." not in obs["feedback"]  # the judge's feedback is not shown (as UserRL)


def test_judge_no_is_wrong_the_episode_goes_on_and_can_still_be_won(tasks):
    env, judge = make(tasks, "Corvane-3", judge=ScriptedChatModel([verdict("No", "Wrong year.")]))
    obs, r, term, trunc, info = env.step("[answer] 1820")
    assert (r, term, trunc) == (WRONG, False, False) and obs["feedback"] == sg.ANSWER_WRONG.format(answer="1820")
    assert "1794" not in obs["feedback"] and info["judge"]["correct"] is False
    obs, r, term, *_ = env.step("[answer] 1794")
    assert (r, term) == (CORRECT, True) and len(judge.calls) == 1


def test_empty_answer_action_choice_and_missing_prefix(tasks):
    env, judge = make(tasks)
    obs, r, term, *_ = env.step("[answer]   ")
    assert obs["feedback"] == sg.ANSWER_EMPTY and (r, term) == (NOTHING, False)
    for text in ("[action] Can you give me a hint?", "Halvard Oune", "[finish]"):
        obs, r, term, _, info = env.step(text)
        assert obs["feedback"].startswith("Invalid action") and (r, term) == (NOTHING, False)
        assert "invalid_action" in info
    obs, r, term, _, info = env.invalid_action("no <tool_call> found in the reply")
    assert obs["feedback"].startswith("Invalid action") and r == NOTHING
    assert judge.calls == []


def test_rule_eval_method_and_judge_requirement(tasks):
    env = userrl.make_env(task_of(tasks, "Corvane-4"), eval_method="rule")
    env.reset()
    assert env.step("[answer] the city of Hervik")[1:3] == (WRONG, False)
    assert env.step("[answer] hervik")[1:3] == (CORRECT, True)
    with pytest.raises(EnvError, match="needs a judge"):
        userrl.make_env(task_of(tasks, "Corvane-4"))
    with pytest.raises(EnvError, match="eval_method"):
        userrl.make_env(task_of(tasks, "Corvane-4"), eval_method="fuzzy")


def test_truncation_at_max_steps_and_max_turns_create_argument(tasks):
    env, _ = make(tasks, max_steps=3)
    assert env.step("[search] a")[2:4] == (False, False)
    assert env.step("[answer] wrong")[2:4] == (False, False)
    obs, r, term, trunc, _ = env.step("[search] b")
    assert (term, trunc) == (False, True)
    t = task_of(tasks, "Corvane-1")
    t2 = userrl.Task(**{**t.__dict__, "create_kwargs": {**t.create_kwargs, "max_turns": 2}})
    assert userrl.make_env(t2, eval_method="rule").max_steps == 2
    assert userrl.make_env(t, eval_method="rule").max_steps == 15


# ------------------------------------------------------------------------------------ INVALID
def test_refusing_or_unparseable_judge_twice_is_invalid(tasks):
    for replies in ([REFUSAL], ['{"judgment": "Maybe"}'], ["Yes"]):
        env, judge = make(tasks, judge=ScriptedChatModel(replies))
        with pytest.raises(InvalidEpisode, match="judge's answer did not parse twice"):
            env.step("[answer] somebody")
        assert len(judge.calls) == 2


def test_unparseable_once_then_good_is_retried(tasks):
    env, judge = make(tasks, judge=ScriptedChatModel(["I think so.", "```json\n" + verdict("yes") + "\n```"]))
    obs, r, term, *_ = env.step("[answer] H. Oune")
    assert (r, term) == (CORRECT, True) and len(judge.calls) == 2
    assert judge.calls[0] == judge.calls[1]  # the same prompt again


def test_failing_judge_is_invalid(tasks):
    class Broken(ChatModel):
        def chat(self, messages, **kw):
            raise ConnectionError("endpoint down")

    env, _ = make(tasks, judge=Broken())
    with pytest.raises(InvalidEpisode, match="judge model call failed"):
        env.step("[answer] somebody")


# ------------------------------------------------------------------------------------ end to end
def test_episode_through_run_episodes(tok, tasks):
    task = task_of(tasks, "Corvane-7")
    judge = ScriptedChatModel([verdict("No")])
    env = userrl.make_env(task, judge=judge)
    replies = [tool_call_text("search", "Teodor Vain novelist married"),
               tool_call_text("search", "Lisbet Orme instrument"),
               tool_call_text("answer", "violin"),
               "<think>The cello, then.</think>\n" + tool_call_text("answer", "Cello")]
    agent = ScriptedAgent(tok, replies)
    (traj,) = run_episodes(agent, None, [EpisodeTask(env, task.prompt)], EpisodeConfig(max_turns=16))
    assert traj.status != "invalid"
    assert traj.turn_rewards == [NOTHING, NOTHING, WRONG, CORRECT]
    assert traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 4
    assert "lisbet-orme" in traj.env_info[0]["results"] and "lisbet-orme" in traj.env_info[1]["results"]
    assert [e["choice"] for e in traj.env_info] == ["search", "search", "answer", "answer"]
    assert traj.env_info[2]["judged_by"] == "judge" and traj.env_info[3]["judged_by"] == "match"
    # SearchGym has no user simulator: every turn records "no user turn" from the env
    assert traj.user_utterances == [None] * 4 and traj.user_thoughts == [None] * 4
    assert len(judge.calls) == 1
    text = tok.decode([t for s in traj.segments for t in s.tokens])
    assert "Lisbet Orme" in text and "Reward: 1.0" in text


def test_invalid_episode_through_run_episodes(tok, tasks):
    task = task_of(tasks, "Corvane-8")
    env = userrl.make_env(task, judge=ScriptedChatModel([REFUSAL]))
    agent = ScriptedAgent(tok, [tool_call_text("search", "Sorrel Archipelago"), tool_call_text("answer", "Kestrel")])
    (traj,) = run_episodes(agent, None, [EpisodeTask(env, task.prompt)])
    assert traj.status == "invalid" and "judge" in traj.invalid_reason and "agent turn 1" in traj.invalid_reason
    assert traj.turn_rewards == [NOTHING, NOTHING]


# ------------------------------------------------------------------------------------ loaders
def test_shipped_tasks_resolve_to_records(tasks):
    assert 8 <= len(tasks) <= 12 and len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.data_source == "interact_searchgym" and t.split == "test" and t.ability == "interaction"
        assert t.reward_model["ground_truth"] == QUESTIONS[t.id]["answer"] and t.reward_model["style"] == "rule"
        assert [m["role"] for m in t.prompt] == ["system", "user"]
        assert t.prompt[1]["content"].startswith(QUESTIONS[t.id]["question"])
        assert t.to_row()["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"] == {
            "env_name": "SearchGym", "id": t.id}
        env = userrl.make_env(t, eval_method="rule")
        assert env.reset()[1]["question_id"] == t.id
    assert userrl.shipped_tasks("train", gyms=["SearchGym"]) == []  # eval-only gym


def _data_dir(tmp_path, records, corpus=True):
    (tmp_path / "questions.json").write_text(json.dumps(records), encoding="utf-8")
    if corpus:
        (tmp_path / "search_corpus.jsonl").write_text(
            json.dumps({"id": "x1", "title": "Quill", "text": "The quill was invented by Ada Penn."}) + "\n")
    return tmp_path


def test_real_format_without_evidence_and_own_corpus(tmp_path, tasks):
    d = _data_dir(tmp_path, [{"id": "Corvane-1", "question": "Who invented the quill?", "answer": "Ada Penn"}])
    env = userrl.make_env(task_of(tasks, "Corvane-1"), data_dir=d, eval_method="rule")
    env.reset()
    assert env.step("[search] quill")[4]["results"] == ["x1"]


@pytest.mark.parametrize("record, message", [
    ({"id": "Corvane-1", "question": "Q?"}, "missing field 'answer'"),
    ({"id": "Corvane-1", "question": 5, "answer": "a"}, "field 'question' must be str"),
    ({"id": "Corvane-1", "question": "  ", "answer": "a"}, "field 'question' is empty"),
    ({"id": "Corvane-1", "question": "Q?", "answer": "a", "evidence": [3]}, "field 'evidence'"),
    ({"question": "Q?", "answer": "a"}, "missing field 'id'"),
])
def test_malformed_record_names_file_and_field(tmp_path, tasks, record, message):
    d = _data_dir(tmp_path, [record])
    with pytest.raises(EnvError, match=message) as e:
        userrl.make_env(task_of(tasks, "Corvane-1"), data_dir=d, eval_method="rule")
    assert "questions.json, record 0" in str(e.value)


def test_unknown_id_and_missing_corpus(tmp_path, tasks):
    t = task_of(tasks, "Corvane-1")
    bad = userrl.Task(**{**t.__dict__, "id": "Corvane-999", "create_kwargs": {"id": "Corvane-999"}})
    with pytest.raises(EnvError, match="questions.json: no question with id 'Corvane-999'"):
        userrl.make_env(bad, eval_method="rule")
    d = _data_dir(tmp_path, [{"id": "Corvane-1", "question": "Q?", "answer": "a"}], corpus=False)
    with pytest.raises(EnvError, match="search_corpus.jsonl.*retriever="):
        userrl.make_env(t, data_dir=d, eval_method="rule")
    env = userrl.make_env(t, data_dir=d, eval_method="rule", retriever=CountingRetriever())
    env.reset()
    assert env.step("[search] q")[4]["results"][0] == "p0"
    with pytest.raises(EnvError, match="search\\(query, k\\)"):
        userrl.make_env(t, eval_method="rule", retriever=object())
