"""GAE over the policy's own tokens in a multi-turn episode: tool results and environment text are not steps. How it
works: docs/ppo-internals.md#gae-over-the-policys-tokens."""

from __future__ import annotations

import torch

from .advantages import gae_advantages

__all__ = ["gae_over_steps"]


def gae_over_steps(rewards: torch.Tensor, values: torch.Tensor, steps: torch.Tensor, gamma: float, lam: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and returns ``(batch, T)`` over the positions where ``steps`` is True (module docstring).

    Args:
        rewards, values: ``(batch, T)`` per-token rewards and values (the trainer's, padding positions 0).
        steps: ``(batch, T)`` bool, True at the positions that are steps: the episode's action tokens (and the
            position after its last token, where TRL's PPO puts the score and the final value). A row's first
            position is a step (an episode starts with the policy's first turn).
        gamma, lam: the discount and the GAE lambda.

    Returns:
        ``(advantages, returns)``; 0 at the positions that are not steps.
    """
    width = rewards.shape[1]
    positions = torch.arange(width, device=rewards.device).expand_as(steps)
    # Steps first, each row's order kept: sort by (not a step, position).
    order = torch.argsort((~steps).long() * width + positions, dim=1)
    # A reward on a non-step position goes to the last step before it (an episode starts with a step: its first turn).
    owner = torch.cummax(torch.where(steps, positions, torch.zeros_like(positions)), dim=1).values
    moved = torch.zeros_like(rewards).scatter_add_(1, owner, rewards)
    n_steps = steps.sum(1, keepdim=True)
    in_front = positions < n_steps
    step_rewards = torch.where(in_front, torch.gather(moved, 1, order), torch.zeros_like(rewards))
    step_values = torch.where(in_front, torch.gather(values, 1, order), torch.zeros_like(values))
    step_advantages, step_returns = gae_advantages(step_rewards, step_values, gamma, lam)
    advantages = torch.zeros_like(rewards).scatter_(1, order, torch.where(in_front, step_advantages, 0.0))
    returns = torch.zeros_like(rewards).scatter_(1, order, torch.where(in_front, step_returns, 0.0))
    return advantages, returns
