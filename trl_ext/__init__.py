"""trl-ext: extensions to Hugging Face TRL's PPO, reward and DPO trainers, and an SFT stage to feed them. How it
works: docs/internals.md#the-package."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "SFTConfig": "trl_ext.sft.trainer",
    "SFTTrainer": "trl_ext.sft.trainer",
    "PPOConfig": "trl_ext.ppo.config",
    "PPOTrainer": "trl_ext.ppo.trainer",
    "RewardConfig": "trl_ext.preference.reward_config",
    "RewardTrainer": "trl_ext.preference.reward_trainer",
    "DPOConfig": "trl_ext.preference.dpo_config",
    "DPOTrainer": "trl_ext.preference.dpo_trainer",
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from .ppo.config import PPOConfig
    from .ppo.trainer import PPOTrainer
    from .preference.dpo_config import DPOConfig
    from .preference.dpo_trainer import DPOTrainer
    from .preference.reward_config import RewardConfig
    from .preference.reward_trainer import RewardTrainer
    from .sft.trainer import SFTConfig, SFTTrainer


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trl_ext' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
