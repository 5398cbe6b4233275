"""``local_rollout_forward_batch_size: auto``: the largest rollout chunk whose memory budget fits a target. How it
works: docs/ppo-internals.md#the-auto-rollout-chunk."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from functools import partial

import torch

from ...errors import UserInputError
from .budget import (GIB, LINEAR_MODULES, MemoryBudget, ModelShape, PPOShape, allocator_margin, expandable_segments_on,
                     planned_reserved_bytes, ppo_memory_budget)

__all__ = [
    "AUTO",
    "ChunkChoice",
    "largest_fitting_chunk",
    "memory_target_bytes",
    "resolve_auto_rollout_chunk",
    "rollout_chunk_value",
    "run_shape_from_models",
]

AUTO = "auto"


class RolloutChunkError(UserInputError, argparse.ArgumentTypeError):
    """A bad ``local_rollout_forward_batch_size``: a UserInputError, and argparse's type error so that
    ``HfArgumentParser`` (recipes, command lines) shows its message instead of a generic one."""


def positive_int_or_auto(value, key: str, error: type = UserInputError) -> int | str:
    """``value`` as given for an int-or-``"auto"`` key (an int, a numeric string from a command line or recipe, or
    ``"auto"``) -> a positive int or ``"auto"``; anything else raises ``error`` naming ``key``."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        try:
            value = int(text)
        except ValueError:
            raise error(f"{key}: must be a positive integer or 'auto', got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise error(f"{key}: must be a positive integer or 'auto', got {value!r}")
    return value


def rollout_chunk_value(value) -> int | str:
    """A ``local_rollout_forward_batch_size`` as given -> a positive int or ``"auto"``
    (:func:`positive_int_or_auto`). Also the field's argparse type, so ``--local_rollout_forward_batch_size auto``
    parses with ``HfArgumentParser``."""
    return positive_int_or_auto(value, "local_rollout_forward_batch_size", RolloutChunkError)


@dataclass(frozen=True)
class ChunkChoice:
    """The chosen chunk, the target, the budget at the chunk and at the next larger one (None at the batch cap)."""

    chunk: int
    target_bytes: int
    budget: MemoryBudget
    next_budget: MemoryBudget | None

    def describe(self) -> str:
        line = (f"local_rollout_forward_batch_size: auto -> {self.chunk} (predicted peak "
                f"{self.budget.peak / GIB:.2f} GiB of the {self.target_bytes / GIB:.2f} GiB target")
        if self.next_budget is None:
            return line + "; the whole per-device batch)"
        return line + f"; {self.chunk + 1} would need {self.next_budget.peak / GIB:.2f} GiB)"


def largest_fitting_chunk(shape: ModelShape, run: PPOShape, target_bytes: int, *, shared: bool,
                          value_model: bool = True, reward_model: bool = True, target_name: str = "max_memory_gib",
                          at_most: int | None = None, margin=None) -> ChunkChoice:
    """The largest ``rollout_chunk`` in ``1..run.batch`` whose :func:`ppo_memory_budget` peak is ``<= target_bytes``
    (or ``at_most`` if that is smaller). ``margin``: None, or ``chunk -> float``, the caching allocator's margin
    (:mod:`trl_ext.ppo.memory.budget`): the peak planned is then the reserved one.

    Raises:
        UserInputError: if even a chunk of 1 does not fit (the message names ``target_name``).
    """

    def budget(chunk: int) -> MemoryBudget:
        return ppo_memory_budget(shape, replace(run, rollout_chunk=chunk), shared=shared, value_model=value_model,
                                 reward_model=reward_model)

    def choice(chunk: int) -> ChunkChoice:
        return ChunkChoice(chunk=chunk, target_bytes=target_bytes, budget=budget(chunk),
                           next_budget=budget(chunk + 1) if chunk < run.batch else None)

    def planned(chunk: int) -> int:
        return planned_reserved_bytes(budget(chunk), margin(chunk)) if margin else budget(chunk).peak

    smallest = budget(1)
    if planned(1) > target_bytes:
        raise UserInputError(
            f"{target_name}: {target_bytes / GIB:.2f} GiB is less than this run needs even with a rollout chunk of 1 "
            f"({smallest.peak / GIB:.2f} GiB predicted, {smallest.peak_phase} phase largest); raise it, or lower "
            "per_device_train_batch_size or response_length"
        )
    lo, hi = 1, run.batch  # peak(lo) fits; the peak never decreases with the chunk: bisect
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if planned(mid) <= target_bytes:
            lo = mid
        else:
            hi = mid - 1
    if at_most is not None and at_most < lo:  # another process's choice (see resolve_auto_rollout_chunk)
        return choice(at_most)
    return choice(lo)


def memory_target_bytes(max_memory_gib: float | None, device: torch.device) -> int:
    """``max_memory_gib`` in bytes; if None, on CUDA, the device's free memory plus what this process's allocator
    already reserved (the loaded models: the budget counts them too). Other devices need ``max_memory_gib``."""
    if max_memory_gib is not None:
        return int(max_memory_gib * GIB)
    if device.type != "cuda":
        raise UserInputError(
            f"local_rollout_forward_batch_size: 'auto' on a {device.type} device needs max_memory_gib, the memory "
            "target in GiB (only on CUDA does it default to the device's free memory)"
        )
    free, _total = torch.cuda.mem_get_info(device)
    return int(free + torch.cuda.memory_reserved(device))


def _quantization(config) -> str | None:
    q = getattr(config, "quantization_config", None)
    if q is None:
        return None
    q = q.to_dict() if hasattr(q, "to_dict") else dict(q)
    if q.get("load_in_4bit"):
        return "nf4-nested" if q.get("bnb_4bit_use_double_quant") else "nf4"
    if q.get("load_in_8bit"):
        return "int8"
    return None


def run_shape_from_models(policy, args, prompt_length: int) -> tuple[ModelShape, PPOShape]:
    """The budget's :class:`ModelShape` and :class:`PPOShape` of a run from its loaded LoRA ``policy`` (a peft
    model), its :class:`trl_ext.PPOConfig` and the longest prompt in tokens."""
    peft_config = getattr(policy, "peft_config", None)
    if not peft_config:
        raise UserInputError(
            "local_rollout_forward_batch_size: 'auto' needs a LoRA policy (trl_ext.ppo.memory.budget models LoRA "
            "runs); give an integer for a policy trained in full"
        )
    lora = peft_config[getattr(policy, "active_adapter", None) or next(iter(peft_config))]
    targets = lora.target_modules
    targets = {targets} if isinstance(targets, str) else set(targets or ())
    modules = tuple(m for m in LINEAR_MODULES if m in targets)
    # all-linear, or module names the budget does not know (e.g. GPT-NeoX's fused query_key_value): count all layers
    modules = None if "all-linear" in targets or not modules or len(modules) == len(LINEAR_MODULES) else modules
    config = policy.config
    embeddings = policy.get_input_embeddings().weight
    quantization = _quantization(config)
    if quantization is None:
        dtype_bytes = embeddings.element_size()
    else:
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        dtype_bytes = dtype.itemsize if isinstance(dtype, torch.dtype) else 2
    shape = ModelShape.from_config(config)
    run = PPOShape(
        batch=args.local_batch_size,
        micro_batch=args.per_device_train_batch_size,
        rollout_chunk=1,
        prompt_length=prompt_length,
        response_length=args.response_length,
        lora_r=lora.r,
        quantization=quantization,
        lora_modules=modules,
        dtype_bytes=dtype_bytes,
        upcast_non_quantized=embeddings.element_size() == 4,
    )
    return shape, run


def resolve_auto_rollout_chunk(args, accelerator, policy, prompt_length: int, *, shared: bool, value_model: bool,
                               reward_model: bool) -> ChunkChoice:
    """Choose ``args.local_rollout_forward_batch_size`` for ``"auto"`` and write it into ``args`` (once, before
    anything reads it).

    Called once by :class:`trl_ext.PPOTrainer` after its models are prepared: ``policy`` (unwrapped), the longest
    train prompt, whether policy, reward and value model share a base, whether the run has a value model and a reward
    model. Under several processes every process takes the smallest of their choices (the scoring passes must run as
    many forward calls on each rank).
    """
    shape, run = run_shape_from_models(policy, args, prompt_length)
    kwargs = dict(
        shared=shared,
        value_model=value_model,  # critic-free runs hold a parameterless stand-in, no value model
        reward_model=reward_model,  # reward functions only: none (models among them: not counted)
        target_name="max_memory_gib" if args.max_memory_gib is not None else "the device's free memory",
    )
    target = memory_target_bytes(args.max_memory_gib, accelerator.device)
    kwargs["margin"] = partial(allocator_margin, device_type=accelerator.device.type,
                               expandable_segments=expandable_segments_on(),
                               continuous_batching=args.rollout_engine == "continuous_batching")
    choice = largest_fitting_chunk(shape, run, target, **kwargs)
    if accelerator.num_processes > 1:
        smallest = int(accelerator.gather(torch.tensor([choice.chunk], device=accelerator.device)).min())
        choice = largest_fitting_chunk(shape, run, target, at_most=smallest, **kwargs)
    args.local_rollout_forward_batch_size = choice.chunk
    accelerator.print(choice.describe())
    return choice
