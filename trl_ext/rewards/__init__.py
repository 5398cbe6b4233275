"""Reward functions beside (or instead of) a reward model: TRL GRPO's calling contract, the scorer the PPO trainer
calls, the worker pool and remote rewards, and the resolver of recipe entries (``resolve``).

Nothing heavy is imported here: import the submodules.
"""
