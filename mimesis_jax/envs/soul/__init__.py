"""The 23 SOUL task environments (paper.md 3.3): the simulator is the policy; see base.py for the protocol.

Task modules are imported on first use: `task_names()` lists every task, `task_info(name)` describes one.
"""

# One module per OdysSim task folder; importing a module registers its task(s).
TASK_MODULES = (
    "fantom", "hitom", "paratomi", "lifechoices", "mistakes", "twinvoice", "socsci210", "alignx", "behaviorchain",
    "social_r1", "coser", "sotopia", "mirrorbench", "userllm", "humanllm", "sim_arena", "humanual",
)

from mimesis_jax.envs.soul.base import (ChoiceEnv, JudgeEnv, SoulEnv, TaskInfo, load_records, make_env,  # noqa: F401
                                        parse_choice, parse_exact, parse_score, register, sample_records, task_info,
                                        task_names)
