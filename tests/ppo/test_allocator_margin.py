"""The caching allocator's margin (trl_ext.ppo.memory.budget) and the auto chunk planned on the reserved peak, with
the device passed in (no CUDA needed)."""

from dataclasses import replace
from functools import partial

import pytest

from trl_ext.ppo.memory.budget import allocator_margin, expandable_segments_on, planned_reserved_bytes
from trl_ext.ppo.memory.budget import DEVICE_OVERHEAD_BYTES, GIB, LLAMA_3_8B, PPOShape, ppo_memory_budget
from trl_ext.ppo.memory.chunk import largest_fitting_chunk

RUN = PPOShape(batch=64, micro_batch=2, rollout_chunk=8, prompt_length=512, response_length=64, lora_r=32,
               quantization="nf4-nested", upcast_non_quantized=True)


def test_the_margin_reproduces_the_h200_ratios():
    # measured (one H200, default allocator): 1.14 at chunk 8, 1.33 at chunk 32; the engine 1.67 at chunk 32
    margin = partial(allocator_margin, device_type="cuda", expandable_segments=False)
    assert margin(8) == pytest.approx(1.14, abs=0.005) and margin(32) == pytest.approx(1.33, abs=0.005)
    assert margin(32, continuous_batching=True) == pytest.approx(1.67, abs=0.005)
    assert allocator_margin(32, device_type="cuda", expandable_segments=True) == 1.05
    assert allocator_margin(32, device_type="cpu", expandable_segments=False) == 1.0


def test_planned_reserved_peak_scales_the_allocators_part_only():
    budget = ppo_memory_budget(LLAMA_3_8B, replace(RUN, rollout_chunk=32, upcast_non_quantized=False), shared=True)
    planned = planned_reserved_bytes(budget, 1.5)
    assert planned == int(DEVICE_OVERHEAD_BYTES + (budget.peak - DEVICE_OVERHEAD_BYTES) * 1.5)


def test_the_auto_chunk_on_cuda_fits_the_reserved_peak():
    """The fast 8B run at 24 GiB: chunk 32 as allocated (23.8 GiB predicted), which reserved 30.8 GiB on the H200;
    planned on the reserved peak the chunk is smaller, and fits with its margin."""
    # the H200 run: 32 episodes per update, float32 residual (upcast not yet off), logits of every position
    run = replace(RUN, batch=32, response_logits_only=False)
    target = 24 * GIB
    allocated = largest_fitting_chunk(LLAMA_3_8B, run, target, shared=True)
    margin = partial(allocator_margin, device_type="cuda", expandable_segments=False)
    reserved = largest_fitting_chunk(LLAMA_3_8B, run, target, shared=True, margin=margin)
    expandable = largest_fitting_chunk(LLAMA_3_8B, run, target, shared=True,
                                       margin=partial(allocator_margin, device_type="cuda", expandable_segments=True))
    assert allocated.chunk == 32 and allocated.budget.peak / GIB == pytest.approx(23.8, abs=0.05)
    assert reserved.chunk < expandable.chunk < allocated.chunk
    assert planned_reserved_bytes(reserved.budget, margin(reserved.chunk)) <= target
    assert planned_reserved_bytes(reserved.next_budget, margin(reserved.chunk + 1)) > target
    cpu = largest_fitting_chunk(LLAMA_3_8B, run, target, shared=True,
                                margin=partial(allocator_margin, device_type="cpu", expandable_segments=False))
    assert cpu.chunk == allocated.chunk


def test_expandable_segments_read_from_the_environment():
    assert expandable_segments_on({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert expandable_segments_on({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64, expandable_segments:true"})
    assert not expandable_segments_on({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    assert not expandable_segments_on({})
