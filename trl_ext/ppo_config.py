"""Configuration of :class:`trl_ext.PPOTrainer`."""

import os
from dataclasses import dataclass

# PPO lives in trl.experimental in TRL 1.10-1.12; we depend on it on purpose, so its warning is noise.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl.experimental.ppo import PPOConfig as _TRLPPOConfig


@dataclass
class PPOConfig(_TRLPPOConfig):
    """Configuration for [`trl_ext.PPOTrainer`]: every field of TRL's `experimental.ppo.PPOConfig`, plus the
    extensions below (all of them default to TRL's behaviour).
    """
