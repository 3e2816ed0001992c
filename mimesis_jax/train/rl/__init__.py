"""The two RL stages on one loop: learner.py (the loop), agent.py (Stage II), simulator.py (Stage I.3),
step.py (the jitted update both use), chat_models.py (the policy sampler and the frozen models), distributed.py
(the multi-process contract)."""
