"""The devices the planner knows (memory, bf16 peak, source) and the mesh: parsed from --mesh or read from a
config's `mesh.*`."""

from __future__ import annotations

import dataclasses
import math
import os

from mimesis_jax.errors import ConfigError

GiB = 2 ** 30
HEADROOM = 0.05  # of the device's memory, kept free for the runtime and allocator fragmentation
MESH_AXES = ("data", "fsdp", "tensor")


@dataclasses.dataclass(frozen=True)
class Device:
    name: str
    bytes: int  # memory of one device (accelerator HBM)
    peak_bf16_flops: float | None  # dense bf16 matmul peak, FLOP/s
    source: str


DEVICES = {
    "a100-80g": Device("a100-80g", 80 * GiB, 312e12, "NVIDIA A100 datasheet: 80 GB HBM2e, 312 TFLOP/s dense BF16"),
    "a100-40g": Device("a100-40g", 40 * GiB, 312e12, "NVIDIA A100 datasheet: 40 GB HBM2, 312 TFLOP/s dense BF16"),
    "h100-80g": Device("h100-80g", 80 * GiB, 989e12, "NVIDIA H100 SXM datasheet: 80 GB HBM3, 989 TFLOP/s dense BF16"),
    "h200": Device("h200", 141 * 10 ** 9, 989e12, "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 989 TFLOP/s dense BF16"),
    "tpu-v4": Device("tpu-v4", 32 * GiB, 275e12, "Google Cloud TPU v4 docs: 32 GiB HBM2 per chip, 275 TFLOP/s BF16"),
    "tpu-v5e": Device("tpu-v5e", 16 * GiB, 197e12, "Google Cloud TPU v5e docs: 16 GiB HBM2 per chip, 197 TFLOP/s"),
    "tpu-v5p": Device("tpu-v5p", 95 * GiB, 459e12, "Google Cloud TPU v5p docs: 95 GiB HBM2e per chip, 459 TFLOP/s"),
    "cpu": Device("cpu", 0, None, "this host's physical memory shared by the mesh's devices; no nominal peak"),
}


def device_for(name: str, num_devices: int) -> Device:
    """The named device; 'cpu' is this host's RAM split over the mesh's (fake) devices."""
    if name not in DEVICES:
        raise ConfigError(f"--device {name!r}: unknown device; expected one of {sorted(DEVICES)}")
    dev = DEVICES[name]
    if name == "cpu":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        dev = dataclasses.replace(dev, bytes=ram // max(1, num_devices))
    return dev


def parse_mesh(text: str) -> dict[str, int]:
    """'data=A,fsdp=B,tensor=C' (any subset; missing axes are 1) -> {axis: size}."""
    out = {a: 1 for a in MESH_AXES}
    seen = set()
    for part in text.split(","):
        key, sep, val = part.partition("=")
        key = key.strip()
        if not sep or key not in MESH_AXES:
            raise ConfigError(f"--mesh {text!r}: {part!r} is not axis=size with axis one of {MESH_AXES}")
        if key in seen:
            raise ConfigError(f"--mesh {text!r}: axis {key!r} given twice")
        try:
            size = int(val)
        except ValueError:
            raise ConfigError(f"--mesh {text!r}: size {val!r} of axis {key!r} is not an integer") from None
        if size < 1:
            raise ConfigError(f"--mesh {text!r}: size {size} of axis {key!r} must be >= 1")
        seen.add(key)
        out[key] = size
    return out


def config_mesh(mesh_cfg, visible_devices: int) -> dict[str, int]:
    """A MeshConfig's axes with -1 resolved against `visible_devices` (the devices this process sees)."""
    axes = dict(mesh_cfg.axes())
    rest = math.prod(v for v in axes.values() if v != -1)
    for k, v in axes.items():
        if v == -1:
            axes[k] = max(1, visible_devices // rest)
    return axes



def mesh_text(mesh: dict) -> str:
    return ",".join(f"{a}={mesh[a]}" for a in MESH_AXES)
