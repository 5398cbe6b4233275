"""Generalised advantage estimation (GAE) for PPO, as a pure function.

Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation", eq. 16:
``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V_T = 0`` after the last position) and
``A_t = delta_t + gamma * lam * A_{t+1}``; returns ``R_t = A_t + V_t``. Same loop as TRL 1.12's PPO.
"""

from __future__ import annotations

import torch


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, both ``(batch, T)``, from per-token ``rewards`` and ``values`` ``(batch, T)``.

    Not whitened (the trainer whitens advantages over the non-padding tokens afterwards).
    """
    lastgaelam = 0
    advantages_reversed = []
    gen_length = rewards.shape[1]
    for t in reversed(range(gen_length)):
        nextvalues = values[:, t + 1] if t < gen_length - 1 else 0.0
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]
        lastgaelam = delta + gamma * lam * lastgaelam
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], axis=1)
    returns = advantages + values
    return advantages, returns
