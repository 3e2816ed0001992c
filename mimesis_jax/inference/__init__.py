"""Generation: the static sampler (sampler.py), the rollout engine (engine.py and its companions engine_requests,
engine_programs, engine_sizing, page_pool) and the weight sync from the training layout to the rollout layout
(weight_sync.py)."""
