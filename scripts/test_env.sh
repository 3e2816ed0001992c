#!/usr/bin/env bash
# Sets up what the test run needs (README "Set up and pass the tests"; .ci/run):
#   1. .venv: the project with its test extras (pip install -e '.[test]'), as before;
#   2. the vLLM environment that the tests marked `vllm` run their child processes in (scripts/vllm_env.sh), built
#      once and cached at ~/.cache/mimesis_vllm (MIMESIS_VLLM_ENV): a later run finds it and does nothing.
# The two installs run at the same time. pip installs on one core, so on a two-core machine the vLLM build (about a
# minute and a half, when it is not cached) overlaps the project's install instead of adding to it.
# A vLLM build that fails does not stop the tests: its tests skip, each saying why, and this script prints the log's
# path. MIMESIS_TEST_VLLM=0 skips the vLLM environment (its tests then skip).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
vllm_pid=""
log=.venv/vllm_env.log
if [ "${MIMESIS_TEST_VLLM:-1}" != "0" ]; then
  bash scripts/vllm_env.sh > "$log" 2>&1 &
  vllm_pid=$!
fi
.venv/bin/pip install -q -e '.[test]'
if [ -n "$vllm_pid" ]; then
  if wait "$vllm_pid"; then
    tail -n 1 "$log"
  else
    echo "test_env: the vLLM environment did not build (log: $log); the tests marked vllm will skip" >&2
  fi
fi
