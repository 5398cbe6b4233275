"""Statistics over the tokens that count: masked mean, variance and whitening of per-token PPO tensors.

``mask`` is True (or 1) on the tokens that count, e.g. the response tokens before padding. These are the
normalisations of Ziegler et al. 2019 / Huang et al. 2024 ("The N+ implementation details of RLHF with PPO", details
on advantage and reward whitening), in the exact operation order of TRL 1.12's PPO so that trl-ext's numbers equal
TRL's bit for bit on every TRL version.
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """``sum(values * mask) / sum(mask)``, over all positions or along ``axis``."""
    if axis is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(axis=axis) / mask.sum(axis=axis)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the counted ``values``: ``masked_mean((values - mean)^2)``, times ``n / (n - 1)`` when
    ``unbiased`` (``n`` = number of counted tokens; ``n = 0`` is an error, ``n = 1`` divides by zero)."""
    centered = values - masked_mean(values, mask)
    variance = masked_mean(centered**2, mask)
    if unbiased:
        count = mask.sum()
        if count == 0:
            raise ValueError(
                "masked_var: no token counts (mask sums to zero), which happens with mini_batch_size=1; increase "
                "the mini-batch size or gradient_accumulation_steps"
            )
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """``(values - mean) / sqrt(var + 1e-8)`` over the counted tokens (unbiased variance); with
    ``shift_mean=False`` the mean is added back (scale only, as PPO's reward whitening does)."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened += mean
    return whitened
