"""Accelerator memory: :func:`empty_cache`, which the PPO loop calls between its phases (as TRL's PPO does)."""

from __future__ import annotations

import torch


def empty_cache() -> None:
    """Release the cached, unused memory of the current accelerator (CUDA, XPU, MPS, NPU, ...); nothing on CPU."""
    if torch.accelerator.is_available():
        torch.accelerator.empty_cache()
