"""The allowed values of the RL update's string settings, in one place below the code that implements them.

`RLConfig` (config/rl.py) checks its keys against these tuples; the functions that act on a choice import the same
tuple and name it in their own error (algorithms/grpo.py for credits, scores and loss aggregations,
train/rl/step.py `kl_estimate` for the KL estimators). config/ therefore imports nothing from algorithms/ or
train/ (docs/decisions.md, "Which way the layers run").
"""

from __future__ import annotations

CREDIT_METHODS = ("equalized", "r2g", "em")  # GRPO turn credits c_t (grpo.turn_credits)
SCORE_METHODS = ("sum", "r2g")  # trajectory scores S (grpo.trajectory_score)
LOSS_AGGS = ("token-mean", "seq-mean")  # Eq 6 reductions (grpo.loss_token_weights)
CREDITS = CREDIT_METHODS + ("infopo",)  # RLConfig.credit: "infopo" is the §4.3 baseline (algorithms/infopo.py)
KL_ESTIMATORS = ("k1", "k2", "k3")  # Schulman's per-token KL estimators (train/rl/step.py kl_estimate)
OLD_LOGPROBS = ("rollout", "recompute")  # where the update's old log-probs come from
NOTE_TOKENS = 32  # chat-template tokens around one CSD coach note plus the turn's assistant header (the packing bound)
GENERATORS = ("jax", "vllm")  # rollout.generator: who samples the policy (train/rl/chat_models.py policy_model)
