"""`report` (mimesis_jax/commands/report.py): report.md tables with the exact numbers of hand-written result folders
(training runs of each stage, evalagent summary.json, evalsim evalsim.json, ablation.json), valid PNG figures, and
errors that name the folder, file and key."""

import argparse
import json
import os

import matplotlib.image
import pytest

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.commands import report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(*argv) -> int:
    p = argparse.ArgumentParser()
    report.add_args(p)
    return report.run(p.parse_args([str(a) for a in argv]))


def _write_run(d, stage, name, records):
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "run_config.json"), "w") as f:
        json.dump({"stage": stage, "name": name}, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return str(d)


def _assert_png(path):
    with open(path, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE, path
    img = matplotlib.image.imread(path)  # decodes the whole file
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100


def _report(out):
    with open(os.path.join(out, "report.md")) as f:
        return f.read()


SIMRL = [
    {"step": 1, "loss": 0.5, "reward_mean": 0.25, "reward/hitom": 0.5, "reward/abcd_behaviour": 0.0,
     "reward_running/hitom": 0.5, "reward/behaviour/B10": 0.4, "reward/behaviour/N": 1.0, "meta_narration_rate": 0.5},
    {"step": 2, "loss": 0.25, "reward_mean": 0.5, "reward/hitom": 0.75, "reward/abcd_behaviour": 0.25,
     "reward/behaviour/B2": 0.2, "reward/behaviour/B10": 0.6, "meta_narration_rate": 0.25, "val/hitom": 0.5,
     "val/invalid": 1},
    {"step": 3, "loss": 0.125, "reward_mean": 0.75, "reward/hitom": 1.0, "reward/abcd_behaviour": 0.5,
     "reward/behaviour/B2": 0.5, "meta_narration_rate": 0.0, "lr": 3e-5, "rollouts": 16, "finite": True},
]


def test_simrl_run_curves_final_table_behaviour_bars_and_meta_narration(tmp_path):
    d = _write_run(tmp_path / "simrl_run", "simrl", "my_simrl", SIMRL)
    out = tmp_path / "out"
    assert _run(d, "--out", out) == 0
    md = _report(out)
    assert f"## `{d}`: simrl run `my_simrl`" in md
    assert "3 step records (steps 1-3)." in md
    # the final table is the last record, every key but the step, in its order
    final = md.split("### Final metrics (step 3)\n\n")[1].split("\n\n")[0].splitlines()
    assert final == ["| metric | value |", "|---|---|", "| loss | 0.1250 |", "| reward_mean | 0.7500 |",
                     "| reward/hitom | 1.0000 |", "| reward/abcd_behaviour | 0.5000 |",
                     "| reward/behaviour/B2 | 0.5000 |", "| meta_narration_rate | 0.0000 |", "| lr | 3.000e-05 |",
                     "| rollouts | 16 |", "| finite | True |"]
    # behaviour means over the steps that logged them, in B1..B13, N order: B2 (0.2+0.5)/2, B10 (0.4+0.6)/2, N 1.0
    beh = md.split("| behaviour | mean reward | steps |\n|---|---|---|\n")[1].split("\n\n")[0].splitlines()
    assert beh == ["| B2 | 0.3500 | 2 |", "| B10 | 0.5000 | 2 |", "| N | 1.0000 | 1 |"]
    # meta-narration: mean (0.5 + 0.25 + 0) / 3
    assert ("Meta-narration rate: mean 0.2500 over 3 steps; first 0.5000 (step 1), last 0.0000 (step 3)."
            in md)
    pngs = sorted(f for f in os.listdir(out) if f.endswith(".png"))
    assert pngs == ["01-simrl_run-behaviour.png", "01-simrl_run-loss.png", "01-simrl_run-reward.png",
                    "01-simrl_run-val.png"]
    for f in pngs:
        assert f"]({f})" in md
        _assert_png(os.path.join(out, f))


def test_simrl_without_behaviour_says_so_and_agentrl_gets_per_gym_curves(tmp_path):
    s = _write_run(tmp_path / "s", "simrl", "nobeh", [{"step": 1, "reward_mean": 0.5, "reward/hitom": 0.5}])
    a = _write_run(tmp_path / "a", "agentrl", "agent", [
        {"step": 1, "loss": "nan", "reward_mean": 0.1, "reward/TurtleGym": 0.2},
        {"step": 2, "loss": 0.3, "reward_mean": 0.2, "reward/TurtleGym": 0.4, "val/overall": 0.3}])
    m = _write_run(tmp_path / "m", "midtrain", "", [{"step": 10, "loss": 2.0}, {"step": 20, "loss": 1.5}])
    out = tmp_path / "out"
    assert _run(s, a, m, "--out", out) == 0
    md = _report(out)
    assert "No behaviour-task rewards were logged (no `reward/behaviour/<id>` key in metrics.jsonl)." in md
    assert "Meta-narration rate: not logged (no judged behaviour-task rollout)." in md
    assert f"## `{a}`: agentrl run `agent`" in md
    assert "| reward/TurtleGym | 0.4000 |" in md
    assert f"## `{m}`: midtrain run `m`" in md  # no name in run_config.json: the folder's name
    assert "| loss | 1.5000 |" in md and "2 step records (steps 10-20)." in md
    assert sorted(f for f in os.listdir(out) if f.endswith(".png")) == [
        "01-s-reward.png", "02-a-loss.png", "02-a-reward.png", "02-a-val.png", "03-m-loss.png"]


SUMMARY = {
    "agents": ["A", "B"], "users": ["u1", "u2"], "gyms": ["TurtleGym", "FunctionGym"], "seeds": [0, 1],
    "per_gym": {"A": {"TurtleGym": {"mean": 0.55, "se": 0.05, "n": 4}, "FunctionGym": {"mean": 0.25, "se": 0.05,
                                                                                       "n": 4}},
                "B": {"TurtleGym": {"mean": 0.45, "se": 0.05, "n": 4}, "FunctionGym": {"mean": 0.25, "se": 0.15,
                                                                                       "n": 3}}},
    "avg": {"A": {"mean": 0.4, "se": 0.15}, "B": {"mean": 0.35, "se": 0.1}},
    "mr": {"A": 1.25, "B": 1.75},
    "invalid": {"A": {"TurtleGym": 0, "FunctionGym": 0}, "B": {"TurtleGym": 2, "FunctionGym": 1}},
    "per_user": {"u1": {"A": {"TurtleGym": 0.6, "FunctionGym": 0.2}, "B": {"TurtleGym": 0.4, "FunctionGym": 0.4}},
                 "u2": {"A": {"TurtleGym": 0.5, "FunctionGym": 0.3}, "B": {"TurtleGym": 0.5, "FunctionGym": None}}},
}


def test_evalagent_tables_per_user_avg_mr_invalid_apart_and_bars(tmp_path):
    d = tmp_path / "evalagent"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(SUMMARY))
    assert _run(d) == 0  # --out defaults to the one folder
    md = _report(d)
    assert ("| agent | TurtleGym | FunctionGym |\n|---|---|---|\n"
            "| A | 0.5500 \u00b1 0.0500 (n=4) | 0.2500 \u00b1 0.0500 (n=4) |\n"
            "| B | 0.4500 \u00b1 0.0500 (n=4) | 0.2500 \u00b1 0.1500 (n=3) |") in md
    assert ("| agent | TurtleGym | FunctionGym | Avg | MR |\n|---|---|---|---|---|\n"
            "| A | 0.5500 | 0.2500 | 0.4000 \u00b1 0.1500 | 1.2500 |\n"
            "| B | 0.4500 | 0.2500 | 0.3500 \u00b1 0.1000 | 1.7500 |") in md
    # user u1, computed here: Avg A (0.6+0.2)/2 = 0.4, B (0.4+0.4)/2 = 0.4; ranks Turtle A1 B2, Function A2 B1
    u1 = md.split("### Evaluation user `u1`\n\n")[1].split("\n\n")[0].splitlines()
    assert u1[2:] == ["| A | 0.6000 | 0.2000 | 0.4000 | 1.5000 |", "| B | 0.4000 | 0.4000 | 0.4000 | 1.5000 |"]
    u2 = md.split("### Evaluation user `u2`\n\n")[1].split("### ")[0]
    # B has no FunctionGym score for u2: Avg and MR over TurtleGym alone, where A and B tie (mean rank 1.5)
    assert "| A | 0.5000 | 0.3000 | 0.5000 | 1.5000 |\n| B | 0.5000 | \u2014 | 0.5000 | 1.5000 |" in u2
    assert "No valid episode for B/FunctionGym: Avg and MR over TurtleGym." in u2
    assert ("| agent | TurtleGym | FunctionGym | total |\n|---|---|---|---|\n| A | 0 | 0 | 0 |\n"
            "| B | 2 | 1 | 3 |") in md
    assert "![per-gym scores](01-evalagent-per_gym.png)" in md
    _assert_png(d / "01-evalagent-per_gym.png")


def test_evalagent_per_user_ties_share_the_mean_rank(tmp_path):
    s = json.loads(json.dumps(SUMMARY))
    s["per_user"]["u2"]["B"]["FunctionGym"] = 0.1  # Turtle: A and B tie (1.5 each); Function: A 1, B 2
    d = tmp_path / "e"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps(s))
    assert _run(d) == 0
    u2 = _report(d).split("### Evaluation user `u2`\n\n")[1].split("\n\n")[0].splitlines()
    assert u2[2:] == ["| A | 0.5000 | 0.3000 | 0.4000 | 1.2500 |", "| B | 0.5000 | 0.1000 | 0.3000 | 1.7500 |"]


