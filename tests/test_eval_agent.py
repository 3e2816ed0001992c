"""The agent evaluation matrix (mimesis_jax/commands/evalagent.py): 2 scripted agents x 2 scripted users x FunctionGym and
TurtleGym (their first two shipped test tasks) x 2 seeds, every number worked out by hand below; invalid episodes
(a host that refuses one story) counted and left out of the means; resuming reruns exactly a deleted cell; a
changed spec or setting is an error; the `evalagent` command line."""

import dataclasses
import json
import math
import os
import re
import shutil

import pytest

from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import tool_call_text
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.userrl import DATA_DIR
from mimesis_jax.commands import evalagent as ev
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.agent import ScriptedAgent

GYMS = ["FunctionGym", "TurtleGym"]
BASE_ARGS = ["--agent", "A=tiny", "--agent", "B=tiny", "--user", "U1=tiny", "--user", "U2=tiny",
             "--gyms", ",".join(GYMS), "--max-tasks", "2", "--seeds", "2", "--max-turns", "2"]
REFUSAL = "As an AI language model, I cannot pretend to be a riddle host."

# FunctionGym test tasks func-10 and func-11, their rules written by hand: the value each maps (1, 2, 3, 4) to
PROBE = {"func-10": 2 * (3 + 4) - 1 ** 2, "func-11": -1 + 2 * 4 - 3}  # b*(c+d) - a**2 = 13; -a + b*d - c = 4
FUNCTIONS = {r["id"]: r for r in json.loads((DATA_DIR / "functions.json").read_text())}
STORIES = {s["new_title"]: s for s in json.loads((DATA_DIR / "all_stories_refined.json").read_text()).values()}
TURTLE_TASKS = ["The Stopped Clocks", "The Cold Soup"]  # both have rubric weights 0.4, 0.2, 0.3, 0.1


def rubric(title, judgment):
    """TurtleGym's story score: sum of weight * judgment in rubric order from 0.0, clipped to [0, 1]."""
    total = 0.0
    for c in STORIES[title]["evaluation"]:
        total += c["score"] * judgment
    return min(1.0, total)


FULL, HALF = rubric("The Cold Soup", 1), rubric("The Cold Soup", 0.5)
assert FULL == rubric("The Stopped Clocks", 1) == 1.0 and HALF == rubric("The Stopped Clocks", 0.5)


def judge_reply(judgment):
    return json.dumps({"scores": [{"statement": f"s{i}", "score": judgment} for i in range(4)], "feedback": "ok"})


def scripted_agent(tok, name):
    """A: probes the function with 1 2 3 4 and answers right on both; asks the host one question, then answers.
    B: probes, answers right on func-10 only (0 otherwise); answers the riddle at once (never asks the host)."""
    def reply(prompt, _):
        turn = prompt.count("<tool_response>")
        if "Surface:" in prompt:  # TurtleGym
            if name == "A" and turn == 0:
                return tool_call_text("action", "Is there a child in the story?")
            return tool_call_text("answer", "A story.")
        if turn == 0:
            return tool_call_text("action", "1 2 3 4")
        value = float(re.findall(r"to (-?[\d.]+)\.\n", prompt)[-1])
        fid = next(f for f, v in PROBE.items() if v == value)
        right = name == "A" or fid == "func-10"
        return tool_call_text("answer", str(FUNCTIONS[fid]["expected_result"]) if right else "0")
    return ScriptedAgent(tok, reply)


def scripted_user(name):
    """(host, judge). U1: answers "No.", judges every rubric statement 1. U2: refuses the Stopped Clocks story
    (its surface says 3:17), answers "No." otherwise, judges every statement 0.5."""
    def host(messages):
        if name == "U2" and any("3:17" in m["content"] for m in messages):
            return REFUSAL
        return "No."
    return ScriptedChatModel(host), ScriptedChatModel([judge_reply(1 if name == "U1" else 0.5)])


class Models:
    """The matrix's entries (specs as the command line records them) with scripted models; counts loads."""

    def __init__(self, out):
        self.tok = load_tokenizer("tiny")
        self.loads, self.built = [], {}
        args = parse(out)
        agents, users, _ = ev._entries(args)
        self.agents = [dataclasses.replace(e, load=self._loader(e.name, scripted_agent, self.tok)) for e in agents]
        self.users = [dataclasses.replace(e, load=self._loader(e.name, scripted_user)) for e in users]
        self.tasks = ev.load_gym_tasks(GYMS, None, "test", 2)
        self.config = ev.EvalConfig(max_turns=2, agent_max_tokens=512, batch=3)

    def _loader(self, name, make, *extra):
        def load():
            self.loads.append(name)
            self.built[name] = make(*extra, name) if extra else make(name)
            return self.built[name]
        return load

    def run(self, out, **kw):
        return ev.evaluate(out, self.agents, self.users, self.tasks, [0, 1], kw.pop("config", self.config),
                           log=lambda _: None, **kw)


