"""Evaluation metrics (simulator fidelity and agent performance) as defined in shared/reference/metrics.md."""
