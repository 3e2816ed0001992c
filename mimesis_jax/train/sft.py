"""Stage I.2 -- ThoughtTrace reasoning SFT (paper §3.2, Table 4).

Starts from the mid-trained simulator (`init.from_workdir` = the mid-training workdir, or `init.from_hf`)
and trains on ThoughtTrace conversations formatted thought-first: ``<think>`` reasons ``</think>`` then the
public utterance, with the thinking template enabled. Loss on the user turn (thought + utterance) only.

Paper settings (Table 4): 3 epochs, LR 1e-7, max length 32,768, 8x A100, ~15.8M tokens processed -- see
configs/mimesis_{4b,9b}_sft.py.
"""

from __future__ import annotations

from mimesis_jax.config import RunConfig
from mimesis_jax.errors import ConfigError
from mimesis_jax.train import loop
from mimesis_jax.train.midtrain import check_data_formats

STAGE = "sft"
DATA_FORMAT = "thoughttrace"


def run(cfg: RunConfig, workdir: str, **kw) -> loop.TrainResult:
    if cfg.stage != STAGE:
        raise ConfigError(f"config key 'stage': {cfg.stage!r} config given to the {STAGE} command")
    check_data_formats(cfg, DATA_FORMAT)
    return loop.train(cfg, workdir, **kw)
