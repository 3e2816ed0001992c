"""The 23 SOUL task environments (docs/reference/paper.md 3.3): the simulator is the policy; see base.py for the protocol.

Task modules are imported on first use: `task_names()` lists every task, `task_info(name)` describes one.
"""

from mimesis_jax.envs.soul.base import (ODYSSIM_ALIASES, TASK_MODULES, ChoiceEnv, JudgeEnv, SoulEnv, TaskInfo,  # noqa: F401
                                        canonical_task, first_tag, load_mixed, load_records, tagged_letter,
                                        make_env, parse_choice, parse_exact, parse_score, register, sample_records,
                                        task_info, task_names)
