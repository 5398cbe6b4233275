"""Rewards computed by programs: TRL GRPO's ``reward_funcs`` contract for :class:`trl_ext.PPOTrainer` and recipes.
How it works: docs/internals-recipes.md#rewards."""
