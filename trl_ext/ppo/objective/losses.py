"""PPO loss terms, as pure functions of tensors: value loss (3 clip modes), ptx LM loss, and the policy loss's result
type (the policy objectives themselves: :mod:`trl_ext.ppo.objective.objectives`).

Shapes: ``(batch, response_length)`` per-token tensors and a boolean ``mask`` that is True on tokens that count.
``masked_mean(x, mask) = sum(x * mask) / sum(mask)`` (TRL's, reused). With their defaults these functions do the
exact arithmetic of TRL 1.12's ``experimental.ppo.PPOTrainer.train`` (same operations, same order).
"""

from __future__ import annotations

from typing import Literal, NamedTuple, get_args

import torch

from ...trl_internals import selective_log_softmax
from .masked_stats import masked_mean

ValueClip = Literal["max", "mean", "none"]
VALUE_CLIP_MODES = get_args(ValueClip)


class ValueLoss(NamedTuple):
    loss: torch.Tensor
    """Scalar value loss (differentiable)."""
    clipfrac: torch.Tensor
    """Fraction of counted tokens where the clipped squared error exceeds the unclipped one (0 for ``"none"``)."""


class PolicyLoss(NamedTuple):
    loss: torch.Tensor
    """Scalar clipped surrogate loss (differentiable)."""
    clipfrac: torch.Tensor
    """Fraction of counted tokens where the clipped term is the larger loss (no grad)."""
    ratio: torch.Tensor
    """Per-token ``pi_new / pi_old`` (differentiable)."""
    approxkl: torch.Tensor
    """``0.5 * mean((log pi_new - log pi_old)^2)`` over all positions, as TRL logs it (no grad)."""
    stats: dict | None = None
    """Further statistics by metric name (:func:`trl_ext.ppo.objective.objectives.clip_statistics`), no grad."""


def value_loss(
    vpred: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
    mode: str = "max",
) -> ValueLoss:
    """Value-function loss with one of three clipping modes.

    With ``V_clip = clip(V, V_old - eps, V_old + eps)``, ``l1 = (V - R)^2`` and ``l2 = (V_clip - R)^2``:

    * ``"max"`` (TRL, DeepSpeed-Chat, trlx, OpenRLHF): ``0.5 * masked_mean(max(l1, l2))``.
    * ``"mean"``: ``0.5 * masked_mean((l1 + l2) / 2)``, the average of the clipped and unclipped errors (the
      variant ``0.5 * ((V-R)^2 + (V_clip-R)^2)`` of one of our seed notes, kept on TRL's scale so that all three
      modes agree when nothing is clipped).
    * ``"none"``: plain MSE, ``0.5 * masked_mean(l1)``; ``clipfrac`` is 0.

    ``clipfrac = masked_mean(l2 > l1)``: the share of tokens where clipping increases the error.
    """
    if mode not in VALUE_CLIP_MODES:
        raise ValueError(f"value_clip: unknown mode {mode!r}; use one of {', '.join(VALUE_CLIP_MODES)}")
    vf_losses1 = torch.square(vpred - returns)
    if mode == "none":
        return ValueLoss(0.5 * masked_mean(vf_losses1, mask), torch.zeros((), device=vpred.device))
    vpredclipped = torch.clamp(vpred, old_values - cliprange_value, old_values + cliprange_value)
    vf_losses2 = torch.square(vpredclipped - returns)
    if mode == "max":
        per_token = torch.max(vf_losses1, vf_losses2)
    else:
        per_token = 0.5 * (vf_losses1 + vf_losses2)
    loss = 0.5 * masked_mean(per_token, mask)
    with torch.no_grad():
        clipfrac = masked_mean((vf_losses2 > vf_losses1).float(), mask)
    return ValueLoss(loss, clipfrac)


def ptx_lm_loss(logits: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Pretraining (ptx) language-model loss: mean next-token negative log-likelihood over real tokens.

    InstructGPT (Ouyang et al. 2022) eq. 2 adds ``gamma * E_pretrain[log pi(x)]`` to the RL objective; as a
    loss that is ``gamma * lm_loss`` with ``lm_loss = -sum_t m_{t+1} log pi(x_{t+1} | x_<=t) / sum_t m_{t+1}``,
    ``logits`` of shape ``(batch, seq, vocab)`` predicting position ``t+1`` from position ``t``.
    """
    target_logprobs = selective_log_softmax(logits[:, :-1].float(), input_ids[:, 1:])
    mask = attention_mask[:, 1:].bool()
    return -masked_mean(target_logprobs, mask)
