"""Stage II CSD ablation on a CPU (paper §4.2, Eq 7-11): the coach x the CSD temperature beta (Eq 9), with alpha 0.01,
on configs/tiny_agentrl.py:grpo (tiny Qwen3 agent, the toy gym's rule-based user). 4 cells x 4 RL steps.

coach=on is the informative toy coach (it names the letter the user secretly likes); coach=off keeps the CSD update
but takes the hindsight out of the notes: each dialogue gets a note written for another dialogue (toy-coach-shuffled,
the control of experiments/csd_toy.py). Removing the coach outright is alpha 0 (no notes are requested), see
tiny_agent_csd.py.

    python -m mimesis_jax ablate --matrix configs/ablations/tiny_agent_coach.py --out runs/abl_agent_coach
"""


def get_matrix():
    return {
        "name": "tiny_agent_coach",
        "stages": [("agentrl", "configs/tiny_agentrl.py:grpo")],
        "overrides": [("agentrl", "train.steps=4"), ("agentrl", "checkpoint.every=4"), ("agentrl", "rl.alpha=0.01")],
        "switches": {
            "coach": {"on": [("agentrl", "users.coach=toy-coach")],
                      "off": [("agentrl", "users.coach=toy-coach-shuffled")]},
            "beta": {"5.0": [("agentrl", "rl.beta=5.0")],
                     "1.0": [("agentrl", "rl.beta=1.0")]},
        },
    }
