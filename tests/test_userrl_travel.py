"""TravelGym (UserRL): every reward branch on scripted dialogues, INVALID paths, the episode runner end to end,
and the data loader. Expected rewards are written from UserRL's rules, not taken from the implementation."""

import json
import pathlib
import shutil

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import tool_call_text, userrl
from mimesis_jax.envs.agent_env import EnvError, InvalidEpisode
from mimesis_jax.envs.userrl import travel as tv
from mimesis_jax.envs.userrl.tasks import Task
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import EpisodeConfig, EpisodeTask, ScriptedAgent, run_episodes

DATA = pathlib.Path(userrl.DATA_DIR)
TRAIN = userrl.shipped_tasks("train", ["TravelGym"])
TEST = userrl.shipped_tasks("test", ["TravelGym"])
RAW = {}
for _n in ("22", "33"):
    RAW.update(json.loads((DATA / f"travelgym_data_{_n}.json").read_text()))

# UserRL: env_manager (training) 0.8 / 0.0, eval.py 0.6 / 0.2; answers 1.0 best, 0.8 correct, 0 wrong
PREF = {"train": 0.8, "eval": 0.6, "gym": 0.2}
SEARCH = {"train": 0.0, "eval": 0.2, "gym": 0.2}
BEST, CORRECT = 1.0, 0.8
REFUSAL = "As an AI language model, I cannot pretend to be a traveller."


def search_says(verdict, aspect=None):
    obj = {"alignment_judgement": verdict}
    if aspect is not None:
        obj["alignment_aspect"] = aspect
    return "```json\n" + json.dumps(obj) + "\n```"


def kind(t, pid=None):
    return json.dumps({"type": t, **({"preference_id": pid} if pid else {})})


def user_says(text, thought="let me think"):
    return f"<think>{thought}</think> {text}"


def make(task=None, judge=(), user=(), **kw):
    task = task or TRAIN[0]
    j, u = ScriptedChatModel(list(judge), cycle=False), ScriptedChatModel(list(user), cycle=False)
    env = userrl.make_env(task, user=u, judge=j, seed=0, **kw)
    env.reset()
    return env, j, u


def ids(task):
    """best id, a correct-not-best id and a wrong id per aspect, straight from the data file."""
    rec = RAW[task.id]
    out = {}
    for d in rec["dimensions"]:
        best = rec[d]["best_id"]
        out[d] = (best, [i for i in rec[d]["correct_ids"] if i != best][0], rec[d]["options"]["wrong"][0]["id"])
    return rec["dimensions"], out


def prefs(task):
    """[(P-id, aspect, hint)] numbered across aspects in order, as UserRL numbers them."""
    rec, out = RAW[task.id], []
    for d in rec["dimensions"]:
        for p in rec[d]["preferences"]:
            out.append((f"P{len(out) + 1}", p[0], p[3]))
    return out


def task_with(aspect):
    return next(t for t in TRAIN + TEST if aspect in RAW[t.id]["dimensions"])


# ---------------------------------------------------------------------------------- shipped files
def test_shipped_tasks_and_data():
    assert 5 <= len(TRAIN) <= 10 and len(TEST) == 5
    assert not {t.id for t in TRAIN} & {t.id for t in TEST}
    for name in ("travelgym_data_22.json", "travelgym_data_33.json"):
        assert (DATA / name).stat().st_size < 50_000
    for t in TRAIN + TEST:
        assert t.gym == "TravelGym" and t.data_source == "interact_travelgym" and t.ability == "interaction"
        assert [m["role"] for m in t.prompt] == ["system", "user"] and len(t.prompt[0]["content"].split()) < 600
        rec = RAW[t.id]
        assert t.reward_model["ground_truth"] == str([rec[d]["best_id"] for d in rec["dimensions"]])
        assert t.prompt[1]["content"].startswith(rec["initial_description"])
        counts = [part.split(":")[1].split("-")[0] for part in t.id.split("|")]
        assert [p.split(":")[0] for p in t.id.split("|")] == rec["dimensions"]
        file = DATA / f"travelgym_data_{''.join(sorted(counts))}.json"
        assert t.id in json.loads(file.read_text())
        for d, n in zip(rec["dimensions"], counts):
            assert len(rec[d]["preferences"]) == int(n)
            letter = {"flight": "F", "hotel": "H", "apartment": "A", "rental_car": "C", "restaurant": "R"}[d]
            for kind_ in ("correct", "wrong", "noise"):
                assert all(o["id"][0] == letter for o in rec[d]["options"][kind_])
        env, _, _ = make(t)
        obs, info = env.reset()
        assert obs["feedback"] == rec["initial_description"] and info["n_aspects"] == len(rec["dimensions"])
        assert env.max_steps == 15


