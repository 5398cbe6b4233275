"""Configuration of :class:`trl_ext.RewardTrainer`."""

from dataclasses import dataclass

from trl import RewardConfig as _TRLRewardConfig


@dataclass
class RewardConfig(_TRLRewardConfig):
    """Configuration for [`trl_ext.RewardTrainer`]: every field of TRL's `RewardConfig`, plus the extensions
    below (all of them default to TRL's behaviour).
    """
