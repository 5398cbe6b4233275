"""bitsandbytes 4-bit/8-bit loading: checks, config, device map, and the CPU gradient fix.

The quantization config itself comes from TRL's :func:`trl.get_quantization_config`; this module adds what TRL
leaves out: clear errors for impossible requests, a compute dtype when ``dtype="auto"``, a device map for
quantized loading on accelerators, and :func:`disable_bnb_cpu_weight_repacking`, without which 4-bit LoRA
training on some CPUs silently computes wrong gradients.
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings

from ..errors import UserInputError


def bitsandbytes_unavailable_reason() -> str | None:
    """Why bitsandbytes cannot be used for quantized loading here, or ``None`` when it can."""
    try:
        importlib.import_module("bitsandbytes")
    except Exception as exc:  # ImportError, or a broken native library raising anything at import time
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    from transformers.utils import is_bitsandbytes_available

    if not is_bitsandbytes_available():
        return "transformers does not consider the installed bitsandbytes usable"
    return None


def check_quantization_request(model_args) -> None:
    """Refuse impossible quantization options of a ``trl.ModelConfig`` before anything is loaded.

    Raises:
        UserInputError: both ``load_in_4bit`` and ``load_in_8bit`` are set, ``bnb_4bit_quant_type`` is not
            ``nf4``/``fp4``, or quantization is asked for and bitsandbytes is not usable.
    """
    if model_args.load_in_4bit and model_args.load_in_8bit:
        raise UserInputError(
            "load_in_4bit and load_in_8bit are both set: choose one (4-bit for QLoRA, 8-bit for LLM.int8)"
        )
    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return
    if model_args.load_in_4bit and model_args.bnb_4bit_quant_type not in ("nf4", "fp4"):
        raise UserInputError(
            f"bnb_4bit_quant_type={model_args.bnb_4bit_quant_type!r} is not supported: use 'nf4' or 'fp4'"
        )
    reason = bitsandbytes_unavailable_reason()
    if reason is not None:
        key = "load_in_4bit" if model_args.load_in_4bit else "load_in_8bit"
        raise UserInputError(
            f"{key} needs bitsandbytes, which is not usable here ({reason}); "
            f"run `pip install bitsandbytes` or set {key} to false"
        )


def quantization_config_for(model_args, checkpoint_config=None):
    """TRL's :func:`trl.get_quantization_config` for ``model_args``, or ``None`` when not quantizing.

    TRL uses ``model_args.dtype`` as the 4-bit compute dtype, which fails for ``dtype="auto"``; then the
    checkpoint's own dtype (from ``checkpoint_config``) is used, else float32.
    """
    from trl import get_quantization_config

    if not (model_args.load_in_4bit or model_args.load_in_8bit):
        return None
    if model_args.load_in_4bit and model_args.dtype == "auto":
        stored = getattr(checkpoint_config, "dtype", None) if checkpoint_config is not None else None
        name = str(stored).removeprefix("torch.") if stored is not None else "float32"
        if name not in ("bfloat16", "float16", "float32"):
            name = "float32"
        model_args = dataclasses.replace(model_args, dtype=name)
    return get_quantization_config(model_args)


def kbit_device_map() -> dict | None:
    """Device map for a quantized model: this process's accelerator, or ``None`` on CPU.

    What TRL 0.x's ``get_kbit_device_map`` gives; TRL 1.12 and later do not ship it.
    """
    import torch

    if torch.cuda.is_available():
        from accelerate import PartialState

        return {"": PartialState().local_process_index}
    return None


def disable_bnb_cpu_weight_repacking(model) -> int:
    """Keep 4-bit LoRA gradients correct on CPU: turn off bitsandbytes' CPU inference repacking.

    On CPUs with AVX512-BF16, bitsandbytes (0.50) repacks a ``Linear4bit`` layer's weights into a fused-kernel
    layout the first time the layer runs in ``eval()`` mode under ``no_grad`` (any evaluation, ``generate``,
    or a reward/DPO/PPO eval loop). From then on its matmul goes through ``bitsandbytes::gemv_4bit``, which has
    no autograd kernel: gradients flowing back through the frozen 4-bit weights into earlier LoRA adapters
    become wrong (relative error ~0.8 against an fp32 model with the dequantized weights) and training silently
    degrades; the only sign is a UserWarning about ``gemv_4bit``. Setting ``support_avx512bf16_for_cpu = False``
    on every ``Linear4bit`` keeps the layer on the differentiable dequantize-and-matmul path, so gradients stay
    exact after any number of eval passes. It costs only CPU inference speed, and does nothing on GPUs.

    Call it right after loading, before the first forward pass; the loaders in :mod:`trl_ext.models` do.
    Layers that were already repacked cannot be restored exactly: a warning says so.

    Returns:
        The number of ``Linear4bit`` layers seen (0 when bitsandbytes is missing or the model is not 4-bit).
    """
    try:
        from bitsandbytes.nn import Linear4bit
    except Exception:
        return 0
    count = 0
    repacked = []
    for name, module in model.named_modules():
        if isinstance(module, Linear4bit):
            module.support_avx512bf16_for_cpu = False
            count += 1
            if getattr(getattr(module.weight, "quant_state", None), "packing_format_for_cpu", False):
                repacked.append(name)
    if repacked:
        warnings.warn(
            f"{len(repacked)} 4-bit layers (e.g. {repacked[0]}) were already repacked for CPU inference before "
            "disable_bnb_cpu_weight_repacking ran; gradients through them are wrong. Reload the model.",
            stacklevel=2,
        )
    return count


def prepare_quantized_model(model, *, gradient_checkpointing: bool, gradient_checkpointing_kwargs=None,
                            upcast_non_quantized: bool = True):
    """peft's ``prepare_model_for_kbit_training`` (freeze, upcast the non-quantized weights to float32, optional
    checkpointing), then the CPU fix. ``upcast_non_quantized=False`` skips the upcast only
    (:func:`trl_ext.models.dtypes.prepare_kbit_model_keeping_dtypes`): embeddings, LM head and norms stay in the
    dtype they were loaded in.

    Only call it on a model loaded in 4 or 8 bits.
    """
    from peft import prepare_model_for_kbit_training

    from .dtypes import prepare_kbit_model_keeping_dtypes

    disable_bnb_cpu_weight_repacking(model)
    if not upcast_non_quantized:
        return prepare_kbit_model_keeping_dtypes(
            model, gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
        )
    return prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=gradient_checkpointing,
        gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
    )