# ---------------------------------------------------------------------------------- [search]
@pytest.mark.parametrize("variant", ["train", "eval", "gym"])
def test_search_branches(variant):
    t = TRAIN[0]
    dims, _ = ids(t)
    d0, d1 = dims
    judge = [search_says("True", d0), search_says("True", d0), search_says("False"), search_says("N/A"),
             search_says("True", d1)]
    env, j, _ = make(t, judge=judge, reward_variant=variant)
    obs, r, term, trunc, info = env.step(f"[search] {d0} options please")
    assert r == SEARCH[variant] and not term and info["search_outcome"] == "correct"
    for o in RAW[t.id][d0]["options"]["correct"] + RAW[t.id][d0]["options"]["wrong"]:
        assert f'"id": "{o["id"]}"' in obs["feedback"]
    assert '"type"' not in obs["feedback"] and '"reason"' not in obs["feedback"]
    # the judge saw every aspect's correct arguments
    for d in dims:
        for v in RAW[t.id][d]["arguments"].values():
            assert str(v) in j.calls[0][1]["content"]
    obs, r, *_ = env.step(f"[search] {d0} again")
    assert r == 0.0 and obs["feedback"] == tv.SEARCH_REPEAT.format(aspect=d0)
    assert env.step("[search] something odd")[1] == 0.0
    assert env.step("[search] unrelated")[1] == 0.0
    assert len(j.calls) == 4
    obs, r, _, _, info = env.step("[search] the 5th search")  # fails on purpose, no judge call
    assert r == 0.0 and info["search_outcome"] == "failed_on_purpose" and len(j.calls) == 4
    assert env.step(f"[search] {d1}")[1] == SEARCH[variant]
    assert len(j.calls) == 5


def test_search_aspect_names_and_overrides():
    t = task_with("rental_car")
    env, j, _ = make(t, judge=[json.dumps({"alignment_judgement": True, "alignment_aspect": "Car Rental"})],
                     search_correct_reward=0.5)
    obs, r, _, _, info = env.step("[search] car")
    assert r == 0.5 and info["search_aspect"] == "rental_car" and "<rental_car>" in obs["feedback"]
    missing = next(a for a in ("flight", "hotel", "apartment", "restaurant") if a not in RAW[t.id]["dimensions"])
    env, _, _ = make(t, judge=[search_says("True", missing)], reward_variant="eval")
    obs, r, _, _, info = env.step("[search] x")
    assert r == 0.0 and info["search_outcome"] == "aspect_not_in_task"
    env, _, _ = make(t, judge=[search_says("True", "spaceship"), search_says("True", "spaceship")])
    with pytest.raises(InvalidEpisode, match="judge"):
        env.step("[search] x")


# ---------------------------------------------------------------------------------- [action]
@pytest.mark.parametrize("variant", ["train", "eval"])
def test_action_types(variant):
    t = TRAIN[0]
    (p1, _, hint1), (p2, _, _) = prefs(t)[:2]
    judge = [kind("2", p1), kind("3"), kind("4"), kind("1"), kind(2, p2)]
    user = [user_says("Honestly, changing planes wears me out.", "hint at it"), user_says("Sounds fine."),
            '```json\n{"thought": "be subtle", "response": "We will see."}\n```']
    env, j, u = make(t, judge=judge, user=user, reward_variant=variant)
    obs, r, _, _, info = env.step("[action] Would you take a flight with a layover?")
    assert r == PREF[variant] and obs["feedback"] == "Honestly, changing planes wears me out."
    assert info["user_thought"] == "hint at it" and info["elicited"] == [p1]
    assert hint1 in u.calls[0][1]["content"]
    obs, r, _, _, info = env.step("[action] What colour should the car be?")
    assert r == 0.0 and info["action_type"] == "asks_missing_preference" and len(u.calls) == 1
    assert obs["feedback"] == env.prompt("reply_no_such_preference") and info.get("user_utterance") is None
    obs, r, _, _, info = env.step("[action] Any wishes?")
    assert r == 0.0 and obs["feedback"] == env.prompt("reply_too_vague") and len(u.calls) == 1
    obs, r, _, _, info = env.step("[action] Nice weather in spring.")
    assert r == 0.0 and obs["feedback"] == "Sounds fine." and len(u.calls) == 2
    # P1 was revealed: the classifier no longer sees it
    assert f"Preference ID: {p1}" not in j.calls[1][1]["content"] and f"Preference ID: {p2}" in j.calls[1][1]["content"]
    obs, r, _, _, info = env.step("[action] Which airline would you avoid?")  # integer type, JSON user reply
    assert r == PREF[variant] and obs["feedback"] == "We will see." and info["user_thought"] == "be subtle"


