"""trl-ext: extensions to Hugging Face TRL's PPO, reward and DPO trainers, and an SFT stage to feed them.

The package, one subpackage per role (each ``__init__.py`` says what it holds):

* :mod:`trl_ext.ppo`: ``PPOTrainer``/``PPOConfig``; its rooms ``ppo/rollout/`` (sampling and scoring),
  ``ppo/objective/`` (losses, advantages, KL controllers), ``ppo/episodes/`` (multi-turn episodes with tools),
  ``ppo/base/`` (what the PPO extends on each TRL) and ``ppo/grpo_compat/`` (GRPOTrainer's inputs).
* :mod:`trl_ext.sft`: ``SFTTrainer`` (TRL's, with the run safety of :mod:`trl_ext.runtime`) and ``SFTConfig``.
* :mod:`trl_ext.preference`: ``RewardTrainer``/``RewardConfig``, ``DPOTrainer``/``DPOConfig``, preference losses,
  ranked data, reward centering.
* :mod:`trl_ext.rewards`: rewards computed by programs (TRL GRPO's reward-function contract, the scorer, remote
  rewards, their metrics and recipe entries).
* :mod:`trl_ext.user_code`: the user's functions that recipes and trainers name: worker processes with a time limit.
* :mod:`trl_ext.models`: loading tokenizer, policy and reward/value models (quantization, LoRA, scalar heads,
  reward/value adapters on the policy's base).
* :mod:`trl_ext.runtime`: atomic checkpoints, interruption, NaN guards, devices and engines: what every trainer
  shares.
* :mod:`trl_ext.recipe_loader`: YAML recipes: load, check, resolve, run (the pipeline), plan and plot.
* :mod:`trl_ext.export`: after training: export a run's models, sample from its policy, score data.
* ``cli.py``: the ``trl-ext`` command (``__main__.py``: ``python -m trl_ext``).
* ``config_rules.py``: each config field's nullability, choices and range, checked when any trl-ext config is built.
* ``errors.py``: :class:`~trl_ext.errors.UserInputError`, the one exception for bad input (used everywhere).
* ``trl_internals.py``: every name taken from TRL beyond its public top level (imported there only), and copies of
  TRL's small helpers.
* :mod:`trl_ext.testing`: tiny offline models for tests, the demo and the benchmarks; ``testing/tools.py``: a
  tiny tokenizer with a tool-calling chat template, an ``add`` tool and the tool tests' models.

Heavy imports (torch, transformers, trl) are deferred until a trainer or config is first used, so that
``import trl_ext`` and ``trl-ext --help`` stay fast.
"""

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
