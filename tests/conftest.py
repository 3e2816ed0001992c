"""Test set-up: 8 fake CPU devices for sharding tests, fail-fast collectives, shared tiny-model helpers."""

import os

# Must happen before jax is imported anywhere.
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "xla_cpu_collective_call_terminate_timeout_seconds" not in _flags:
    _flags += " --xla_cpu_collective_call_terminate_timeout_seconds=15"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
