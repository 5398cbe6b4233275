"""Reward functions and their plumbing (issue 25): the calling contract, the scorer, and the checkers of shipped tasks
(:mod:`trl_ext.rewards.arithmetic_task`)."""
