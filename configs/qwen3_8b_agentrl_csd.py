"""Stage II at paper scale with GRPO + CSD (paper §4.2, Table 13): configs/qwen3_8b_agentrl_grpo.py plus
coached on-policy self-distillation -- alpha 0.01, beta 5.0 -- with the frozen simulator as the coach (the
documented coach prompt, algorithms/csd.py) and the fused teacher/student pass. The "CSD" row of Table 2.

    python -m mimesis_jax agentrl --config configs/qwen3_8b_agentrl_csd.py --workdir runs/agent_csd \\
        --set init.from_hf=/models/Qwen3-8B users.simulator=http://sim-host:8000/v1
"""

import dataclasses

from mimesis_jax.config import load_sibling

_grpo = load_sibling(__file__, "qwen3_8b_agentrl_grpo.py")


def get_config():
    base = _grpo.get_config()
    return base.replace(name="qwen3_8b_agentrl_csd", rl=dataclasses.replace(base.rl, alpha=0.01, beta=5.0))