EVALSIM = {
    "simulator": "sim9b",
    "usi": {"features": {"politeness_rate": {"sim": 0.2, "human": 0.3, "dice": 0.8},
                         "repeat_rate": {"sim": 0.0, "human": 0.0, "dice": 1.0}},
            "dimensions": {"D1": 90.0, "D2": 80.0, "D3": 70.0, "D4": 60.0}, "ece": 0.1,
            "ece_bins": [{"lo": 0.0, "hi": 0.2, "n": 2, "sim_rate": 0.5, "human_rate": 0.0},
                         {"lo": 0.2, "hi": 0.4, "n": 0, "sim_rate": None, "human_rate": None},
                         {"lo": 0.4, "hi": 0.6, "n": 3, "sim_rate": 0.6666666666666666, "human_rate": 0.5},
                         {"lo": 0.6, "hi": 0.8, "n": 0, "sim_rate": None, "human_rate": None},
                         {"lo": 0.8, "hi": 1.0, "n": 5, "sim_rate": 1.0, "human_rate": 1.0}],
            "usi5": 78.0},
    "fidelity": {"dimensions": {"persona": 100.0, "style": 50.0}, "fi": 75.0},
    "turing": {"a": 62.5, "distance": 12.5, "n_pairs": 8},
    "style": {"writing": 3.5, "interaction": 4.25},
    "soul": {"tasks": {"hitom": {"mean": 40.0, "se": 5.0, "seeds": [35.0, 40.0, 45.0]}},
             "axes": {"COG": {"mean": 40.0, "se": 5.0}}, "index": {"mean": 40.0, "se": 5.0}},
}