def parse(out, *extra):
    import argparse

    return ev.add_args(argparse.ArgumentParser()).parse_args(BASE_ARGS + ["--out", str(out), *extra])


def mean_se(xs):
    n = len(xs)
    m = sum(xs) / n
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) / math.sqrt(n)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    out = tmp_path_factory.mktemp("matrix") / "ev"
    models = Models(out)
    summary = models.run(str(out))
    return out, models, summary


def cell(out, a, u, g, s):
    return json.loads((out / "cells" / f"{a}__{u}__{g}__seed{s}.json").read_text())


# ------------------------------------------------------------------------------------------ the matrix
def test_cells_hold_userrl_evaluation_scores_and_invalid_episodes_apart(done):
    out, models, _ = done
    assert sorted(os.listdir(out / "cells")) == sorted(
        f"{a}__{u}__{g}__seed{s}.json" for a in "AB" for u in ("U1", "U2") for g in GYMS for s in (0, 1))
    c = cell(out, "A", "U2", "TurtleGym", 1)
    assert (c["agent"], c["user"], c["gym"], c["seed"]) == ("A", "U2", "TurtleGym", 1)
    assert [e["task_id"] for e in c["episodes"]] == TURTLE_TASKS
    refused, ok = c["episodes"]
    assert refused["score"] is None and refused["status"] == "invalid" and "as_an_ai" in refused["invalid_reason"]
    assert ok == {"task_id": "The Cold Soup", "score": HALF, "status": "ok", "invalid_reason": None,
                  "train_reward": HALF, "turns": 2, "end_reason": "turn_limit"}
    # the invalid episode is not a 0: the mean is over the one valid episode
    assert (c["mean_score"], c["n_valid"], c["n_invalid"]) == (HALF, 1, 1)
    c = cell(out, "B", "U1", "FunctionGym", 0)
    assert [(e["task_id"], e["score"], e["end_reason"]) for e in c["episodes"]] == [
        ("func-10", 1.0, "terminated"), ("func-11", 0.0, "turn_limit")]
    assert (c["mean_score"], c["n_valid"], c["n_invalid"]) == (0.5, 2, 0)
    assert cell(out, "B", "U1", "TurtleGym", 0)["mean_score"] == FULL
    assert cell(out, "B", "U2", "TurtleGym", 0)["mean_score"] == (HALF + HALF) / 2 == HALF


def test_summary_per_gym_avg_mr_invalid_and_per_user(done):
    out, models, summary = done
    assert json.loads((out / "summary.json").read_text()) == summary
    assert (summary["agents"], summary["users"], summary["gyms"], summary["seeds"]) == (
        ["A", "B"], ["U1", "U2"], GYMS, [0, 1])
    # cells over (U1, s0), (U1, s1), (U2, s0), (U2, s1)
    turtle = [FULL, FULL, HALF, HALF]  # the same for A (one U2 episode invalid per seed) and B
    m, se = mean_se(turtle)
    assert summary["per_gym"]["A"]["FunctionGym"] == {"mean": 1.0, "se": 0.0, "n": 4}
    assert summary["per_gym"]["B"]["FunctionGym"] == {"mean": 0.5, "se": 0.0, "n": 4}
    for a in "AB":
        got = summary["per_gym"][a]["TurtleGym"]
        assert got["n"] == 4 and got["mean"] == pytest.approx(0.75) and got["se"] == pytest.approx(se)
        assert got["mean"] == pytest.approx(m)
    assert summary["invalid"] == {"A": {"FunctionGym": 0, "TurtleGym": 2}, "B": {"FunctionGym": 0, "TurtleGym": 0}}
    # Avg over the gyms; its SE over the 4 (user, seed) replicates' own gym averages
    assert summary["avg"]["A"]["mean"] == pytest.approx((1.0 + 0.75) / 2)
    assert summary["avg"]["B"]["mean"] == pytest.approx((0.5 + 0.75) / 2)
    assert summary["avg"]["A"]["se"] == pytest.approx(mean_se([(1 + t) / 2 for t in turtle])[1])
    assert summary["avg"]["B"]["se"] == pytest.approx(mean_se([(0.5 + t) / 2 for t in turtle])[1])
    # MR: FunctionGym A 1st, B 2nd; TurtleGym an exact tie, both 1.5
    assert summary["mr"] == {"A": (1 + 1.5) / 2, "B": (2 + 1.5) / 2} == {"A": 1.25, "B": 1.75}
    assert summary["ranked_gyms"] == GYMS
    assert summary["per_user"]["U2"]["A"] == {"FunctionGym": 1.0, "TurtleGym": HALF}
    assert summary["per_user"]["U1"]["B"] == {"FunctionGym": 0.5, "TurtleGym": FULL}
    table = ev.format_table(summary).splitlines()
    assert table[1].split() == ["A", "1.000+-0.000", f"0.750+-{se:.3f}", f"0.875+-{summary['avg']['A']['se']:.3f}",
                                "1.25", "2"]


