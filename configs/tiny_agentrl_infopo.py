"""Tiny Stage II run with the InfoPO credit baseline (paper §4.3; algorithms/infopo.py): configs/tiny_agentrl_grpo.py
with rl.credit = "infopo" -- each turn's advantage adds the group-normalised, variance-gated information gain of the
feedback it drew (the follow-up turn's log-probs with the feedback observed minus masked), from one extra scoring
pass with the pre-update parameters. No CSD (alpha 0): InfoPO is the alternative credit, compared with CSD.

    python -m mimesis_jax agentrl --config configs/tiny_agentrl_infopo.py --workdir runs/agent_infopo

infopo_coef 0.5 and infopo_gate_tau 0.05 are the intrinsic weight and gate temperature of InfoPO's released code.
"""

import dataclasses

from mimesis_jax.config import load_sibling

_grpo = load_sibling(__file__, "tiny_agentrl_grpo.py")


def get_config():
    base = _grpo.get_config()
    return base.replace(name="tiny_agentrl_infopo",
                        rl=dataclasses.replace(base.rl, alpha=0.0, credit="infopo", infopo_coef=0.5,
                                               infopo_gate_tau=0.05))
