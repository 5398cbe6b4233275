"""Preference training: :class:`trl_ext.RewardTrainer` and :class:`trl_ext.DPOTrainer`, subclasses of TRL's. How it
works: docs/internals.md#preference-trainers."""
