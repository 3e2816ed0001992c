"""`ablate` (mimesis_jax/commands/ablate.py): --dry-run lists every cell's stages with their exact overrides for the
shipped matrices (chain, shared stages, stages switched off); a real 2-cell x 1-stage tiny agent RL grid writes
ablation.json with each cell's final metrics read from its metrics.jsonl, and a rerun does not rerun finished
cells; failing stages mark their cells; bad matrices and --set items are errors naming the switch / stage / key."""

import argparse
import json
import os
import re
import textwrap

import pytest

from mimesis_jax.commands import ablate
from mimesis_jax.errors import ConfigError
from mimesis_jax.train.rl import agent as agent_rl_loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATRICES = os.path.join(ROOT, "configs", "ablations")


def _args(*argv):
    p = argparse.ArgumentParser()
    ablate.add_args(p)
    return p.parse_args([str(a) for a in argv])


def _plan(name, out, sets=()):
    return ablate.plan(ablate.load_matrix(os.path.join(MATRICES, name)), str(out), sets)


def _write_matrix(path, body: str):
    path.write_text(textwrap.dedent(body))
    return str(path)


# ------------------------------------------------------------------------------------------ dry runs
def test_dry_run_tiny_agent_csd_lists_cells_and_exact_overrides(tmp_path):
    out = tmp_path / "abl"
    lines = []
    assert ablate.run(_args("--matrix", os.path.join(MATRICES, "tiny_agent_csd.py"), "--out", out, "--dry-run"),
                      log=lines.append) == 0
    assert not out.exists()  # nothing is run or written
    cells = _plan("tiny_agent_csd.py", out)
    assert [(c.name, c.settings) for c in cells] == [
        ("alpha=0,credit=equalized", {"alpha": "0", "credit": "equalized"}),
        ("alpha=0,credit=r2g", {"alpha": "0", "credit": "r2g"}),
        ("alpha=0.01,credit=equalized", {"alpha": "0.01", "credit": "equalized"}),
        ("alpha=0.01,credit=r2g", {"alpha": "0.01", "credit": "r2g"})]
    base = ("train.steps=4", "checkpoint.every=4")
    for c, (a, cr) in zip(cells, [("0.0", "equalized"), ("0.0", "r2g"), ("0.01", "equalized"), ("0.01", "r2g")]):
        (r,) = c.stages
        assert (r.stage, r.config) == ("agentrl", "configs/tiny_agentrl.py:grpo")
        assert r.overrides == base + (f"rl.alpha={a}", f"rl.credit={cr}")
        assert os.path.dirname(r.workdir) == str(out / "stages")
    assert len({c.stages[0].workdir for c in cells}) == 4
    assert lines[0] == (f"matrix tiny_agent_csd ({os.path.join(MATRICES, 'tiny_agent_csd.py')}): 4 cells over "
                        "switches alpha, credit; 4 distinct stage runs")
    assert lines[1:3] == ["[1/4] alpha=0,credit=equalized",
                          f"  python -m mimesis_jax agentrl --config configs/tiny_agentrl.py:grpo --workdir "
                          f"{cells[0].stages[0].workdir} --set train.steps=4 checkpoint.every=4 rl.alpha=0.0 "
                          "rl.credit=equalized"]
    assert len(lines) == 1 + 4 * 2


def test_dry_run_tiny_agent_coach_switches_coach_and_beta(tmp_path):
    cells = _plan("tiny_agent_coach.py", tmp_path)
    assert [c.stages[0].overrides[3:] for c in cells] == [
        ("users.coach=toy-coach", "rl.beta=5.0"), ("users.coach=toy-coach", "rl.beta=1.0"),
        ("users.coach=toy-coach-shuffled", "rl.beta=5.0"), ("users.coach=toy-coach-shuffled", "rl.beta=1.0")]
    assert all(c.stages[0].overrides[:3] == ("train.steps=4", "checkpoint.every=4", "rl.alpha=0.01") for c in cells)
    assert ablate.run(_args("--matrix", os.path.join(MATRICES, "tiny_agent_coach.py"), "--out", tmp_path,
                            "--dry-run"), log=lambda *a: None) == 0


