"""The shape ladder of an RL run config: the config's packing bounds (`AgentRLConfig.packing_bounds`,
`SimRLConfig.packing_bounds`: numbers) and its rung settings handed to algorithms/rl_shapes.py `shape_ladder`, which
takes numbers only. Used by the learner (`learner.run_ladder`) and the planner (plan/workload.py, plan/mix.py)."""

from __future__ import annotations

from mimesis_jax.algorithms.rl_shapes import (BRANCH_HEAD_RUNGS, HEAD_RUNGS, ROW_RUNGS, ShapeLadder,
                                              shape_ladder)


def ladder_for_config(cfg, rows_multiple: int, processes: int = 1) -> ShapeLadder | None:
    """The `ShapeLadder` of an RL run config, Stage II or Stage I.3 (one process's share of a mini-batch with
    `processes`): rows at `rollout.row_rungs` (() = `ROW_RUNGS`) of one row per dialogue, LM-head counts at
    `rollout.head_rungs` (() = `HEAD_RUNGS`: the row length) of row_len, the CSD branch heads at
    `rollout.branch_head_rungs` (Stage II). None where shapes stay on the fine ladders: rollout.row_len = 0
    (bucketed from the batch) or the naive teacher."""
    r = cfg.rollout
    if not r.row_len or (cfg.rl.alpha > 0 and cfg.rl.teacher != "fused"):
        return None
    b = cfg.packing_bounds()
    return shape_ladder(r.row_len, -(-b["dialogues"] // max(1, processes)), rows_multiple, b["branch_tokens"],
                        row_rungs=tuple(r.row_rungs or ROW_RUNGS), head_rungs=tuple(r.head_rungs or HEAD_RUNGS),
                        branch_head_rungs=tuple(r.branch_head_rungs or BRANCH_HEAD_RUNGS))