def test_preference_override_and_separate_classifier():
    t = TRAIN[0]
    p1 = prefs(t)[0][0]
    classifier = ScriptedChatModel([kind("2", p1)], cycle=False)
    env, j, u = make(t, judge=[], user=[user_says("Hmm.")], classifier=classifier,
                     reward_variant="eval", preference_correct_reward=0.3)
    assert env.step("[action] Nonstop or not?")[1] == 0.3
    assert len(classifier.calls) == 1 and not j.calls


def test_volunteers_after_three_off_topic_turns():
    t = TRAIN[0]
    hints = {p: h for p, _, h in prefs(t)}
    judge = [kind("1"), kind("3"), kind("4"), kind("1"), kind("1")]
    env, j, u = make(t, judge=judge, user=[user_says("ok"), user_says("By the way..."), user_says("ok")])
    for msg in ("Hello!", "Favourite colour?", "Anything?"):
        _, r, _, _, info = env.step(f"[action] {msg}")
        assert r == 0.0 and not info["volunteered"]
    assert info["off_topic_count"] == 3
    obs, r, _, _, info = env.step("[action] Nice day.")  # after 3 off-topic turns the user volunteers one
    assert r == 0.0 and info["volunteered"] and obs["feedback"] == "By the way..."
    [pid] = info["elicited"]
    assert hints[pid] in u.calls[1][1]["content"] and info["off_topic_count"] == 0
    env.step("[action] And then?")
    assert f"Preference ID: {pid}" not in j.calls[4][1]["content"]


def test_preference_question_resets_the_off_topic_count_and_sync_threshold():
    t = TRAIN[0]
    p1 = prefs(t)[0][0]
    env, _, u = make(t, judge=[kind("1"), kind("1"), kind("2", p1), kind("1"), kind("1"), kind("1")],
                     user=[user_says("ok")] * 6)
    infos = [env.step(f"[action] m{i}")[4] for i in range(6)]
    assert [i["volunteered"] for i in infos] == [False] * 6 and infos[-1]["off_topic_count"] == 3
    # UserRL's synchronous step: the third off-topic turn itself volunteers (counter >= interval - 1)
    env, _, _ = make(t, judge=[kind("1")] * 3, user=[user_says("ok")] * 3, userrl_path="sync")
    assert [env.step(f"[action] m{i}")[4]["volunteered"] for i in range(3)] == [False, False, True]
    env, _, _ = make(t, judge=[kind("1")] * 3, user=[user_says("ok")] * 3, elicitation_interval=1)
    assert [env.step(f"[action] m{i}")[4]["volunteered"] for i in range(3)] == [False, True, False]


# ---------------------------------------------------------------------------------- [answer]
def test_answer_branches_and_termination():
    t = TRAIN[0]
    (d0, d1), x = ids(t)
    env, j, _ = make(t, judge=[kind("1")], user=[user_says("ok")])
    obs, r, term, _, info = env.step(f"[answer] {x[d0][0]}")
    assert (r, term) == (BEST, False) and info["aspect"] == d0 and info["answer_parts"][0]["verdict"] == "best"
    obs, r, term, _, info = env.step(f"[answer] {x[d0][1]}")  # one choice per aspect
    assert (r, term) == (0.0, False) and info["aspect"] == d0
    assert obs["feedback"] == tv.ANSWER_REPEAT.format(letter=x[d0][1][0])
    obs, r, _, _, info = env.step("[answer] hotel please")
    assert r == 0.0 and obs["feedback"] == tv.ANSWER_BAD_ID.format(id="hotel please") and info["aspect"] is None
    obs, r, term, _, info = env.step(f"[answer] {x[d1][1]}")
    assert (r, term) == (CORRECT, False) and info["aspect"] == d1  # the best of d1 is still missing
    # the answered aspects' preferences are dropped: the classifier is shown none
    env.step("[action] so?")
    assert "Preference ID" not in j.calls[0][1]["content"]
    env, _, _ = make(t)
    assert env.step(f"[answer] {x[d1][2]}")[1:3] == (0.0, False)
    env, _, _ = make(t)
    assert env.step(f"[answer] {x[d0][0]}")[1:3] == (BEST, False)
    obs, r, term, trunc, _ = env.step(f"[answer] {x[d1][0]}")
    assert (r, term, trunc) == (BEST, True, False) and obs["feedback"] == tv.VERDICT_BEST + tv.RECORDED_ONE
    with pytest.raises(EnvError):
        env.step("[action] more?")


