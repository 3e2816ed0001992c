"""What the eight gyms share: task files in UserRL's verl schema (parquet written here, JSONL), named errors, the
gym registry, UserRL's scores (max for training, sum / Travel per aspect for evaluation, invalid apart), the task
mixture (proportions, zero weights, exact resume, prompt-length filter), and the runner's handling of envs that talk
to their own user / judge (thoughts recorded, refusals INVALID, concurrent env steps)."""

import re
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import Env, EnvError, InvalidEpisode, tool_call_text
from mimesis_jax.envs.userrl import mixture, scoring
from mimesis_jax.envs.model_io import fill, parse_json_object
from mimesis_jax.envs.userrl.common import UserRLEnv
from mimesis_jax.envs.userrl.tasks import GYM_MODULES, Task, load_tasks, task_from_row
from mimesis_jax.chat.base import ChatModel, ChatResponse, ScriptedChatModel, SimulatorAsResponder
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes
from mimesis_jax.data.trajectory import Trajectory

SYSTEM = "You interact with an environment through interact_with_env."


def _row(gym="FunctionGym", rid="func-3", index=0, **create):
    """A row exactly as UserRL's preprocessing writes it (verl format)."""
    return {
        "data_source": f"interact_{gym.lower()}",
        "prompt": [{"content": SYSTEM, "role": "system"}, {"content": f"Task {rid} begins.", "role": "user"}],
        "ability": "interaction",
        "reward_model": {"env_name": gym, "ground_truth": "42.0", "id": rid, "style": "rule"},
        "extra_info": {"index": index, "need_tools_kwargs": True, "split": "test",
                       "tools_kwargs": {"interact_with_env": {"create_kwargs": {"env_name": gym, "id": rid,
                                                                                **create}}}},
    }


# ------------------------------------------------------------------------------------------ loaders
def test_parquet_in_userrl_schema_round_trips(tmp_path):
    rows = [_row("FunctionGym", "func-3", 0), _row("TravelGym", "flight:2-178|hotel:2-106", 1),
            _row("TurtleGym", "The Stopped Clocks", 2, title="The Stopped Clocks", surface="s", bottom="b")]
    # a mixed file's struct columns hold every gym's keys; absent ones are null (as in UserRL's alltrain parquet)
    for r in rows:
        ck = r["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"]
        for k in ("title", "surface", "bottom", "claim"):
            ck.setdefault(k, None)
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_tasks(path)
    assert [t.gym for t in tasks] == ["FunctionGym", "TravelGym", "TurtleGym"]
    assert [t.id for t in tasks] == ["func-3", "flight:2-178|hotel:2-106", "The Stopped Clocks"]
    assert tasks[0].create_kwargs == {"id": "func-3"}  # nulls and env_name dropped
    assert tasks[2].create_kwargs == {"id": "The Stopped Clocks", "title": "The Stopped Clocks", "surface": "s",
                                      "bottom": "b"}
    assert tasks[1].prompt[1] == {"role": "user", "content": "Task flight:2-178|hotel:2-106 begins."}
    assert tasks[0].index == 0 and tasks[0].split == "test" and tasks[0].reward_model["ground_truth"] == "42.0"
    assert load_tasks(path, gyms=["TravelGym"])[0].id == "flight:2-178|hotel:2-106"
    # a task written back is the same row
    again = task_from_row(tasks[0].to_row(), "again")
    assert (again.gym, again.id, again.prompt, again.create_kwargs) == (
        tasks[0].gym, tasks[0].id, tasks[0].prompt, tasks[0].create_kwargs)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.pop("prompt"), "field 'prompt'"),
    (lambda r: r["prompt"].__setitem__(0, {"role": "narrator", "content": "x"}), "prompt[0].role"),
    (lambda r: r["extra_info"].pop("tools_kwargs"), "create_kwargs'"),
    (lambda r: r["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"].update(env_name="ChessGym"),
     "unknown gym 'ChessGym'"),
    (lambda r: (r["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"].pop("id"),
                r["reward_model"].pop("id")), "create_kwargs.id"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, mutate, message):
    import json

    rows = [_row(index=0), _row(index=1)]
    mutate(rows[1])
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(EnvError, match=rf"tasks.jsonl, row 1: .*{re.escape(message)}"):
        load_tasks(path)


