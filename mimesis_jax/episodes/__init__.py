"""Episode runners: an agent or a simulator policy played against an environment, turn by turn.

The floor above `envs/` (the environments), `inference/` (generation) and `chat/` (chat models): `agent.py` runs
Stage II episodes (the agent is the policy, envs/agent_env.py), `simulator.py` Stage I episodes (the simulator is the
policy, envs/sim_env.py), `userrl.py` turns UserRL tasks into agent episodes and trajectories into records
(the `rollout` command is commands/rollout.py); every runner returns `data/trajectory.py` records.
"""