def test_answer_penalty_multi_ids_and_sync_path():
    t = TRAIN[0]
    (d0, d1), x = ids(t)
    penalty = 0.3
    env, _, _ = make(t, wrong_choice_penalty=penalty)
    assert env.step(f"[answer] {x[d0][2]}")[1] == max(0.0, -penalty)
    env, _, _ = make(t, wrong_choice_penalty=penalty)
    assert env.step(f"[answer] {x[d0][0]}, {x[d1][2]}")[1] == pytest.approx(BEST - penalty)
    # async (UserRL's run path): several ids are summed and not capped
    env, _, _ = make(t)
    _, r, term, _, info = env.step(f"[answer] {x[d0][0]}, {x[d1][0]}")
    assert (r, term) == (2 * BEST, True) and [p["aspect"] for p in info["answer_parts"]] == [d0, d1]
    # a repeated initial inside one answer: 0 for the step, but the first id still counts as found
    env, _, _ = make(t)
    assert env.step(f"[answer] {x[d0][0]}, {x[d0][1]}")[1] == 0.0
    assert env.step(f"[answer] {x[d1][0]}")[1:3] == (BEST, True)
    # sync path: several ids refused; all aspects answered ends the episode
    env, _, _ = make(t, userrl_path="sync")
    obs, r, term, _, _ = env.step(f"[answer] {x[d0][0]}, {x[d1][0]}")
    assert (r, term) == (0.0, False) and obs["feedback"] == tv.ANSWER_MULTI
    assert env.step(f"[answer] {x[d0][2]}")[1:3] == (0.0, False)
    assert env.step(f"[answer] {x[d1][2]}")[1:3] == (0.0, True)
    env, _, _ = make(t)
    env.step(f"[answer] {x[d0][2]}")
    assert env.step(f"[answer] {x[d1][2]}")[1:3] == (0.0, False)  # async: only all best ids end it


def test_finish_invalid_format_truncation_and_options():
    t = TRAIN[0]
    env, _, _ = make(t)
    obs, r, term, _, _ = env.step("[finish]")
    assert (r, term) == (0.0, True)
    assert obs["feedback"] == tv.FINISHED.format(found=0, total=len(env.remaining_prefs), ratio=0.0)
    env, _, _ = make(t, max_steps=2, judge=[search_says("False")])
    obs, r, term, trunc, _ = env.step("hello")
    assert (r, term, trunc) == (0.0, False, False) and obs["feedback"] == tv.INVALID_FORMAT
    assert env.step("[search] x")[2:4] == (False, True)
    row = dict(t.to_row())
    row["extra_info"]["tools_kwargs"]["interact_with_env"]["create_kwargs"]["max_turns"] = 16
    task16 = userrl.task_from_row(row, "test")
    assert userrl.make_env(task16).max_steps == 16
    with pytest.raises(EnvError, match="reward_variant"):
        userrl.make_env(t, reward_variant="best")
    with pytest.raises(EnvError, match="unknown options"):
        userrl.make_env(t, preference_reward=1.0)
    env = userrl.make_env(t, reward_scale=2.0, step_penalty=0.1)
    env.reset()
    assert env.step(f"[answer] {ids(t)[1][ids(t)[0][0]][0]}")[1] == pytest.approx(2 * BEST - 0.1)
    assert env.step("no prefix")[1] == pytest.approx(-0.1)  # UserRL scales every step but [finish]
    assert env.step("[finish]")[1] == 0.0
    env = userrl.make_env(t, reward_scale=2.0, normalize_rewards=True)
    env.reset()
    assert env.step(f"[answer] {ids(t)[1][ids(t)[0][0]][0]}")[1] == 1.0


# ---------------------------------------------------------------------------------- INVALID
def test_invalid_paths():
    t = TRAIN[0]
    p1 = prefs(t)[0][0]
    env, _, _ = make(t, judge=[kind("2", p1)], user=[REFUSAL])
    with pytest.raises(InvalidEpisode, match="refused"):
        env.step("[action] Nonstop?")
    env, _, _ = make(t, judge=["I think it is a question.", "Still no JSON"])
    with pytest.raises(InvalidEpisode, match="classifier"):
        env.step("[action] Nonstop?")
    env, _, _ = make(t, judge=[kind("2", "P99"), kind("2", "P98")])
    with pytest.raises(InvalidEpisode, match="preference_id"):
        env.step("[action] Nonstop?")
    env, _, _ = make(t, judge=[search_says("Maybe"), "nothing"])
    with pytest.raises(InvalidEpisode, match="judge"):
        env.step("[search] x")
    env, j, _ = make(t, judge=["no idea", kind("2", p1)], user=[user_says("Fine.")])
    _, r, *_ = env.step("[action] Nonstop?")  # retried once, then fine
    assert r == PREF["train"] and len(j.calls) == 2


