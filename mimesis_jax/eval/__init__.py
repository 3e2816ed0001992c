"""Evaluation metrics (simulator fidelity and agent performance) as defined in docs/reference/metrics.md."""
