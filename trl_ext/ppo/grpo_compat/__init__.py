"""What lets a TRL `GRPOTrainer` script run on :class:`trl_ext.PPOTrainer` with only the trainer's name changed. How
it works: docs/ppo-internals.md#grpo-compatibility."""
