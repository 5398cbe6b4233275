"""Positions in padded token sequences, shared by the scalar (reward/value) heads and PPO's sequence handling."""

from __future__ import annotations

import torch

__all__ = ["first_true_indices"]


def first_true_indices(bools: torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Index of the first True along the last dimension, or the row length where a row has none (TRL's helper of
    the same name: e.g. the first pad token of right-padded responses)."""
    row_length = bools.size(-1)
    positions = torch.arange(row_length, dtype=dtype, device=bools.device)
    return torch.where(bools, positions, torch.full_like(positions, row_length)).min(dim=-1).values