def test_bad_files(tmp_path):
    with pytest.raises(EnvError, match="does not exist"):
        load_tasks(tmp_path / "nope.parquet")
    (tmp_path / "x.csv").write_text("a,b")
    with pytest.raises(EnvError, match="x.csv: task files are"):
        load_tasks(tmp_path / "x.csv")
    (tmp_path / "broken.jsonl").write_text('{"prompt": \n')
    with pytest.raises(EnvError, match="broken.jsonl, row 0: not valid JSON"):
        load_tasks(tmp_path / "broken.jsonl")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(EnvError, match="bad.parquet: not a readable parquet"):
        load_tasks(tmp_path / "bad.parquet")
    with pytest.raises(EnvError, match="unknown gyms"):
        load_tasks(tmp_path / "broken.jsonl", gyms=["Nope"])


def test_templates_and_json_answers():
    assert fill("Hi $name, $$5", "t", name="Ann") == "Hi Ann, $5"
    with pytest.raises(EnvError, match=r"prompt template g.k: no value for placeholder \$who"):
        fill("Hi $who", "g.k")
    assert parse_json_object('Sure!\n```json\n{"a": 1, "b": "}{"}\n```') == {"a": 1, "b": "}{"}
    assert parse_json_object('<think>{"no": 1}</think> {"yes": [1, {"x": 2}]}') == {"yes": [1, {"x": 2}]}
    with pytest.raises(ValueError):
        parse_json_object("no json here [1, 2]")


# ------------------------------------------------------------------------------------------ scoring
def test_training_reward_is_the_max_step_reward():
    assert scoring.training_reward([0.0, 0.2, 0.8, 0.2]) == 0.8
    assert scoring.training_reward([]) == 0.0


def test_travel_eval_score_per_aspect():
    steps = [{"choice": "search", "content": "flights", "reward": 0.2},
             {"choice": "answer", "content": "F3", "reward": 0.8},
             {"choice": "answer", "content": "F7", "reward": 1.0},
             {"choice": "answer", "content": "H2", "reward": 0.0},
             {"choice": "answer", "content": "", "reward": 0.5},  # empty answers are ignored (as UserRL's script)
             {"choice": "action", "content": "Any hotel wishes?", "reward": 0.2}]
    # aspects: F -> max(0.8, 1.0) = 1.0; H -> 0.0; three aspects in the id
    assert scoring.travel_eval_score(steps, 3) == pytest.approx(1.0 / 3)
    assert scoring.evaluation_score("TravelGym", steps, task_id="flight:3-1|hotel:3-2|restaurant:3-9") == \
        pytest.approx(1.0 / 3)
    assert scoring.evaluation_score("FunctionGym", steps) == pytest.approx(0.2 + 0.8 + 1.0 + 0.0 + 0.5 + 0.2)
    with pytest.raises(EnvError, match="task id"):
        scoring.evaluation_score("TravelGym", steps)


def _traj(gym, tid, rewards, status="ok"):
    return Trajectory(segments=[], env_info=[{"choice": "answer", "content": "x", "reward": r} for r in rewards],
                      task={"gym": gym, "id": tid}, status=status,
                      invalid_reason=None if status == "ok" else "user model refused its role")


def test_summaries_average_tasks_first_and_keep_invalid_apart():
    trajs = [_traj("TurtleGym", "a", [0.5, 0.25]), _traj("TurtleGym", "a", [0.0]),
             _traj("TurtleGym", "b", [1.0]), _traj("TurtleGym", "b", [0.3], status="invalid"),
             _traj("FunctionGym", "f1", [0.0, 1.0])]
    scores = [scoring.score_trajectory(t) for t in trajs]
    assert scores[3].train_reward is None and scores[3].invalid_reason == "user model refused its role"
    s = scoring.summarize(scores)
    turtle = s["TurtleGym"]
    assert (turtle.episodes, turtle.valid, turtle.invalid, turtle.unique_tasks) == (4, 3, 1, 2)
    # per task first: a -> eval (0.75 + 0.0) / 2, train (0.5 + 0.0) / 2; b -> 1.0 (the invalid one is not a 0)
    assert turtle.mean_eval_score == pytest.approx((0.375 + 1.0) / 2)
    assert turtle.mean_train_reward == pytest.approx((0.25 + 1.0) / 2)
    # overall: weighted by unique tasks (Turtle 2, Function 1)
    assert scoring.overall_score(s) == pytest.approx((2 * 0.6875 + 1 * 1.0) / 3)


