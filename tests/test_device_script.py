"""The accelerator figures' tools run on a CPU at tiny sizes: benchmarks/bench_engine_decode.py (its last line is
what scripts/device_figures.sh and the issue report read) and, marked slow, the whole scripts/device_figures.sh
with TINY=1: every step to the end, its files and its summary's figures recomputed from the steps' own JSON. No
timing is asserted: only facts that hold on any machine."""

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "bench_engine_decode.py")
SCRIPT = os.path.join(ROOT, "scripts", "device_figures.sh")
STEPS = ("grpo", "csd", "engine", "memory", "sampler")
LAST = re.compile(r"engine decode: (?P<eng>[\d.]+) tok/s at batch (?P<batch>\d+) \(sampler\.generate: "
                  r"(?P<base>[\d.]+) tok/s, ratio (?P<ratio>[\d.]+)x; decode only (?P<dec>[\d.]+) tok/s; "
                  r"slot use (?P<use>\d+)%\)$")


def _env():
    # One CPU device: the engine runs on one device.
    return subprocess_env(PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _bench(tmp_path, *extra):
    out = tmp_path / "engine.json"
    proc = subprocess.run([sys.executable, BENCH, "--tiny", *extra, "--json", str(out)], capture_output=True,
                          text=True, env=_env(), cwd=ROOT, timeout=300)
    return proc, out


def test_engine_decode_bench_bad_arguments(tmp_path):
    proc, _ = _bench(tmp_path, "--prompt-min", "30", "--prompt-max", "10")
    assert proc.returncode == 2
    assert "--prompt-max (10) must be >= --prompt-min (30)" in proc.stderr
    proc = subprocess.run([sys.executable, BENCH, "--config", os.path.join(ROOT, "configs", "qwen3_1b_device.py"),
                           "--set", "model.no_such_key=1", "--batch", "2"], capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=300)
    assert proc.returncode != 0
    assert "model.no_such_key" in proc.stderr


@pytest.mark.slow
def test_device_script_tiny_runs_every_step(tmp_path):
    """`TINY=1 scripts/device_figures.sh` (one profiled step each) runs its five steps to the end and writes what a
    lent device's run would bring back; its summary's figures are those of the steps' own outputs."""
    out = tmp_path / "out"
    env = subprocess_env(PYTHON=sys.executable, OUT=str(out), TINY="1", STEPS="1", TMPDIR=str(tmp_path),
                         PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    # at most 8 files come back from a lent machine
    assert files == sorted(["device_figures.log", "grpo_summary.json", "csd_summary.json", "engine.json",
                            "rehearse.json", "sampler.txt", "figures.txt"])
    log = (out / "device_figures.log").read_text()
    for step in STEPS:
        assert re.search(rf"\] {step}: exit 0 after \d+s$", log, re.M), step
    figures = (out / "figures.txt").read_text()

    def load(name):
        with open(out / name) as f:
            return json.load(f)

    grpo, csd = load("grpo_summary.json"), load("csd_summary.json")
    assert grpo["steps"] == csd["steps"] == 1 and grpo["backend"] == csd["backend"] == "cpu"
    assert grpo["batch"]["teacher_tokens"] == 0 < csd["batch"]["teacher_tokens"]
    assert grpo["batch"]["row_len"] == csd["batch"]["row_len"] == 256
    ratio = csd["step_time_s"]["median"] / grpo["step_time_s"]["median"]
    assert f"CSD step / GRPO step at {csd['batch']['turns']} turns (median step times; target <= 1.15x): " \
           f"{ratio:.3f}x" in figures
    eng = load("engine.json")
    # the engine step's last line, as the issue report reads it, carries the JSON's figures
    (last,) = [m for m in map(LAST.match, log.splitlines()) if m]
    assert int(last["batch"]) == eng["batch"] == 64
    assert float(last["eng"]) == pytest.approx(eng["engine_tok_s"], abs=0.06)
    assert float(last["ratio"]) == pytest.approx(eng["engine_tok_s"] / eng["sampler_tok_s"], abs=0.01)
    # every request decodes the same number of tokens on both paths (no stop id), and in fp32 at tiny sizes the
    # engine draws the sampler's tokens from the same per-request seeds (inference/engine.py: token-exact, same keys)
    assert eng["engine_generated"] == eng["sampler_generated"] and eng["engine_generated"] % 64 == 0
    assert eng["identical_samples"] == 64 and "identical samples: 64/64 requests" in log
    assert f"engine decode at batch 64: {eng['engine_tok_s']:.0f} tok/s" in figures
    (rep,) = load("rehearse.json")["reports"]
    assert rep["num_devices"] == 1 and rep["dtype"] == "bfloat16" and rep["csd"] and rep["programs"]
    assert {p["program"] for p in rep["programs"]} == {"rl_update", "sampler"}
    for p in rep["programs"]:
        assert f"ratio {p['plan_bytes'] / p['compiled_bytes']:.3f}" in figures
    sampler = (out / "sampler.txt").read_text()
    (line,) = [x.strip() for x in sampler.splitlines() if x.startswith("ratio sampler / reference:")]
    assert f"sampler against the plain decode loop (goal <= 1.1): {line}" in figures
    # no compilation after the warm-up, on either path
    rounds = [x for x in sampler.splitlines() if x.strip().startswith("round ")]
    assert len(rounds) == 2 and all(x.endswith("compilations: sampler 0, reference 0") for x in rounds)