def test_evalsim_usi_reliability_fi_turing_style_soul(tmp_path):
    d = tmp_path / "evalsim"
    d.mkdir()
    (d / "evalsim.json").write_text(json.dumps(EVALSIM))
    out = tmp_path / "out"
    assert _run(d, "--out", out) == 0
    md = _report(out)
    assert f"## `{d}`: simulator evaluation of `sim9b`" in md
    assert "| politeness_rate | 0.2000 | 0.3000 | 0.8000 |\n| repeat_rate | 0.0000 | 0.0000 | 1.0000 |" in md
    assert "| D1 | 90.0000 |\n| D2 | 80.0000 |\n| D3 | 70.0000 |\n| D4 | 60.0000 |" in md
    assert "ECE 0.1000 (lower is better); USI5 78.0000 (Eq 16)." in md
    assert "| [0.0000, 0.2000) | 2 | 0.5000 | 0.0000 |\n| [0.2000, 0.4000) | 0 | \u2014 | \u2014 |" in md
    assert "| [0.4000, 0.6000) | 3 | 0.6667 | 0.5000 |" in md
    assert "| persona | 100.0000 |\n| style | 50.0000 |\n\nFI 75.0000." in md
    assert ("Judge accuracy a = 62.5000% over 8 pairs; Turing distance |a - 50| = 12.5000 (lower is better)."
            in md)
    assert "| writing | 3.5000 |\n| interaction | 4.2500 |" in md
    assert "| hitom | 40.0000 | 5.0000 | 35.0000, 40.0000, 45.0000 |" in md
    assert "| COG | 40.0000 | 5.0000 |" in md
    assert "SOUL-Index 40.0000 \u00b1 5.0000 (mean over tasks)." in md
    assert "![reliability diagram](01-evalsim-reliability.png)" in md
    _assert_png(out / "01-evalsim-reliability.png")