def test_dry_run_tiny_stage1_chains_shares_and_switches_off_midtraining(tmp_path):
    cells = _plan("tiny_stage1.py", tmp_path, ["simrl:train.steps=2", "train.progress_bar=false"])
    assert [c.name for c in cells] == ["midtrain=on,behaviour=on", "midtrain=on,behaviour=off",
                                       "midtrain=off,behaviour=on", "midtrain=off,behaviour=off"]
    assert [[r.stage for r in c.stages] for c in cells] == [["midtrain", "sft", "simrl"]] * 2 + [["sft", "simrl"]] * 2
    (mid, sft, sim), (mid2, sft2, sim2), (sft3, sim3), (sft4, sim4) = (c.stages for c in cells)
    assert mid.overrides == ("train.steps=20", "optimizer.warmup_steps=2", "checkpoint.every=20",
                             "train.progress_bar=false")
    assert sft.overrides == ("train.steps=6", "optimizer.warmup_steps=1", "checkpoint.every=6",
                             "train.progress_bar=false", "init.from_hf=", f"init.from_workdir={mid.workdir}")
    assert sim.overrides == ("train.steps=3", "checkpoint.every=3", "domains.behaviour=true", "train.steps=2",
                             "train.progress_bar=false", "init.from_hf=", f"init.from_workdir={sft.workdir}")
    assert sim2.overrides[2] == "domains.behaviour=false"
    # without mid-training SFT keeps the tiny config's own (random) initialisation: no chain
    assert sft3.overrides == ("train.steps=6", "optimizer.warmup_steps=1", "checkpoint.every=6",
                              "train.progress_bar=false")
    assert sim3.overrides[-1] == f"init.from_workdir={sft3.workdir}"
    # shared prefixes share workdirs; every other stage run is distinct: 1 midtrain + 2 sft + 4 simrl
    assert (mid.workdir, sft.workdir) == (mid2.workdir, sft2.workdir) and sft3.workdir == sft4.workdir
    assert len({sft.workdir, sft3.workdir, sim.workdir, sim2.workdir, sim3.workdir, sim4.workdir}) == 6


def test_dry_run_paper_appendix_c_matrix(tmp_path):
    lines = []
    assert ablate.run(_args("--matrix", os.path.join(MATRICES, "mimesis_9b_appendix_c.py"), "--out", tmp_path,
                            "--dry-run"), log=lines.append) == 0
    assert "4 cells over switches midtrain, thoughttrace, behaviour; 7 distinct stage runs" in lines[0]
    cells = _plan("mimesis_9b_appendix_c.py", tmp_path)
    assert [c.name for c in cells] == ["midtrain=on,thoughttrace=on,behaviour=on",
                                       "midtrain=off,thoughttrace=on,behaviour=on",
                                       "midtrain=on,thoughttrace=off,behaviour=on",
                                       "midtrain=on,thoughttrace=on,behaviour=off"]
    full, nomid, nott, nobeh = (c.stages for c in cells)
    assert [r.config for r in full] == ["configs/mimesis_midtrain.py:9b", "configs/mimesis_sft.py:9b",
                                        "configs/mimesis_simrl.py:9b"]
    assert full[0].overrides == ()
    assert full[2].overrides == ("domains.behaviour=true", "init.from_hf=", f"init.from_workdir={full[1].workdir}")
    # no mid-training: SFT starts from the pretrained checkpoint; the chain replaces the switch's simrl init
    assert [r.stage for r in nomid] == ["sft", "simrl"]
    assert nomid[0].overrides == ("init.from_workdir=", "init.from_hf=checkpoints/Qwen3.5-9B")
    assert nomid[1].overrides == ("domains.behaviour=true", "init.from_hf=", f"init.from_workdir={nomid[0].workdir}")
    # no ThoughtTrace: RL right after mid-training
    assert [r.stage for r in nott] == ["midtrain", "simrl"]
    assert nott[1].overrides[-1] == f"init.from_workdir={full[0].workdir}"
    assert [r.workdir for r in nobeh[:2]] == [r.workdir for r in full[:2]]
    assert nobeh[2].overrides[0] == "domains.behaviour=false"


def test_agentrl_after_a_simulator_stage_gets_it_as_the_user(tmp_path):
    m = _write_matrix(tmp_path / "m.py", """
        def get_matrix():
            return {"stages": [("simrl", "configs/tiny_simrl.py"), ("agentrl", "configs/tiny_agentrl.py:csd")],
                    "switches": {"sim": {"on": [], "off": [("simrl", "off")]}}}
    """)
    lines = []
    assert ablate.run(_args("--matrix", m, "--out", tmp_path / "o", "--dry-run"), log=lines.append) == 0
    on, off = ablate.plan(ablate.load_matrix(m), str(tmp_path / "o"))
    assert on.stages[1].overrides == (f"users.simulator={on.stages[0].workdir}",)
    assert off.stages[0].overrides == () and off.stages[0].stage == "agentrl"
    assert lines[0].startswith("matrix m (")  # the name defaults to the file's