# ------------------------------------------------------------------------------------------ mixture
def _tasks(gym, n):
    return [Task(gym=gym, id=f"{gym}-{i}", prompt=[{"role": "system", "content": "s"}], create_kwargs={})
            for i in range(n)]


def test_mixture_proportions_zero_weight_and_resume():
    pool = _tasks("TravelGym", 7) + _tasks("TauGym", 3) + _tasks("FunctionGym", 5) + _tasks("TurtleGym", 2)
    weights = {"TravelGym": 925, "TauGym": 500, "FunctionGym": 200, "TurtleGym": 0}
    s = mixture.MixtureSampler(pool, weights, seed=3)
    draws = s.sample(6000)
    counts = {g: sum(t.gym == g for t in draws) for g in weights}
    total = 925 + 500 + 200
    for g in ("TravelGym", "TauGym", "FunctionGym"):
        p = weights[g] / total
        assert abs(counts[g] / 6000 - p) < 4 * np.sqrt(p * (1 - p) / 6000), (g, counts)
    assert counts["TurtleGym"] == 0
    # within a gym, each epoch visits every task once
    travel = [t.id for t in draws if t.gym == "TravelGym"][:14]
    assert sorted(travel[:7]) == sorted(travel[7:]) == sorted(f"TravelGym-{i}" for i in range(7))
    # resume: a fresh sampler restored from the state continues identically
    a = mixture.MixtureSampler(pool, weights, seed=3)
    a.sample(37)
    state = a.state
    rest = [t.id for t in a.sample(50)]
    b = mixture.MixtureSampler(pool, weights, seed=3)
    b.restore(state)
    assert [t.id for t in b.sample(50)] == rest
    with pytest.raises(EnvError, match="weight 0"):
        mixture.MixtureSampler(_tasks("TurtleGym", 2), weights)


def test_long_prompts_are_dropped_and_counted():
    tok = load_tokenizer("tiny")
    short = _tasks("FunctionGym", 3)
    long_ = [Task(gym="TauGym", id="long", prompt=[{"role": "system", "content": "word " * 2000}], create_kwargs={})]
    n_short = mixture.prompt_tokens(short[0], tok)
    kept, dropped = mixture.filter_long_prompts(short + long_, tok, max_tokens=1152)
    assert [t.id for t in kept] == [t.id for t in short] and dropped == {"TauGym": 1}
    # the limit is exclusive: a prompt of exactly max_tokens tokens is dropped
    kept, dropped = mixture.filter_long_prompts(short, tok, max_tokens=n_short)
    assert kept == [] and dropped == {"FunctionGym": 3}
    assert mixture.filter_long_prompts(short + long_, tok, max_tokens=0)[1] == {}


def test_shipped_tasks_resolve_to_envs():
    """Every shipped task file loads and every task builds its env from the shipped gym data."""
    from mimesis_jax.envs.userrl import make_env, shipped_tasks

    seen = set()
    for split in ("train", "test"):
        for task in shipped_tasks(split):
            env = make_env(task, user=ScriptedChatModel(["ok"]), judge=ScriptedChatModel(["{}"]))
            obs, _ = env.reset(seed=0)
            assert isinstance(obs["feedback"], str)
            seen.add((task.gym, split))
    for gym in mixture.USERRL_TRAIN_ROWS:
        assert (gym, "train") in seen and (gym, "test") in seen, gym
    for gym in ("IntentionGym", "TelepathyGym", "SearchGym"):
        assert (gym, "test") in seen, gym
    assert {g for g, _ in seen} == set(GYM_MODULES)


# ------------------------------------------------------------------------------------------ runner
class _EchoGym(UserRLEnv):
    """A minimal gym that asks its user model inside step (as the UserRL gyms do)."""

    name = "echo"
    prompt_file = ""

    def __init__(self, delay=0.0, **kw):
        super().__init__(**kw)
        self.delay = delay

    def _reset(self):
        return "ready", {}

    def _action(self, content):
        time.sleep(self.delay)
        reply = self.ask_user([{"role": "system", "content": "Answer as the user."},
                               {"role": "user", "content": content}])
        return f"User: {reply}", 0.5, False, {}

    def _answer(self, content):
        verdict = self.ask_parsed(self.judge, [{"role": "user", "content": content}], parse_json_object)
        return "judged", float(verdict["score"]), True, {}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def _task(env, rid=0):
    return EpisodeTask(env=env, agent_messages=[{"role": "system", "content": SYSTEM},
                                                {"role": "user", "content": "Go."}], rollout_id=rid)


