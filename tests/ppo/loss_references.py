"""The PPO clipped surrogate (``policy_loss``, the operations of TRL's PPO policy loss) and GRPO's k3 KL loss
(``kl_loss_k3``) written out plainly: the bit-for-bit references that :mod:`trl_ext.ppo.objective.objectives` must
reproduce at its defaults. The library computes both through ``objectives``, so these live with the tests."""

from __future__ import annotations

import torch

from trl_ext.ppo.objective.losses import PolicyLoss
from trl_ext.ppo.objective.masked_stats import masked_mean


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
) -> PolicyLoss:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), as a loss to minimise.

    ``ratio = exp(log pi_new - log pi_old)``;
    ``loss = masked_mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)))``.
    """
    logprobs_diff = new_logprobs - old_logprobs
    ratio = torch.exp(logprobs_diff)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = masked_mean(torch.max(pg_losses, pg_losses2), mask)
    with torch.no_grad():
        clipfrac = masked_mean((pg_losses2 > pg_losses).float(), mask)
        approxkl = 0.5 * (logprobs_diff**2).mean()
    return PolicyLoss(loss, clipfrac, ratio, approxkl)


def kl_loss_k3(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL to the reference as a loss term (GRPO, Shao et al. 2024, eq. 4; the k3 estimator of Schulman 2020,
    http://joschu.net/blog/kl-approx.html): ``masked_mean(exp(ref - logp) - (ref - logp) - 1)`` over the counted
    tokens, with ``logp`` the current policy's (differentiable) log-probs. Non-negative; 0 when the two agree. The
    trainer adds ``kl_coef *`` this to the loss when ``kl_in="loss"``.
    """
    log_ratio = ref_logprobs - new_logprobs
    return masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)
