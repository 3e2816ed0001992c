"""Generation: the weight sync from the training layout to the rollout layout (weight_sync.py). The samplers and
the engine move here behind one protocol (issue #43)."""