def test_each_model_loaded_once_and_called_as_worked_out(done):
    _, models, _ = done
    assert sorted(models.loads) == ["A", "B", "U1", "U2"]
    # A, per (user, seed): FunctionGym 2 tasks x 2 turns; TurtleGym with U1 2 + 2 turns (the answer ends it),
    # with U2 1 turn (refused) + 2 turns (turn limit)
    assert len(models.built["A"].prompts) == 4 * 4 + 2 * 4 + 2 * 3
    # B: FunctionGym 2 x 2 turns; TurtleGym with U1 1 + 1 turn, with U2 2 + 2 (an answer scoring 0.5 goes on)
    assert len(models.built["B"].prompts) == 4 * 4 + 2 * 2 + 2 * 4
    host1, judge1 = models.built["U1"]
    host2, judge2 = models.built["U2"]
    assert (len(host1.calls), len(judge1.calls)) == (2 * 2, 2 * 2 + 2 * 2)  # A asks on both stories; 4 answers
    assert (len(host2.calls), len(judge2.calls)) == (2 * 2, 2 * 1 + 2 * 4)


def test_agents_with_and_without_an_invalid_gym():
    """Avg/MR leave out a gym where some agent has no valid episode; per_gym says n = 0 there."""
    means = {("A", "G1"): 0.2, ("B", "G1"): 0.2, ("A", "G2"): None, ("B", "G2"): 0.9, ("A", "G3"): 0.7,
             ("B", "G3"): 0.1}
    cells = {(a, "U", g, 0): {"mean_score": m, "n_invalid": 3 if m is None else 0} for (a, g), m in means.items()}
    s = ev.summarize_matrix(cells, ["A", "B"], ["U"], ["G1", "G2", "G3"], [0])
    assert s["per_gym"]["A"]["G2"] == {"mean": None, "se": None, "n": 0} and s["invalid"]["A"]["G2"] == 3
    assert s["ranked_gyms"] == ["G1", "G3"]
    assert s["mr"] == {"A": (1.5 + 1) / 2, "B": (1.5 + 2) / 2}
    assert s["avg"]["A"] == {"mean": pytest.approx((0.2 + 0.7) / 2), "se": 0.0}
    assert s["avg"]["B"]["mean"] == pytest.approx((0.2 + 0.1) / 2)
    assert s["per_user"]["U"]["A"] == {"G1": 0.2, "G2": None, "G3": 0.7}
    assert "Avg and MR leave out ['G2']" in ev.format_table(s)


# ------------------------------------------------------------------------------------------ resume
def test_resume_reruns_exactly_the_deleted_cell(done, tmp_path):
    out, _, summary = done
    again = tmp_path / "ev"
    shutil.copytree(out, again)
    deleted = again / "cells" / "A__U2__TurtleGym__seed1.json"
    before = deleted.read_text()
    deleted.unlink()
    models = Models(again)
    assert models.run(str(again)) == summary
    assert deleted.read_text() == before
    assert sorted(models.loads) == ["A", "U2"]  # nothing else is loaded
    assert len(models.built["A"].prompts) == 1 + 2  # refused after 1 turn; 2 turns on The Cold Soup
    host, judge = models.built["U2"]
    assert (len(host.calls), len(judge.calls)) == (2, 1)
    assert json.loads((again / "summary.json").read_text()) == summary
    # a complete matrix loads nothing
    models = Models(again)
    assert models.run(str(again)) == summary and models.loads == []


def test_changed_spec_or_setting_is_an_error(done, tmp_path):
    out, _, _ = done
    again = tmp_path / "ev"
    shutil.copytree(out, again)
    models = Models(again)
    models.agents[0] = dataclasses.replace(models.agents[0], spec={**models.agents[0].spec, "spec": "other"})
    with pytest.raises(EnvError) as e:
        models.run(str(again))
    assert "agent 'A'" in str(e.value) and str(again / "matrix.json") in str(e.value)
    models = Models(again)
    models.users[1] = dataclasses.replace(models.users[1], spec={**models.users[1].spec, "style": "assistant"})
    with pytest.raises(EnvError, match="user 'U2' was evaluated with spec"):
        models.run(str(again))
    with pytest.raises(EnvError, match="setting 'max_turns' was 2 and is now 3"):
        Models(again).run(str(again), config=ev.EvalConfig(max_turns=3, batch=3))
    # a cell whose tasks are not this run's: named
    models = Models(again)
    models.tasks["FunctionGym"] = models.tasks["FunctionGym"][:1]
    with pytest.raises(EnvError, match=r"A__U1__FunctionGym__seed0\.json: its tasks \['func-10', 'func-11'\]"):
        models.run(str(again))
    assert models.loads == []
    with pytest.raises(EnvError, match="agent name 'a__b'"):
        ev.evaluate(str(tmp_path / "x"), [ev.Entry("a__b", {}, None)], models.users, models.tasks, [0])


