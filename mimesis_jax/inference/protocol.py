"""What every generator shares (issue #43 item 1): seeds derived from a run seed and counters."""

from __future__ import annotations

import numpy as np


def derive_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) % (1 << 63) for p in parts]).generate_state(1)[0])
