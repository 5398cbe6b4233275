"""The critic's health, logged every update: how much of the returns' variance the value model explains, and its
error. A critic helps only while its explained variance is above 0 (EVPO, arXiv 2604.19485); verl logs the same
quantity as ``critic/vf_explained_var``. In multi-turn episodes also per turn, so a critic that learned the first
turns but not the last shows it. And what the value model adds to the credit per-turn critic-free credit gives for
nothing (:func:`credit_gain`): explained variance counts luck the state shows, which the policy cannot act on.
"""

from __future__ import annotations

import torch

from .action_gae import gae_over_steps
from .turn_credit import loo_turn_baseline, on_tokens, reached_turns, turn_index, turn_starts, turn_sums

__all__ = ["credit_gain", "critic_health", "explained_variance", "turn_index"]

#: Returns that vary less than this have nothing to explain: a turn after the last reward, whose returns are the KL
#: penalties still to come (sd about 1e-5), would otherwise log an explained variance of -1e8.
MIN_RETURN_SD = 1e-4


def _moments(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """count, sum and sum of squares of the returns and of the errors ``returns - values`` over ``mask``."""
    m = mask.to(torch.float64)
    r, e = returns.to(torch.float64) * m, (returns - values).to(torch.float64) * m
    return torch.stack([m.sum(), r.sum(), (r * r).sum(), e.sum(), (e * e).sum()])


def explained_variance(moments: torch.Tensor) -> tuple[float, float] | None:
    """``(1 - Var(R - V) / Var(R), sqrt(mean((R - V)^2)))`` from :func:`_moments`; None for fewer than 2 tokens or
    returns without spread (a standard deviation under ``MIN_RETURN_SD``)."""
    n, sum_r, sum_r2, sum_e, sum_e2 = moments.tolist()
    var_r = sum_r2 / n - (sum_r / n) ** 2 if n >= 2 else 0.0
    if var_r < MIN_RETURN_SD**2:
        return None
    var_e = sum_e2 / n - (sum_e / n) ** 2
    return 1.0 - var_e / var_r, (sum_e2 / n) ** 0.5


def critic_health(rollout, reduce_sum=None, turns: int | None = None) -> dict:
    """``critic/vf_explained_var`` and ``critic/value_rmse`` of the rollout's values (before this update's
    optimisation) against its value targets, over every process's value tokens; with ``turns`` (a multi-turn run:
    the most turns an episode may have) the same per turn, ``critic/vf_explained_var/turn_<k>``. A key is left out
    when its returns have no spread (nothing to explain: the first updates of a run without rewards yet)."""
    mask = ~rollout.padding_mask_p1
    rows = [_moments(rollout.returns, rollout.values, mask)]
    if turns is not None:
        index = turn_index(mask)
        rows += [_moments(rollout.returns, rollout.values, index == k) for k in range(1, turns + 1)]
    moments = torch.stack(rows)
    if reduce_sum is not None:
        moments = reduce_sum(moments)
    metrics = {}
    for k, row in enumerate(moments):
        health = explained_variance(row)
        if health is None:
            continue
        suffix = f"/turn_{k}" if k else ""
        metrics[f"critic/vf_explained_var{suffix}"], metrics[f"critic/value_rmse{suffix}"] = health
    return metrics


def _gain_sums(returns, values, baseline, mask) -> torch.Tensor:
    """Count, ``sum((G - V)^2)`` and ``sum((G - b)^2)`` over ``mask``."""
    m = mask.to(torch.float64)
    with_value, with_baseline = (returns - values).to(torch.float64) * m, (returns - baseline).to(torch.float64) * m
    return torch.stack([m.sum(), (with_value**2).sum(), (with_baseline**2).sum()])


def credit_gain(rollout, gamma: float, group_size: int, reduce_sum=None, turns: int | None = None) -> dict:
    """``critic/credit_gain``: the share of the per-turn critic-free advantage that the value model removes,
    ``1 - sum (G - V)^2 / sum (G - b)^2`` over every process's value tokens, at the same target: ``G`` the
    Monte-Carlo return-to-go of each step (the rollout's rewards, ``gamma``, lambda 1: GAE's advantage at lambda 1 is
    ``G - V``), ``V`` the rollout's values, ``b`` per-turn RLOO's baseline (:func:`~.turn_credit.loo_turn_baseline`):
    the mean return-to-go at the same turn's first step of the group's other episodes that reached it (``group_size``
    1: the process's other episodes, other prompts). Tokens whose turn no other episode reached count in neither sum.
    With ``turns`` also ``critic/credit_gain/turn_<k>``. Not logged where ``b``'s advantages have no spread (a
    root-mean-square under ``MIN_RETURN_SD``). Reading it: docs/metrics.md."""
    steps = ~rollout.padding_mask_p1
    returns = gae_over_steps(rollout.rewards, torch.zeros_like(rollout.rewards), steps, gamma, 1.0)[1]
    index = turn_index(steps)
    n_turns = max(int(index.max()), 1)
    per_turn = turn_sums(returns * turn_starts(index), index, n_turns)  # each turn's return-to-go at its first step
    group = group_size if group_size > 1 else per_turn.shape[0]
    baseline, exists = loo_turn_baseline(per_turn, reached_turns(index, n_turns), group)
    counted = steps & (on_tokens(exists.to(returns.dtype), index) > 0)
    baseline = on_tokens(baseline, index)
    rows = [_gain_sums(returns, rollout.values, baseline, counted)]
    if turns is not None:
        rows += [_gain_sums(returns, rollout.values, baseline, counted & (index == k)) for k in range(1, turns + 1)]
    sums = torch.stack(rows)
    if reduce_sum is not None:
        sums = reduce_sum(sums)
    metrics = {}
    for k, (count, with_value, with_baseline) in enumerate(sums.tolist()):
        if count < 1 or with_baseline / count < MIN_RETURN_SD**2:
            continue
        metrics["critic/credit_gain" + (f"/turn_{k}" if k else "")] = 1.0 - with_value / with_baseline
    return metrics