# ------------------------------------------------------------------------------------------ command line
def test_command_on_a_finished_matrix_prints_the_table(done, tmp_path, capsys, monkeypatch):
    out, _, summary = done
    again = tmp_path / "ev"
    shutil.copytree(out, again)
    import mimesis_jax.chat.specs as specs

    def no_model(*a, **k):
        raise AssertionError("no model may be loaded for a finished matrix")
    monkeypatch.setattr(specs, "agent_from_spec", no_model)
    monkeypatch.setattr(specs, "user_and_judge", no_model)
    assert ev.run(parse(again, "--batch", "3")) == 0
    printed = capsys.readouterr().out
    assert ev.format_table(summary) in printed and "2 agent(s) x 2 user(s) x 2 gym(s) x 2 seed(s)" in printed
    assert json.loads((again / "summary.json").read_text()) == summary


@pytest.mark.parametrize("extra,needle", [
    (["--agent", "C"], "--agent 'C': expected NAME=SPEC"),
    (["--agent", "A=http://127.0.0.1:1/v1", "--agent-model", "m"], "--agent: name 'A' is given twice"),
    (["--agent", "C=http://127.0.0.1:1/v1", "--agent-model", "C=m"],
     "--agent C: a remote agent needs --agent-tokenizer"),
    (["--user", "R=http://127.0.0.1:1/v1"], "--user R: a remote model needs its served model name (--user-model)"),
    (["--agent", "C=/no/such/dir"], "--agent C: '/no/such/dir' is neither tiny"),
    (["--gyms", "ChessGym"], "--gyms: unknown gyms ['ChessGym']"),
    (["--user-style", "U1=poet"], "--user-style U1: expected simulator or assistant, got 'poet'"),
    (["--user-thinking", "U9"], "--user-thinking names unknown users ['U9']"),
    (["--agent-model", "a", "--agent-model", "b"], "--agent-model: two values for every name"),
])
def test_command_rejects_bad_input(tmp_path, capsys, extra, needle):
    assert ev.run(parse(tmp_path / "ev", *extra)) == 2
    assert needle in capsys.readouterr().err


def test_command_changed_spec_names_it(done, tmp_path, capsys):
    out, _, _ = done
    again = tmp_path / "ev"
    shutil.copytree(out, again)
    args = parse(again, "--agent-tokenizer", "A=qwen3")
    assert ev.run(args) == 2
    err = capsys.readouterr().err
    assert "agent 'A' was evaluated with spec" in err and "matrix.json" in err


def test_per_name_options():
    args = parse("x", "--agent-model", "A=served-a", "--agent-model", "served", "--user-thinking",
                 "--user-style", "U2=assistant")
    agents, users, judge = ev._entries(args)
    assert [e.spec["model_name"] for e in agents] == ["served-a", "served"]
    assert [(e.spec["thinking"], e.spec["style"]) for e in users] == [(True, "simulator"), (True, "assistant")]
    assert judge is None


@pytest.mark.slow
def test_command_end_to_end_with_tiny_models(tmp_path, capsys):
    """The tiny agent writes noise: FunctionGym answers it with invalid-action feedback, reward 0 (a valid 0)."""
    out = tmp_path / "ev"
    import argparse

    args = ev.add_args(argparse.ArgumentParser()).parse_args(
        ["--agent", "t=tiny", "--user", "u=tiny", "--gyms", "FunctionGym", "--max-tasks", "1", "--max-turns", "1",
         "--agent-max-tokens", "8", "--out", str(out)])
    assert ev.run(args) == 0
    c = cell(out, "t", "u", "FunctionGym", 0)
    assert [(e["task_id"], e["score"], e["status"]) for e in c["episodes"]] == [("func-10", 0.0, "ok")]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["per_gym"]["t"]["FunctionGym"] == {"mean": 0.0, "se": 0.0, "n": 1}
    assert summary["mr"] == {"t": 1.0} and summary["avg"]["t"] == {"mean": 0.0, "se": 0.0}
