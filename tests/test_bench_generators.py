"""benchmarks/bench_generators.py without vLLM and at the smallest shapes: the vLLM row is skipped with a line that
names the missing interpreter and the key, the static row makes exactly batch x new-tokens tokens, and the --paths
check names the flag. The figures themselves are in docs/vllm.md, never asserted (timed asserts fail on a busy
machine)."""

import json

import pytest

from helpers import load_benchmark



def _bench():
    return load_benchmark('bench_generators')


B = _bench()


def test_without_vllm_the_row_is_skipped_saying_why_and_the_static_row_counts_exactly(tmp_path, capsys):
    missing = str(tmp_path / "no_env" / "bin" / "python")
    out_json = tmp_path / "out.json"
    rc = B.main(["--paths", "static,vllm", "--vllm-python", missing, "--batch", "3", "--prompt-min", "4",
                 "--prompt-max", "6", "--new-tokens", "5", "--repeats", "1", "--syncs", "2", "--json",
                 str(out_json)])
    assert rc == 0
    text = capsys.readouterr().out
    assert f"vllm row skipped: config key 'rollout.vllm_python': no Python at {missing!r}" in text
    assert "engine   skipped: not asked for (--paths)" in text
    got = json.loads(out_json.read_text())
    assert set(got["rows"]) == {"static"}
    assert got["rows"]["static"]["generated"] == 3 * 5  # stop ids are off: every request runs to --new-tokens
    assert "rollout.vllm_python" in got["skipped"]["vllm"]


def test_a_python_without_vllm_is_named():
    import sys

    reason = B.vllm_skip_reason(sys.executable)
    assert reason == f"{sys.executable} does not import vllm (scripts/vllm_env.sh builds an environment that does)"


def test_paths_must_include_the_ratios_base(capsys):
    with pytest.raises(SystemExit):
        B.main(["--paths", "engine,vllm"])
    assert "--paths takes static,engine,vllm and must include static" in capsys.readouterr().err
