"""`rehearse --engine on --steps 2` (issue #43 item 4): the two paper RL configs at tiny width with their structure
(16 fake devices, the config's mesh: 8 data-parallel engine replicas of 2 tensor devices each), their rollouts on
the rollout engine for two steps. Every dialogue of a step stays in its replica's pool (the rehearsal's pool is
uncapped: engine_memory_gib = 0, sized per replica), so nothing is evicted; the engine compiles every program on
its first call (EngineConfig.precompile), so step 2 compiles nothing new; and the Stage II dialogues (16 turns)
reuse their previous turns' prefixes in both steps. Own module: each run costs about a minute of CPU."""

from __future__ import annotations

import pytest

from test_rehearse import AGENT, FP32, SIM, _rehearse

MESHES = {AGENT: {"data": 1, "fsdp": 8, "tensor": 2}, SIM: {"data": 2, "fsdp": 4, "tensor": 2}}


def _two_steps(tmp_path, config, *extra):
    (rep,), stdout = _rehearse(tmp_path, config, "--engine", "on", "--steps", "2", *extra, *FP32)
    assert rep["engine"] and rep["num_devices"] == 16 and rep["mesh"] == MESHES[config]
    first, second = rep["steps"]
    assert first["engine/evictions"] == second["engine/evictions"] == 0
    # step 2 compiles no new program: the run's count (every part) is step 1's
    assert second["num_compilations"] == first["num_compilations"] == sum(
        rep["compilations"][k] for k in ("rl_update", "old_logprobs", "sampler", "engine"))
    assert rep["compilations"]["sampler"] == 0 and rep["compilations"]["engine"] >= 2
    for i, s in enumerate((first, second), 1):
        assert (f"step {i}: " in stdout and f"engine reused tokens {s['engine/reused_tokens']}, evictions 0"
                in stdout)
    return first, second


@pytest.mark.slow
def test_rehearse_agent_csd_engine_reuses_prefixes_and_compiles_nothing_in_step_2(tmp_path):
    first, second = _two_steps(tmp_path, AGENT, "--tokens", "32")
    # 16-turn dialogues: every turn after the first starts from its dialogue's cached prefix
    assert first["engine/reused_tokens"] > 0 and second["engine/reused_tokens"] > 0


@pytest.mark.slow
def test_rehearse_simrl_9b_engine_evicts_nothing_and_compiles_nothing_in_step_2(tmp_path):
    first, second = _two_steps(tmp_path, SIM)
    # the rehearsal's Stage I.3 domains are single-turn (plan/rehearse.py SIM_DOMAINS): one generation per
    # rollout, so no dialogue returns with a prefix to reuse
    assert first["engine/reused_tokens"] == second["engine/reused_tokens"] == 0