def test_evalsim_nulls_and_invalid_counts_apart(tmp_path):
    d = tmp_path / "e"
    d.mkdir()
    (d / "evalsim.json").write_text(json.dumps({
        "simulator": "s",
        "fidelity": {"dimensions": {}, "fi": None, "n_cases": 0, "n_invalid": 3, "invalid": []},
        "turing": {"a": None, "distance": None, "n_pairs": 0, "n_invalid": 2, "invalid": []},
        "soul": {"tasks": {"hitom": {"mean": 45.0, "se": 5.0, "seeds": [40.0, None, 50.0]}}, "axes": {},
                 "index": None, "excluded_tasks": ["hitom"]}}))
    assert _run(d) == 0
    md = _report(d)
    assert "FI \u2014 over 0 valid cases.\n\nINVALID cases (judge answer unusable, excluded" in md
    assert "): 3." in md and "): 2." in md
    assert "Judge accuracy a = \u2014% over 0 pairs; Turing distance |a - 50| = \u2014" in md
    assert "| hitom | 45.0000 | 5.0000 | 40.0000, \u2014, 50.0000 |" in md
    assert "SOUL-Index: not computed (no task has a score for every seed)." in md
    assert "Left out of the axes and the index (a seed without a valid rollout): hitom." in md


def test_evalsim_with_only_some_sections(tmp_path):
    d = tmp_path / "e"
    d.mkdir()
    (d / "evalsim.json").write_text(json.dumps({"simulator": "s", "turing": {"a": 50.0, "distance": 0.0,
                                                                             "n_pairs": 2}}))
    assert _run(d) == 0
    md = _report(d)
    assert "Turing distance |a - 50| = 0.0000" in md and "User-Sim Index" not in md and "SOUL" not in md