# ------------------------------------------------------------------------------------------ a real grid
GRID = """
    def get_matrix():
        return {{
            "name": "grid",
            "stages": [("agentrl", "configs/tiny_agentrl.py:grpo")],
            "overrides": [("agentrl", o) for o in (
                "train.steps=1", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.mini_batch_prompts=2",
                "rollout.agent_max_tokens=8", "rollout.row_len=256", "checkpoint.async_save=false",
                "train.progress_bar=false", "train.tensorboard=false")],
            "switches": {{"alpha": {{"0": [("agentrl", "rl.alpha=0.0")], "0.01": [("agentrl", "rl.alpha=0.01")]}}}},
            {cells}
        }}
"""


def _records(workdir):
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_real_grid_final_metrics_resume_and_no_rerun(tmp_path, monkeypatch):
    out = tmp_path / "abl"
    calls = []
    real_run = agent_rl_loop.run

    def counted(cfg, workdir, **kw):
        calls.append(workdir)
        return real_run(cfg, workdir, **kw)

    monkeypatch.setattr(agent_rl_loop, "run", counted)
    # an interrupted grid: only the alpha=0 cell was run
    first = _write_matrix(tmp_path / "first.py", GRID.format(cells='"cells": [{"alpha": "0"}],'))
    assert ablate.run(_args("--matrix", first, "--out", out), log=lambda *a: None) == 0
    assert len(calls) == 1
    # the whole grid: the alpha=0 cell's stage is the same run (same config and overrides): not rerun
    grid = _write_matrix(tmp_path / "grid.py", GRID.format(cells=""))
    lines = []
    assert ablate.run(_args("--matrix", grid, "--out", out), log=lines.append) == 0
    assert len(calls) == 2
    with open(out / "ablation.json") as f:
        doc = json.load(f)
    assert doc["matrix"] == "grid" and doc["switches"] == ["alpha"]
    assert [c["name"] for c in doc["cells"]] == ["alpha=0", "alpha=0.01"]
    for c, label, alpha in zip(doc["cells"], ("0", "0.01"), (0.0, 0.01)):
        wd = c["workdirs"]["agentrl"]
        assert c["status"] == "done" and c["settings"] == {"alpha": label}
        with open(os.path.join(wd, "run_config.json")) as f:
            assert json.load(f)["rl"]["alpha"] == alpha
        recs = _records(wd)
        assert len(recs) == 1
        assert c["final"] == {**recs[-1], "reward_mean_last3": recs[-1]["reward_mean"]}
    assert calls == [doc["cells"][0]["workdirs"]["agentrl"], doc["cells"][1]["workdirs"]["agentrl"]]
    assert any("already has its checkpoint at train.steps=1; not rerun" in line for line in lines)
    with open(out / "report.md") as f:
        md = f.read()
    f0 = doc["cells"][0]["final"]
    assert f"| alpha=0 | 0 | done | 1 | {f0['reward_mean']:.4f} | {f0['reward_mean']:.4f} | " in md

    # rerunning the finished grid runs nothing and leaves the metrics as they were
    before = [_records(c["workdirs"]["agentrl"]) for c in doc["cells"]]
    assert ablate.run(_args("--matrix", grid, "--out", out), log=lambda *a: None) == 0
    assert len(calls) == 2
    assert [_records(c["workdirs"]["agentrl"]) for c in doc["cells"]] == before
    with open(out / "ablation.json") as f:
        assert json.load(f)["cells"] == doc["cells"]


class _Result:
    preempted = False


