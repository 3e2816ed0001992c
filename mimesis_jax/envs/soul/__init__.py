"""The 23 SOUL task environments (docs/reference/paper.md 3.3): the simulator is the policy; see base.py for the protocol.

The package imports every task module (one per OdysSim task folder), so each has registered its tasks before any
lookup: `task_names()` lists every task, `task_info(name)` describes one.
"""

from mimesis_jax.envs.soul.base import (ODYSSIM_ALIASES, ChoiceEnv, JudgeEnv, SoulEnv, TaskInfo,  # noqa: F401
                                        canonical_task, first_tag, load_mixed, load_records, tagged_letter,
                                        make_env, parse_choice, parse_exact, parse_score, register, sample_records,
                                        task_info, task_names)
from mimesis_jax.envs.soul import (alignx, behaviorchain, coser, fantom, hitom, humanllm, humanual,  # noqa: F401
                                   lifechoices, mirrorbench, mistakes, paratomi, sim_arena, social_r1, socsci210,
                                   sotopia, twinvoice, userllm)
