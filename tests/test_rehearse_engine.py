"""`rehearse --engine on --steps 2` (issue #43 item 4) for the Stage II CSD config at tiny width with its structure
(16 fake devices, the config's mesh: 8 data-parallel engine replicas of 2 tensor devices each), its rollouts on the
rollout engine for two steps: nothing is evicted, step 2 compiles nothing new (test_rehearse.check_engine_steps),
and the dialogues (the paper's 16-turn limit) reuse their previous turns' prefixes in both steps. The Stage I.3
config's engine check shares tests/test_rehearse.py's simrl rehearsal (`--engine both --steps 2`) instead of a run
of its own here. Own module: the run costs most of a minute of CPU."""

from __future__ import annotations

import pytest

from test_rehearse import AGENT, FP32, _rehearse, check_engine_steps


@pytest.mark.slow
def test_rehearse_agent_csd_engine_reuses_prefixes_and_compiles_nothing_in_step_2(tmp_path):
    # --tokens 64: the toy prompts keep their 72-token budget, the context and the row are 72 + 8,192 / 64 = 200
    # tokens (32-token agent turns), so a dialogue ends at the context limit after a few turns -- enough to return
    # to its cached prefix, at the structure's every program kind (prefill and decode at each page-table width)
    (rep,), stdout = _rehearse(tmp_path, AGENT, "--engine", "on", "--steps", "2", "--tokens", "64", *FP32)
    assert rep["row_len"] == rep["max_context_tokens"] == 200 and rep["max_turns"] == 16
    first, second = check_engine_steps(rep, stdout, {"data": 1, "fsdp": 8, "tensor": 2})
    # every turn after a dialogue's first starts from its cached prefix (Stage II's runner continues the
    # dialogue's tokens as sampled, episodes/agent.py)
    assert first["engine/reused_tokens"] > 0 and second["engine/reused_tokens"] > 0