def test_runner_records_env_side_user_turns_and_judges(tok):
    user = ScriptedChatModel(["<think>\nI want it cheap.\n</think>\n\nSomething cheap, please."])
    judge = ScriptedChatModel(["not json", '{"score": 0.75}'])
    env = _EchoGym(user=user, judge=judge, user_thinking=True)
    agent = ScriptedAgent(tok, [tool_call_text("action", "What do you want?"), tool_call_text("answer", "X")])
    [traj] = run_episodes(agent, None, [_task(env)], EpisodeConfig(max_turns=4))
    assert traj.status == "ok" and traj.turn_rewards == [0.5, 0.75]
    assert traj.user_thoughts == ["I want it cheap.", None]
    assert traj.user_utterances == ["Something cheap, please.", None]
    assert traj.env_info[0]["feedback"] == "User: Something cheap, please."
    assert "I want it cheap" not in tok.decode(traj.student_tokens())  # the thought never reaches the agent
    assert len(judge.calls) == 2  # one retry after the unparseable answer
    assert user.calls[0][0]["role"] == "system" and traj.meta["end_reason"] == "terminated"


def test_refusing_user_and_failing_judge_make_the_episode_invalid(tok):
    refusing = ScriptedChatModel(["As an AI language model, I cannot pretend to be a traveller."])
    agent = ScriptedAgent(tok, [tool_call_text("action", "Hi")])
    [traj] = run_episodes(agent, None, [_task(_EchoGym(user=refusing))], EpisodeConfig(max_turns=4))
    assert traj.status == "invalid" and "refused its role" in traj.invalid_reason
    assert traj.invalid_reason.startswith("agent turn 0: echo:")
    bad_judge = ScriptedChatModel(["nope", "still nope"])
    agent = ScriptedAgent(tok, [tool_call_text("answer", "X")])
    [traj] = run_episodes(agent, None, [_task(_EchoGym(judge=bad_judge))], EpisodeConfig(max_turns=4))
    assert traj.status == "invalid" and "did not parse twice" in traj.invalid_reason
    assert traj.turn_rewards == [0.0] and traj.env_info[0]["invalid"]


def test_endpoint_failure_is_invalid_not_zero():
    class Down(ChatModel):
        def chat(self, messages, **kw):
            raise ConnectionError("connection refused")
    env = _EchoGym(user=Down())
    env.reset()
    with pytest.raises(InvalidEpisode, match="user model call failed: ConnectionError"):
        env.step("[action] hello")


def test_env_steps_run_concurrently_and_in_order(tok):
    """Eight envs whose user calls each take 0.2 s finish a turn in well under 8 x 0.2 s, results in order."""
    active, peak, lock = [0], [0], threading.Lock()

    class Slow(ChatModel):
        def chat(self, messages, **kw):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.2)
            with lock:
                active[0] -= 1
            return ChatResponse(text=f"reply to {messages[-1]['content']}")

    agent = ScriptedAgent(tok, lambda prompt, i: tool_call_text("action", f"q{i}"))
    tasks = [_task(_EchoGym(user=Slow()), rid=i) for i in range(8)]
    trajs = run_episodes(agent, None, tasks, EpisodeConfig(max_turns=1, env_workers=8))
    assert peak[0] > 1
    assert [t.user_utterances[0] for t in trajs] == [f"reply to q{i}" for i in range(8)]
    serial = run_episodes(ScriptedAgent(tok, lambda p, i: tool_call_text("action", f"q{i}")), None,
                          [_task(_EchoGym(user=ScriptedChatModel(lambda m: f"reply to {m[-1]['content']}")), rid=i)
                           for i in range(8)], EpisodeConfig(max_turns=1, env_workers=1))
    assert [t.user_utterances for t in serial] == [t.user_utterances for t in trajs]


def test_simulator_as_responder_flips_roles():
    sim = ScriptedChatModel(["fine"])
    SimulatorAsResponder(sim).chat([{"role": "system", "content": "persona"}, {"role": "user", "content": "agent q"},
                                    {"role": "assistant", "content": "my earlier reply"},
                                    {"role": "user", "content": "agent q2"}])
    assert [m["role"] for m in sim.calls[0]] == ["system", "assistant", "user", "assistant"]


