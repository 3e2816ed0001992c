"""One home for every run config: typed, nested, frozen dataclasses; one Python file per run in `configs/`.

    checks.py    `need`, the one validation helper (messages name the full key)
    choices.py   the allowed values of the RL update's string settings (algorithms/ imports them from here)
    sections.py  the sections every training run carries (tokenizer, optimizer, train, mesh, checkpoint, init)
                 and the Stage I run config `RunConfig` (mid-training, SFT) with `validate`
    presets.py   model presets: the paper's Qwen3.5-4B/9B and Qwen3-8B, the tiny CPU models
    mixture.py   `MixtureConfig`, the UserRL gym mixture (Stage II's `gyms`, the rollout command's --mixture)
    rl.py        the RL stages: `RLConfig` (the update), `RolloutSection` (the rollout settings both stages share),
                 `AgentRLConfig` (Stage II) and `SimRLConfig` (Stage I.3) with their own sections
    loading.py   `load_config("configs/x.py[:variant]", ["key=value", ...])`, --set parsing
    serial.py    to / from dicts

The model's runtime fields (compute dtype, remat) are set from `train.dtype` / `train.remat`, never in `model`, so
there is one place for each. Config files import from here only (and the data pipeline's `DataConfig`), never a
training loop.
"""

from mimesis_jax.config.checks import lookup, need
from mimesis_jax.config.loading import (apply_overrides, config_variants, load_config, parse_value, set_value,
                                        split_variant)
from mimesis_jax.config.mixture import MAX_PROMPT_TOKENS, USERRL_TRAIN_ROWS, MixtureConfig
from mimesis_jax.config.presets import qwen3_5_layer_types, qwen3_5_model, qwen3_model, tiny_qwen3, tiny_qwen3_5
from mimesis_jax.config.rl import (AgentRLConfig, DomainMixConfig, RLConfig, RolloutConfig, RolloutSection,
                                   SidesConfig, SimRLConfig, SimRolloutConfig, SimValidationConfig, UserSideConfig,
                                   ValidationConfig, context_budget)
from mimesis_jax.config.sections import (STAGES, CheckpointConfig, InitConfig, MeshConfig, OptimizerConfig, RunConfig,
                                         TokenizerConfig, TrainConfig, validate)
from mimesis_jax.config.serial import diff, model_from_dict, to_dict
from mimesis_jax.errors import ConfigError

__all__ = [
    "AgentRLConfig", "CheckpointConfig", "ConfigError", "DomainMixConfig", "InitConfig", "MAX_PROMPT_TOKENS",
    "MeshConfig", "MixtureConfig", "OptimizerConfig", "RLConfig", "RolloutConfig", "RolloutSection", "RunConfig",
    "STAGES", "SidesConfig", "SimRLConfig", "SimRolloutConfig", "SimValidationConfig", "TokenizerConfig",
    "TrainConfig", "USERRL_TRAIN_ROWS", "UserSideConfig", "ValidationConfig", "apply_overrides", "config_variants",
    "context_budget", "diff", "load_config", "lookup", "model_from_dict", "need", "parse_value", "qwen3_5_layer_types",
    "qwen3_5_model", "qwen3_model", "set_value", "split_variant", "tiny_qwen3", "tiny_qwen3_5", "to_dict", "validate",
]
