"""DPO trainer: TRL's `DPOTrainer` with extensions."""

from trl import DPOTrainer as _TRLDPOTrainer


class DPOTrainer(_TRLDPOTrainer):
    """[`trl.DPOTrainer`] with trl-ext's extensions."""