def test_simulator_as_responder_batches_releases_and_closes_through_its_simulator():
    class Sim(ChatModel):
        max_concurrency = 3

        def __init__(self):
            self.batches, self.released, self.closed = [], [], 0

        def chat(self, messages, **kw):
            raise AssertionError("the batch goes through chat_batch")

        def chat_batch(self, conversations, **kw):
            self.batches.append(([[m["role"] for m in c] for c in conversations], kw))
            return [ChatResponse(c[-1]["content"]) for c in conversations]

        def release(self, keys):
            self.released.append(keys)

        def close(self):
            self.closed += 1

    sim = Sim()
    wrapped = SimulatorAsResponder(sim)
    out = wrapped.chat_batch([[{"role": "user", "content": "a"}],
                              [{"role": "system", "content": "p"}, {"role": "assistant", "content": "b"}]],
                             temperature=0.5)
    assert [r.text for r in out] == ["a", "b"]
    assert sim.batches == [([["assistant"], ["system", "user"]], {"temperature": 0.5})]
    wrapped.release([7])
    wrapped.close()
    assert (sim.released, sim.closed, wrapped.max_concurrency) == ([[7]], 1, 3)


@pytest.mark.parametrize("limit", [1, 2])
def test_env_threads_run_at_most_max_concurrency_calls_of_a_shared_model(tok, limit):
    """Eight envs share one user model: the env threads never run more than its max_concurrency calls at once."""
    active, peak, lock = [0], [0], threading.Lock()

    class Shared(ChatModel):
        max_concurrency = limit

        def chat(self, messages, **kw):
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.1)
            with lock:
                active[0] -= 1
            return ChatResponse(text="ok")

    user = Shared()
    tasks = [_task(_EchoGym(user=user), rid=i) for i in range(8)]
    run_episodes(ScriptedAgent(tok, lambda prompt, i: tool_call_text("action", f"q{i}")), None, tasks,
                 EpisodeConfig(max_turns=1, env_workers=8))
    assert peak[0] == limit


def test_a_gym_side_that_is_not_a_chat_model_is_refused():
    class Duck:
        def chat(self, messages, **kw):
            return ChatResponse(text="quack")

    env = _EchoGym(user=Duck())
    env.reset()
    with pytest.raises(EnvError, match="the user model must subclass ChatModel"):
        env.step("[action] hello")


def test_base_env_protocol_errors():
    env = _EchoGym(user=ScriptedChatModel(["x"]), max_steps=1)
    env.reset()
    obs, r, term, trunc, info = env.step("[search] anything")  # no handler: invalid, counts as a step
    assert info["invalid_action"].startswith("choice 'search' is not allowed") and trunc and not term
    with pytest.raises(EnvError, match="episode has ended"):
        env.step("[action] more")
    with pytest.raises(EnvError, match="max_steps must be >= 1"):
        _EchoGym(max_steps=0)
    assert isinstance(env, Env)


def test_mixture_configs():
    """The shipped mixture configs: training = UserRL's five training gyms in its proportions; evaluation = all
    eight gyms' test tasks once each; --set overrides are type-checked."""
    import os

    from mimesis_jax.config import load_config
    from mimesis_jax.errors import ConfigError

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    train = load_config(os.path.join(root, "configs/userrl_train_mixture.py"), kind=mixture.MixtureConfig)
    assert train.weight_map() == {"TravelGym": 925, "TauGym": 500, "TurtleGym": 423, "PersuadeGym": 378,
                                  "FunctionGym": 200} and train.max_prompt_tokens == 1152 and train.max_turns == 16
    tasks, _ = mixture.build_tasks(train)
    assert {t.gym for t in tasks} == set(mixture.USERRL_TRAIN_ROWS) and all(t.split == "train" for t in tasks)
    ev = load_config(os.path.join(root, "configs/userrl_eval_mixture.py"), ["max_turns=8"], kind=mixture.MixtureConfig)
    tasks, _ = mixture.build_tasks(ev)
    assert {t.gym for t in tasks} == set(GYM_MODULES) and ev.max_turns == 8
    with pytest.raises(ConfigError, match="config key 'max_turns'"):
        load_config(os.path.join(root, "configs/userrl_eval_mixture.py"), ["max_turns=0"], kind=mixture.MixtureConfig)
    with pytest.raises(ConfigError, match="unknown gyms"):
        load_config(os.path.join(root, "configs/userrl_eval_mixture.py"), ["gyms=('ChessGym',)"],
                    kind=mixture.MixtureConfig)
