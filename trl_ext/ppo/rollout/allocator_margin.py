"""The caching allocator's margin: what a CUDA run RESERVES beyond the peak :mod:`trl_ext.ppo.rollout.memory_budget` predicts
it ALLOCATES.

Derivation (``docs/ppo-memory.md``; one H200, 8B QLoRA PPO, ``benchmarks/gpu_ppo.py``, default allocator settings):
peak reserved / peak allocated was 14.8 / 12.9 = 1.14 at rollout chunk 8 and 30.8 / 23.1 = 1.33 at chunk 32 (the
``generate`` rollout); with the continuous-batching engine at chunk 32, 38.8 / 23.2 = 1.67. A straight line through
the two ``generate`` points: ``margin = 1.077 + 0.0079 * chunk`` (larger chunks leave larger freed KV-cache blocks
that later, differently sized tensors cannot reuse); the engine adds 0.34 (its measured excess at chunk 32).
With ``expandable_segments:True`` (what trl-ext sets for CUDA runs, :mod:`trl_ext.runtime.cuda_memory`) segments
grow and shrink in place; not measured yet, planned at 1.05 until the prepared GPU run measures it. Off CUDA: 1.0.
The margin applies to the allocator's part of the peak, not to the device overhead outside it.
"""

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
