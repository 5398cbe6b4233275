"""``train_micro_batch_size``: how many sequences each forward/backward of the PPO epochs takes: its value, and
``auto``, the largest micro-batch whose training phase fits the memory target (how the update stays the same at any
micro-batch: :func:`trl_ext.ppo.optimize_loop.micro_batch_weights`). How it works: docs/ppo-internals.md#micro-batches-of-the-ppo-epochs."""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from ...errors import UserInputError
from .budget import DEVICE_OVERHEAD_BYTES, GIB, allocator_margin, expandable_segments_on, ppo_memory_budget
from .chunk import AUTO, memory_target_bytes, positive_int_or_auto, run_shape_from_models

__all__ = ["balanced_micro_batch", "largest_fitting_micro_batch", "micro_batch_value", "resolve_train_micro_batch"]

KEY = "train_micro_batch_size"


class MicroBatchError(UserInputError, argparse.ArgumentTypeError):
    """A bad ``train_micro_batch_size`` (also argparse's type error, so command lines show this message)."""


def micro_batch_value(value) -> int | str | None:
    """A ``train_micro_batch_size`` as given (None, an int, a numeric string, ``"auto"``) -> None, a positive int or
    ``"auto"``. Also the field's argparse type."""
    return None if value is None else positive_int_or_auto(value, KEY, MicroBatchError)


def largest_fitting_micro_batch(shape, run, target_bytes: int, *, shared: bool, value_model: bool = True,
                                reward_model: bool = True, target_name: str = "max_memory_gib",
                                margin: float = 1.0) -> int:
    """The largest micro-batch in ``1..run.batch`` (one mini-batch) whose budget of the training phase plus the
    persistent memory and the device overhead (:func:`ppo_memory_budget` with ``micro_batch`` = it; the allocator's
    part times ``margin``, :mod:`trl_ext.ppo.memory.budget`) is ``<= target_bytes``. Raises UserInputError
    (naming ``target_name``) when even 1 does not fit."""

    def need(micro: int) -> int:
        budget = ppo_memory_budget(shape, replace(run, micro_batch=micro), shared=shared, value_model=value_model,
                                   reward_model=reward_model)
        allocated = budget.peak - max(budget.phases.values()) + budget.phases["training"] - DEVICE_OVERHEAD_BYTES
        return int(DEVICE_OVERHEAD_BYTES + allocated * margin)

    if need(1) > target_bytes:
        raise UserInputError(f"{target_name}: {target_bytes / GIB:.2f} GiB is less than the training phase needs even "
                             f"with {KEY}: 1 ({need(1) / GIB:.2f} GiB predicted); raise it or lower response_length")
    lo, hi = 1, run.batch  # need() never decreases with the micro-batch: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if need(mid) <= target_bytes else (lo, mid - 1)
    return lo


def balanced_micro_batch(largest: int, mini_batch: int) -> int:
    """The smallest micro-batch that cuts ``mini_batch`` into as few passes as ``largest`` does: 15 of 16 would run
    15 + 1 (the second pass all per-call overhead), 8 gives the same two passes with about half the training
    activations. Measured on one H200 (8B, ``benchmarks/README.md`` section 7): ``auto`` chose 15 of 16."""
    passes = -(-mini_batch // max(largest, 1))
    return -(-mini_batch // passes)


def resolve_train_micro_batch(args, accelerator, policy, prompt_length: int, *, shared: bool, value_model: bool,
                              reward_model: bool) -> int:
    """The micro-batch of the PPO epochs (``train_micro_batch_size``; ``"auto"`` chosen and printed: from the
    unwrapped ``policy``, the longest train prompt and which models the run holds, as the rollout chunk's
    :func:`~trl_ext.ppo.memory.chunk.resolve_auto_rollout_chunk`). Under several processes each takes the smallest
    of their choices."""
    if accelerator.distributed_type.value == "DEEPSPEED":
        raise UserInputError(f"{KEY}: not supported under DeepSpeed (its engine counts the accumulation steps); "
                             "use per_device_train_batch_size and gradient_accumulation_steps")
    micro = args.train_micro_batch_size
    if micro == AUTO:
        shape, run = run_shape_from_models(policy, args, prompt_length)
        run = replace(run, batch=args.local_mini_batch_size,
                      rollout_chunk=int(args.local_rollout_forward_batch_size))
        micro = largest_fitting_micro_batch(
            shape, run, memory_target_bytes(args.max_memory_gib, accelerator.device),
            shared=shared, value_model=value_model, reward_model=reward_model,
            target_name="max_memory_gib" if args.max_memory_gib is not None else "the device's free memory",
            margin=allocator_margin(run.rollout_chunk, device_type=accelerator.device.type,
                                    expandable_segments=expandable_segments_on()))
        if accelerator.num_processes > 1:
            micro = int(accelerator.gather(torch.tensor([micro], device=accelerator.device)).min())
        micro = balanced_micro_batch(micro, args.local_mini_batch_size)
        accelerator.print(f"{KEY}: auto -> {micro} (the fewest passes whose training phase fits beside the "
                          "persistent memory, as even as they go)")
    return min(int(micro), args.local_mini_batch_size)
