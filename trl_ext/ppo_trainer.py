"""PPO trainer: TRL 1.12's `experimental.ppo.PPOTrainer` with extensions."""

from .ppo_config import PPOConfig  # noqa: F401  (first: it silences TRL's experimental-import warning)

from trl.experimental.ppo import PPOTrainer as _TRLPPOTrainer


class PPOTrainer(_TRLPPOTrainer):
    """[`trl.experimental.ppo.PPOTrainer`] with trl-ext's extensions."""

    _tag_names = ["trl", "ppo", "trl-ext"]
