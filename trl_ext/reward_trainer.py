"""Reward-model trainer: TRL's `RewardTrainer` with extensions."""

from trl import RewardTrainer as _TRLRewardTrainer


class RewardTrainer(_TRLRewardTrainer):
    """[`trl.RewardTrainer`] with trl-ext's extensions."""