# ---------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")


def test_run_episodes_end_to_end(tok):
    from mimesis_jax.envs.userrl.scoring import evaluation_score
    t = TRAIN[0]
    (d0, d1), x = ids(t)
    p1 = prefs(t)[0][0]
    judge = ScriptedChatModel([search_says("True", d0), kind("2", p1)], cycle=False)
    user = ScriptedChatModel([user_says("Layovers drive me mad.", "hint at nonstop")], cycle=False)
    env = userrl.make_env(t, user=user, judge=judge, seed=1)
    replies = [tool_call_text("search", f"{d0} from the trip details"), tool_call_text("action", "Layovers ok?"),
               tool_call_text("answer", x[d0][0]), tool_call_text("answer", x[d1][0])]
    agent = ScriptedAgent(tok, replies)
    [traj] = run_episodes(agent, None,
                          [EpisodeTask(env=env, agent_messages=t.prompt, task={"gym": t.gym, "id": t.id})],
                          EpisodeConfig(max_turns=16), tokenizer=tok)
    assert traj.status == "ok" and traj.meta["end_reason"] == "terminated" and traj.meta["turns"] == 4
    assert traj.turn_rewards == [SEARCH["train"], PREF["train"], BEST, BEST]
    assert traj.user_utterances == [None, "Layovers drive me mad.", None, None]
    assert traj.user_thoughts == [None, "hint at nonstop", None, None]
    assert [s.get("aspect") for s in traj.env_info] == [None, None, d0, d1]
    assert evaluation_score("TravelGym", traj.env_info, task_id=t.id) == (BEST + BEST) / 2
    seen = tok.decode(agent.prompts[2])
    assert "Layovers drive me mad." in seen and "hint at nonstop" not in seen and f"<{d0}>" in seen


def test_run_episodes_invalid_user(tok):
    t = TEST[0]
    p1 = prefs(t)[0][0]
    env = userrl.make_env(t, user=ScriptedChatModel([REFUSAL]), judge=ScriptedChatModel([kind("2", p1)]))
    [traj] = run_episodes(ScriptedAgent(tok, [tool_call_text("action", "What do you like?")]), None,
                          [EpisodeTask(env=env, agent_messages=t.prompt)], EpisodeConfig(max_turns=4), tokenizer=tok)
    assert traj.status == "invalid" and "refused" in traj.invalid_reason and traj.meta["end_reason"] == "invalid"


# ---------------------------------------------------------------------------------- loader
def _task_for(task_id):
    return Task(gym="TravelGym", id=task_id, prompt=[{"role": "system", "content": "x"}], create_kwargs={"id": task_id})


def test_loader_errors_and_file_order(tmp_path):
    t = TRAIN[0]
    good = RAW[t.id]
    bad = json.loads(json.dumps(good))
    d0 = bad["dimensions"][0]
    del bad[d0]["best_id"]
    (tmp_path / "travelgym_data_22.json").write_text(json.dumps({t.id: bad}))
    with pytest.raises(EnvError, match=r"travelgym_data_22\.json.*'best_id'"):
        userrl.make_env(t, data_dir=tmp_path)
    bad[d0]["best_id"] = "Z1"
    bad[d0]["preferences"][0] = ["flight", "only three", "fields"]
    (tmp_path / "travelgym_data_22.json").write_text(json.dumps({t.id: bad}))
    with pytest.raises(EnvError, match=r"preferences\[0\]"):
        userrl.make_env(t, data_dir=tmp_path)
    with pytest.raises(EnvError, match="flight:9-999"):
        userrl.make_env(_task_for("flight:9-999"), data_dir=DATA)
    with pytest.raises(EnvError, match="does not exist"):
        userrl.make_env(t, data_dir=tmp_path / "nowhere")
    # UserRL merges its files in order 22, 33, ..., 333: a later file wins; files may sit below data_dir
    nested = tmp_path / "gyms" / "TravelGym" / "travelgym" / "data"
    nested.mkdir(parents=True)
    shutil.copy(DATA / "travelgym_data_22.json", nested / "travelgym_data_22.json")
    later = dict(good, initial_description="A later file's version.")
    (nested / "travelgym_data_333.json").write_text(json.dumps({t.id: later}))
    (tmp_path / "travelgym_data_22.json").unlink()
    env = userrl.make_env(t, data_dir=tmp_path / "gyms")
    assert env.reset()[0]["feedback"] == "A later file's version."
