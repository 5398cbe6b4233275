"""The caching allocator's margin: what a CUDA run reserves beyond the peak :mod:`trl_ext.ppo.rollout.memory_budget`
predicts it allocates, a line through two measurements (off CUDA: 1.0). Derivation: docs/ppo-memory.md."""

from __future__ import annotations

import os

from ...runtime.cuda_memory import ALLOC_CONF_ENV, EXPANDABLE_SEGMENTS
from .memory_budget import DEVICE_OVERHEAD_BYTES, MemoryBudget

__all__ = ["allocator_margin", "expandable_segments_on", "planned_reserved_bytes"]

MARGIN_INTERCEPT = 1.077
MARGIN_PER_CHUNK = 0.0079
ENGINE_EXTRA = 0.34
EXPANDABLE_MARGIN = 1.05


def expandable_segments_on(environ=os.environ) -> bool:
    """``PYTORCH_CUDA_ALLOC_CONF`` turns expandable segments on."""
    return EXPANDABLE_SEGMENTS.lower() in environ.get(ALLOC_CONF_ENV, "").replace(" ", "").lower()


def allocator_margin(chunk: int, *, device_type: str, expandable_segments: bool,
                     continuous_batching: bool = False) -> float:
    """Reserved / allocated peak planned for a run on ``device_type`` at rollout ``chunk`` (module docstring)."""
    if device_type != "cuda":
        return 1.0
    if expandable_segments:
        return EXPANDABLE_MARGIN
    return MARGIN_INTERCEPT + MARGIN_PER_CHUNK * chunk + (ENGINE_EXTRA if continuous_batching else 0.0)


def planned_reserved_bytes(budget: MemoryBudget, margin: float) -> int:
    """The whole-process peak planned: the allocator's part of ``budget.peak`` times ``margin``, plus the overhead."""
    return int(DEVICE_OVERHEAD_BYTES + (budget.peak - DEVICE_OVERHEAD_BYTES) * margin)
