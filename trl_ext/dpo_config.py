"""Configuration of :class:`trl_ext.DPOTrainer`."""

from dataclasses import dataclass

from trl import DPOConfig as _TRLDPOConfig


@dataclass
class DPOConfig(_TRLDPOConfig):
    """Configuration for [`trl_ext.DPOTrainer`]: every field of TRL's `DPOConfig`, plus the extensions below
    (all of them default to TRL's behaviour).
    """
