"""Tiny Stage II run with GRPO + CSD (paper §4.2, Eq 7-11): configs/tiny_agentrl_grpo.py plus the coach (the
simulator's weights asked as an assistant with the documented coach prompt) and the fused teacher/student pass.

    python -m mimesis_jax agentrl --config configs/tiny_agentrl_csd.py --workdir runs/agent_csd

alpha 0.01 and beta 5.0 as in Table 13.
"""

import dataclasses

from mimesis_jax.config import load_sibling

_grpo = load_sibling(__file__, "tiny_agentrl_grpo.py")


def get_config():
    base = _grpo.get_config()
    return base.replace(name="tiny_agentrl_csd", rl=dataclasses.replace(base.rl, alpha=0.01, beta=5.0))
