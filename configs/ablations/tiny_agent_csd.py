"""Stage II ablation on a CPU (paper §4.1-4.2): the CSD weight alpha of Eq 11 (0 = plain GRPO vs 0.01, Table 13)
x the turn credit (Equalized, the default, vs discounted return-to-go R2G, gamma 0.8), on configs/tiny_agentrl.py:grpo
(tiny Qwen3 agent, the toy gym's rule-based user and coach; beta 5.0). 4 cells x 4 RL steps.

    python -m mimesis_jax ablate --matrix configs/ablations/tiny_agent_csd.py --out runs/abl_agent_csd
"""


def get_matrix():
    return {
        "name": "tiny_agent_csd",
        "stages": [("agentrl", "configs/tiny_agentrl.py:grpo")],
        "overrides": [("agentrl", "train.steps=4"), ("agentrl", "checkpoint.every=4")],
        "switches": {
            "alpha": {"0": [("agentrl", "rl.alpha=0.0")],
                      "0.01": [("agentrl", "rl.alpha=0.01")]},
            "credit": {"equalized": [("agentrl", "rl.credit=equalized")],
                       "r2g": [("agentrl", "rl.credit=r2g")]},
        },
    }
