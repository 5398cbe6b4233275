"""PPO: :class:`trl_ext.PPOTrainer` and :class:`trl_ext.PPOConfig`, shelved by role: the trainer, its config and the
trainer's own parts at this top; the math in ``objective/``, the sampling in ``rollout/``, multi-turn episodes in
``episodes/``, what the PPO extends in ``base/``, GRPOTrainer's inputs in ``grpo_compat/`` (each module says what it
holds). Imports go down only, ``objective/`` lowest (tests/test_layout.py)."""
