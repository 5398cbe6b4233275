"""trl-ext: extensions to Hugging Face TRL's PPO, reward and DPO trainers.

Heavy imports (torch, transformers, trl) are deferred until a trainer or config is first used, so that
``import trl_ext`` and ``trl-ext --help`` stay fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "PPOConfig": "trl_ext.ppo_config",
    "PPOTrainer": "trl_ext.ppo_trainer",
    "RewardConfig": "trl_ext.reward_config",
    "RewardTrainer": "trl_ext.reward_trainer",
    "DPOConfig": "trl_ext.dpo_config",
    "DPOTrainer": "trl_ext.dpo_trainer",
}

__all__ = ["__version__", *_LAZY]

if TYPE_CHECKING:  # pragma: no cover
    from .dpo_config import DPOConfig
    from .dpo_trainer import DPOTrainer
    from .ppo_config import PPOConfig
    from .ppo_trainer import PPOTrainer
    from .reward_config import RewardConfig
    from .reward_trainer import RewardTrainer


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'trl_ext' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
