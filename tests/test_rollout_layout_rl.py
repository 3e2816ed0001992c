"""rollout.mesh wired into the RL loop (train/rl/chat_models.py policy_model): two tiny Stage II steps on the 8
fake devices whose policy decodes in the layout replica=4,tensor=2 sample the same dialogues (tokens exact,
log-probs to 1e-4: tensor-parallel sums round differently) and train to the same weights as the run that decodes
in the training layout; the static sampler and the engine alike."""

import numpy as np
import pytest

from rl_helpers import tree_rel_err
from test_engine_rl import ENGINE_KEYS, _agent_run, _metrics_close


@pytest.mark.parametrize("engine", ["false", "true"])
def test_a_rollout_layout_samples_and_trains_as_the_training_layout(tmp_path, engine):
    sets = [f"rollout.engine={engine}", "rollout.engine_pages=70"]
    base, seen_base, p_base = _agent_run(tmp_path / "base", *sets)
    lay, seen_lay, p_lay = _agent_run(tmp_path / "layout", *sets, "rollout.mesh=replica=4,tensor=2")
    for step in (1, 2):
        a, b = seen_base[step], seen_lay[step]
        assert [t.rollout_id for t in a] == [t.rollout_id for t in b]
        for ta, tb in zip(a, b):
            sa = [s for s in ta.segments if s.kind == "agent"]
            sb = [s for s in tb.segments if s.kind == "agent"]
            assert [s.tokens for s in sa] == [s.tokens for s in sb]
            for x, y in zip(sa, sb):
                np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=1e-4, atol=1e-4)
    _metrics_close({k: v for k, v in base.metrics[2].items() if not k.startswith(ENGINE_KEYS)}, lay.metrics[2])
    assert tree_rel_err(p_lay, p_base) < 1e-5