def test_failed_stage_marks_its_cell_and_the_others_still_run(tmp_path, monkeypatch):
    """Stage functions replaced by fakes that write metrics.jsonl: the final metrics are the last record plus
    reward_mean_last3 = mean of the last 3 reward_mean values."""
    from mimesis_jax.train.loop import NonFiniteLossError

    def fake(cfg, workdir, **kw):
        if cfg.rl.alpha > 0:
            raise NonFiniteLossError("step 1: non-finite loss nan")
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            for step, r in enumerate((0.1, 0.2, 0.3, 0.6), 1):
                f.write(json.dumps({"step": step, "reward_mean": r, "loss": -r}) + "\n")
        return _Result()

    monkeypatch.setattr(agent_rl_loop, "run", fake)
    grid = _write_matrix(tmp_path / "grid.py", GRID.format(cells=""))
    out = tmp_path / "abl"
    lines = []
    assert ablate.run(_args("--matrix", grid, "--out", out), log=lines.append) == 1
    doc = json.loads((out / "ablation.json").read_text())
    ok, bad = doc["cells"]
    assert ok["status"] == "done"
    assert ok["final"] == {"step": 4, "reward_mean": 0.6, "loss": -0.6, "reward_mean_last3": (0.2 + 0.3 + 0.6) / 3}
    assert bad["status"] == "failed" and bad["final"] == {}
    assert bad["error"] == "agentrl: step 1: non-finite loss nan"
    assert lines[-1] == "ablate: failed cells: alpha=0.01"
    assert "| alpha=0.01 | 0.01 | failed: agentrl: step 1: non-finite loss nan |" in (out / "report.md").read_text()


def test_a_signal_stops_the_grid_with_later_cells_pending(tmp_path, monkeypatch):
    class Preempted:
        preempted = True

    def fake(cfg, workdir, **kw):
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
            f.write(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
        return Preempted()

    monkeypatch.setattr(agent_rl_loop, "run", fake)
    out = tmp_path / "abl"
    lines = []
    assert ablate.run(_args("--matrix", _write_matrix(tmp_path / "g.py", GRID.format(cells="")), "--out", out),
                      log=lines.append) == 0
    doc = json.loads((out / "ablation.json").read_text())
    assert [(c["status"], c["final"]) for c in doc["cells"]] == [("pending", {}), ("pending", {})]
    assert lines[-1].startswith("ablate: stopped by a signal; rerun the same command to resume")


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("body, message", [
    ('{"stages": [("agentrl", "configs/tiny_agentrl.py:grpo")], "switches": {"alpha": {"0": []}},'
     ' "cells": [{"alpha": "0", "beta": "1"}]}', r"cells\[0\]: unknown switch 'beta'"),
    ('{"stages": [("agentrl", "configs/tiny_agentrl.py:grpo")],'
     ' "switches": {"alpha": {"0": [("agentr", "rl.alpha=0.0")]}}}',
     r"switch 'alpha' value '0'\[0\]: unknown stage 'agentr' \(the matrix's stages: agentrl\)"),
    ('{"stages": [("pretrain", "configs/tiny_midtrain.py")]}', r"stages\[0\]: unknown stage 'pretrain'"),
    ('{"stages": [("sft", "configs/tiny_sft.py"), ("midtrain", "configs/tiny_midtrain.py")]}',
     r"must be distinct and in the order midtrain, sft, simrl, agentrl"),
    ('{"stages": [("agentrl", "configs/tiny_agentrl.py:grpo")], "switches": {"alpha": {"0": []}},'
     ' "cells": [{"alpha": "1"}]}', r"cells\[0\]: switch 'alpha' has no value '1' \(values: 0\)"),
    ('{"stages": [("agentrl", "configs/tiny_agentrl.py:grpo")], "switch": {}}', r"unknown key\(s\) \['switch'\]"),
    ('{"stages": [("agentrl", "configs/tiny_agentrl.py:grpo")], "switches": {"x": {"a": [("agentrl", "off")]}}}',
     r"cell x=a turns off every stage"),
])
def test_bad_matrix_errors_name_it(tmp_path, capsys, body, message):
    m = _write_matrix(tmp_path / "bad.py", f"def get_matrix():\n    return {body}\n")
    assert ablate.run(_args("--matrix", m, "--out", tmp_path / "o", "--dry-run")) == 2
    err = capsys.readouterr().err
    assert f"{m}" in err
    assert re.search(message, err), err


def test_bad_set_and_bad_override_key_name_them(tmp_path, capsys):
    m = os.path.join(MATRICES, "tiny_agent_csd.py")
    assert ablate.run(_args("--matrix", m, "--out", tmp_path, "--dry-run", "--set", "foo:train.steps=2")) == 2
    assert "--set 'foo:train.steps=2': unknown stage 'foo' (the matrix's stages: agentrl)" in capsys.readouterr().err
    assert ablate.run(_args("--matrix", m, "--out", tmp_path, "--dry-run", "--set", "rl.alfa=1")) == 2
    assert "unknown key 'rl.alfa'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"--matrix .*nope.py: no such file"):
        ablate.load_matrix(str(tmp_path / "nope.py"))
    assert not os.path.exists(tmp_path / "stages")
