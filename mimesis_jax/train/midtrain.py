"""Stage I.1 -- user-side mid-training (paper §3.1, Table 4).

Role-flipped next-utterance prediction: the dialogue so far (assistant turns included) is the context and
the human user's next turn is the target, so the loss covers user-turn tokens only (the data pipeline's
`loss_mask`); thinking is disabled. The objective is the token-mean NLL of `train.step.lm_loss_sums`.

Paper settings (Table 4): ~0.97 epoch of a 62-corpus mixture (9.51B tokens), 5,000 steps, LR 3e-5, max
length 24,576, 32x A100 -- see configs/mimesis_{4b,9b}_midtrain.py for how they map onto a run config.
"""

from __future__ import annotations

from mimesis_jax.config import RunConfig
from mimesis_jax.errors import ConfigError
from mimesis_jax.train import loop

STAGE = "midtrain"
DATA_FORMAT = "midtrain"


def check_data_formats(cfg: RunConfig, fmt: str) -> None:
    """Every source of a pipeline DataConfig must have the stage's record format."""
    for i, src in enumerate(getattr(cfg.data, "sources", None) or ()):
        got = getattr(src, "format", fmt)
        if got != fmt:
            raise ConfigError(f"config key 'data.sources.{i}.format': the {cfg.stage} stage reads {fmt!r} "
                              f"records, got {got!r} ({getattr(src, 'path', '?')})")


def run(cfg: RunConfig, workdir: str, **kw) -> loop.TrainResult:
    if cfg.stage != STAGE:
        raise ConfigError(f"config key 'stage': {cfg.stage!r} config given to the {STAGE} command")
    check_data_formats(cfg, DATA_FORMAT)
    return loop.train(cfg, workdir, **kw)
