"""Advantage estimators for the PPO trainer, as pure functions.

`gae_advantages`: generalised advantage estimation (Schulman et al. 2016, "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", eq. 16): ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V_T = 0`` after the last
position) and ``A_t = delta_t + gamma * lam * A_{t+1}``; returns ``R_t = A_t + V_t``. Same loop as TRL 1.12's PPO.

Critic-free estimators (no value model), from k samples per prompt: `rloo_advantages`, `grpo_advantages` (and Dr.
GRPO), `reinforce_pp_advantages` (and REINFORCE++-baseline); their formulas and papers are in their docstrings.
"""

from __future__ import annotations

import torch


def gae_advantages(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, both ``(batch, T)``, from per-token ``rewards`` and ``values`` ``(batch, T)``; ``lam``
    a float or one per row ``(batch, 1)`` (:func:`length_adaptive_lam`). Not whitened."""
    if torch.is_tensor(lam):
        lam = lam.reshape(-1)
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


def token_rewards(kl: torch.Tensor, kl_coef: float, scores: torch.Tensor, score_index: torch.Tensor,
                  turn_rewards: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The per-token reward every estimator starts from (Ziegler et al. 2019, eq. 2; TRL's PPO):
    ``r_t = -kl_coef * KL_t``, plus each sequence's score at ``score_index`` and the environments' per-turn rewards
    where they fall. ``kl`` ``(batch, T)`` (times ``mask`` when given), ``scores`` and ``score_index`` ``(batch,)``."""
    penalty = -kl_coef * kl if mask is None else -kl_coef * kl * mask.to(kl.dtype)
    rewards = penalty.clone()
    rewards[torch.arange(rewards.size(0), device=rewards.device), score_index] += scores.to(rewards.dtype)
    return rewards if turn_rewards is None else rewards + turn_rewards


def last_counted(mask: torch.Tensor) -> torch.Tensor:
    """``(batch,)``: the position of each row's last True in ``mask`` (its last counted token: with tools the last
    token of the last turn, not the count of the episode's action tokens), 0 for a row without one."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    return (positions * mask).max(1).values


def lambda_returns(rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """The value targets ``R_t = A_t(lam) + V_t``: the TD(lambda) return (Sutton & Barto 2018, eq. 12.3; GAE paper
    eq. 18). ``lam`` 1 gives the Monte-Carlo return ``sum_{s >= t} gamma^(s-t) r_s``, which no value enters
    (VAPO's ``lambda_critic``, arXiv 2504.05118 sec. 4.1)."""
    return gae_advantages(rewards, values, gamma, lam)[1]


def length_adaptive_lam(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """VAPO's length-adaptive GAE lambda for the policy (arXiv 2504.05118, eq. 8): ``lam = 1 - 1 / (alpha * l)``
    for a response of ``l`` counted tokens, ``(batch, 1)``, clamped to [0, 1] (the paper's alpha: 0.05)."""
    return (1.0 - 1.0 / (alpha * lengths.clamp(min=1).to(torch.float32))).clamp(0.0, 1.0).unsqueeze(1)


# ---------------------------------------------------------------------------------------------------- critic-free

GRPO_STD_EPS = 1e-4
"""`eps` of GRPO's `(r - mean) / (std + eps)` (TRL's `GRPOTrainer` uses 1e-4)."""


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(batch,)`` -> ``(batch / group_size, group_size)``: the k samples of a prompt are consecutive rows."""
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards of shape {tuple(rewards.shape)} do not split into groups of {group_size}")
    return rewards.view(-1, group_size)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs", eq. 5; Kool et al. 2019).

    For the ``k = group_size`` samples of one prompt: ``A_i = r_i - 1/(k-1) * sum_{j != i} r_j``, one advantage per
    sequence ``(batch,)``. A group of equal rewards gets 0 everywhere. ``rewards`` ``(batch,)``, groups consecutive.
    """
    if group_size < 2:
        raise ValueError("rloo needs at least 2 samples per prompt")
    grouped = _groups(rewards, group_size)
    baseline = (grouped.sum(1, keepdim=True) - grouped) / (group_size - 1)
    return (grouped - baseline).reshape(-1)


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, scale_by_std: bool = True, eps: float = GRPO_STD_EPS
) -> torch.Tensor:
    """Group Relative Policy Optimization (Shao et al. 2024, "DeepSeekMath", sec. 4.1.2, outcome supervision).

    ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` with the unbiased std of the group (as TRL's
    ``GRPOTrainer`` and OpenRLHF compute it). ``scale_by_std=False`` is Dr. GRPO (Liu et al. 2025, "Understanding
    R1-Zero-Like Training: A Critical Perspective", sec. 3.2): ``A_i = r_i - mean(r_group)``, no division, which
    otherwise up-weights prompts whose rewards barely differ. One advantage per sequence ``(batch,)``.
    """
    if group_size < 2:
        raise ValueError("grpo needs at least 2 samples per prompt")
    grouped = _groups(rewards, group_size)
    centered = grouped - grouped.mean(1, keepdim=True)
    if scale_by_std:
        centered = centered / (grouped.std(1, keepdim=True) + eps)
    return centered.reshape(-1)


def group_mean_baseline(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``r_i - mean(r_group)`` ``(batch,)``: the baseline of REINFORCE++-baseline (and of Dr. GRPO)."""
    grouped = _groups(rewards, group_size)
    return (grouped - grouped.mean(1, keepdim=True)).reshape(-1)


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, reduce_sum=None) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    sec. 3; OpenRLHF's ``reinforce`` / ``reinforce_baseline`` estimators): the returns-to-go of the per-token
    ``rewards`` with gamma 1, ``G_t = sum_{s >= t} r_s``, whitened over every counted token of the GLOBAL batch,
    ``A_t = (G_t - mean) / sqrt(var + 1e-8)`` (unbiased variance, as ``masked_whiten``); 0 where ``mask`` is False.
    ``rewards``: :func:`token_rewards` (REINFORCE++-baseline: the score minus its group's mean first).
    ``reduce_sum`` sums a tensor over all processes (``accelerator.reduce(t, "sum")``); ``None``: one process."""
    return whiten_over_batch(returns_to_go(rewards, mask), mask, reduce_sum)


def returns_to_go(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``G_t = sum_{s >= t} r_s`` over the counted tokens (gamma 1), 0 where ``mask`` is False."""
    maskf = mask.to(rewards.dtype)
    return (rewards * maskf).flip(1).cumsum(1).flip(1) * maskf


def whiten_over_batch(returns: torch.Tensor, mask: torch.Tensor, reduce_sum=None) -> torch.Tensor:
    """``(G - mean) / sqrt(var + 1e-8)`` over every counted token of every process (unbiased variance), 0 where
    ``mask`` is False; ``reduce_sum`` as in :func:`reinforce_pp_advantages`."""
    maskf = mask.to(returns.dtype)
    moments = torch.stack([maskf.sum(), returns.sum(), (returns**2).sum()])
    if reduce_sum is not None:
        moments = reduce_sum(moments)
    count, total, total_sq = moments[0], moments[1], moments[2]
    mean = total / count
    var = (total_sq / count - mean**2).clamp(min=0) * (count / (count - 1))
    return (returns - mean) * torch.rsqrt(var + 1e-8) * maskf


def sequence_advantages_to_tokens(advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast one advantage per sequence ``(batch,)`` onto its counted tokens ``(batch, T)`` (0 elsewhere)."""
    return advantages.unsqueeze(1) * mask.to(advantages.dtype)
