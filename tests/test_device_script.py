"""The accelerator figures' tools run on a CPU at tiny sizes: benchmarks/bench_engine_decode.py (its last line is
what scripts/device_figures.sh and the issue report read) and, marked slow, the whole scripts/device_figures.sh
with TINY=1. No timing is asserted: only facts that hold on any machine."""

import json
import os
import re
import subprocess
import sys

import pytest

from helpers import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks", "bench_engine_decode.py")
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


def test_engine_decode_bench_tiny(tmp_path):
    batch, new = 8, 6
    proc, out = _bench(tmp_path, "--batch", str(batch), "--new-tokens", str(new), "--prompt-min", "8",
                       "--prompt-max", "20", "--prefill-chunk", "16", "--prefill-rows", "4", "--decode-steps", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    m = LAST.match(last)
    assert m, last
    assert int(m["batch"]) == batch
    eng, base = float(m["eng"]), float(m["base"])
    assert eng > 0 and base > 0 and 0 <= int(m["use"]) <= 100
    assert float(m["ratio"]) == pytest.approx(eng / base, abs=0.01)
    with open(out) as f:
        r = json.load(f)
    # every request decodes exactly --new-tokens tokens on both paths (no stop id), and in fp32 the engine draws
    # the sampler's tokens from the same per-request seeds (rollout/engine.py: token-exact, same keys)
    assert r["engine_generated"] == r["sampler_generated"] == batch * new
    assert r["identical_samples"] == batch
    assert r["engine_tok_s"] == pytest.approx(eng, abs=0.06) and r["sampler_tok_s"] == pytest.approx(base, abs=0.06)
    # the decode-only figure counts the continuation call's tokens: new - 1 per request
    assert r["engine_decode_only_tok_s"] > 0
    assert f"identical samples: {batch}/{batch} requests" in proc.stdout


def test_engine_decode_bench_bad_arguments(tmp_path):
    proc, _ = _bench(tmp_path, "--prompt-min", "30", "--prompt-max", "10")
    assert proc.returncode == 2
    assert "--prompt-max (10) must be >= --prompt-min (30)" in proc.stderr
    proc = subprocess.run([sys.executable, BENCH, "--config", os.path.join(ROOT, "configs", "qwen3_1b_device.py"),
                           "--set", "model.no_such_key=1", "--batch", "2"], capture_output=True, text=True,
                          env=_env(), cwd=ROOT, timeout=300)
    assert proc.returncode != 0
    assert "model.no_such_key" in proc.stderr