def test_ablation_cells_by_final_metrics_and_curves(tmp_path):
    wd1 = _write_run(tmp_path / "w1", "agentrl", "a", [{"step": 1, "reward_mean": 0.1},
                                                       {"step": 2, "reward_mean": 0.3}])
    wd2 = _write_run(tmp_path / "w2", "agentrl", "b", [{"step": 1, "reward_mean": 0.2}])
    d = tmp_path / "abl"
    d.mkdir()
    doc = {"matrix": "m", "switches": ["alpha"], "cells": [
        {"name": "alpha=0", "settings": {"alpha": "0"}, "workdirs": {"agentrl": wd1}, "status": "done",
         "final": {"step": 2, "reward_mean": 0.3, "reward_mean_last3": 0.2, "coach_notes": 0}},
        {"name": "alpha=0.01", "settings": {"alpha": "0.01"}, "workdirs": {"agentrl": wd2}, "status": "failed",
         "error": "agentrl: non-finite loss", "final": {}},
    ]}
    (d / "ablation.json").write_text(json.dumps(doc))
    assert _run(d) == 0
    md = _report(d)
    assert ("| cell | alpha | status | step | reward_mean_last3 | reward_mean |\n|---|---|---|---|---|---|\n"
            "| alpha=0 | 0 | done | 2 | 0.2000 | 0.3000 |\n"
            "| alpha=0.01 | 0.01 | failed: agentrl: non-finite loss | \u2014 | \u2014 | \u2014 |") in md
    assert ("| metric | alpha=0 | alpha=0.01 |\n|---|---|---|\n| reward_mean | 0.3000 | \u2014 |\n"
            "| reward_mean_last3 | 0.2000 | \u2014 |\n| coach_notes | 0 | \u2014 |") in md
    assert "![m reward_mean](01-abl-reward_mean.png)" in md
    _assert_png(d / "01-abl-reward_mean.png")


# ------------------------------------------------------------------------------------------ errors
def test_errors_name_the_folder_file_and_key(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _run(empty) == 2
    assert f"{empty}: not a result folder" in capsys.readouterr().err
    assert _run(tmp_path / "nope") == 2
    assert f"{tmp_path / 'nope'}: no such directory" in capsys.readouterr().err

    half = tmp_path / "half"
    half.mkdir()
    (half / "metrics.jsonl").write_text('{"step": 1}\n')
    with pytest.raises(EnvError, match=r"half: a training run folder needs run_config.json"):
        report.write_report([str(half)], str(tmp_path / "o"))

    bad = _write_run(tmp_path / "bad", "simrl", "x", [{"step": 1}])
    with open(os.path.join(bad, "metrics.jsonl"), "a") as f:
        f.write("{not json\n")
    with pytest.raises(EnvError, match=r"bad/metrics.jsonl:2: not a JSON record"):
        report.write_report([bad], str(tmp_path / "o"))
    nostep = _write_run(tmp_path / "nostep", "simrl", "x", [{"loss": 1.0}])
    with pytest.raises(EnvError, match=r"nostep/metrics.jsonl:1: field 'step' must be an integer"):
        report.write_report([nostep], str(tmp_path / "o"))
    stage = _write_run(tmp_path / "stage", "pretrain", "x", [{"step": 1}])
    with pytest.raises(EnvError, match=r"stage/run_config.json: key 'stage' must be one of"):
        report.write_report([stage], str(tmp_path / "o"))

    ea = tmp_path / "ea"
    ea.mkdir()
    s = json.loads(json.dumps(SUMMARY))
    del s["per_gym"]["B"]["FunctionGym"]["se"]
    (ea / "summary.json").write_text(json.dumps(s))
    with pytest.raises(EnvError, match=r"ea/summary.json: per_gym.B.FunctionGym: missing key 'se'"):
        report.write_report([str(ea)], str(tmp_path / "o"))
    es = tmp_path / "es"
    es.mkdir()
    (es / "evalsim.json").write_text(json.dumps({"simulator": "s"}))
    with pytest.raises(EnvError, match=r"es/evalsim.json: none of the sections"):
        report.write_report([str(es)], str(tmp_path / "o"))

    ok = _write_run(tmp_path / "ok", "sft", "x", [{"step": 1, "loss": 1.0}])
    assert _run(ok, ok) == 2
    assert "--out is required with more than one RUN_DIR" in capsys.readouterr().err
