"""The eight UserRL gyms (docs/reference/environments.md; SalesforceAIResearch/UserRL), in this project's own code.

    tasks = userrl.load_tasks("data/function_multiturn/train.parquet")     # or userrl.shipped_tasks("train")
    env = userrl.make_env(tasks[0], user=simulator, judge=judge_model)     # data_dir=None: the shipped gym files
    obs, info = env.reset()
    obs, reward, terminated, truncated, info = env.step("[action] 1 2 3 4")

Each gym is an `Env` (envs/agent_env.py) registered under its UserRL name; its other side (user, judge, classifier)
is any `ChatModel`. Shared machinery: common.py; task files and `make_env`: tasks.py; scores: scoring.py. The package
imports the eight gym modules, so every gym is registered before a task is built.
"""

from mimesis_jax.envs.userrl.common import DATA_DIR, TASKS_DIR, UserRLEnv, data_file  # noqa: F401
from mimesis_jax.envs.userrl.tasks import (  # noqa: F401
    EVAL_ONLY_GYMS, GYM_MODULES, TRAIN_GYMS, Task, gym_class, load_tasks, make_env, register_gym, shipped_tasks,
    task_from_row,
)
from mimesis_jax.envs.userrl import (function, intention, persuade, search, tau, telepathy, travel,  # noqa: F401
                                     turtle)
