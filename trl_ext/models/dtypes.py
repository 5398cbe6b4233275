"""Which dtype each parameter has, and keeping it so: the rule, and what makes it hold. How it works:
docs/internals.md#dtypes."""

from __future__ import annotations

import torch

__all__ = [
    "KeptParameterDtypes",
    "QUANTIZED_STORAGE_DTYPES",
    "cast_inputs_to_weight_dtype",
    "dtype_rule_violations",
    "float32_trainable_parameters",
    "prepare_kbit_model_keeping_dtypes",
]

QUANTIZED_STORAGE_DTYPES = (torch.uint8, torch.int8)
"""bitsandbytes' storage of 4-bit (``uint8``, or ``bnb_4bit_quant_storage``) and 8-bit (``int8``) weights."""

_CAST_HOOK_ATTR = "_trl_ext_casts_inputs"


def _is_quantized_storage(param: torch.nn.Parameter) -> bool:
    return type(param).__name__ in ("Params4bit", "Int8Params") or param.dtype in QUANTIZED_STORAGE_DTYPES


def dtype_rule_violations(model: torch.nn.Module, requested: torch.dtype | None, *, fp16: bool = False) -> list[str]:
    """Parameters of ``model`` that break the rule above, as ``"name: dtype"`` lines (empty: the rule holds).

    Args:
        model: any model (plain, peft, a trainer's wrapper).
        requested: the recipe's ``dtype`` as a ``torch.dtype`` (``None``/``"auto"``: the checkpoint's; pass it).
        fp16: the run uses mixed-precision float16 (``fp16: true``): trainable parameters must be float32.
    """
    allowed = {torch.float32} | ({requested} if isinstance(requested, torch.dtype) else set())
    bad = []
    for name, param in model.named_parameters():
        if _is_quantized_storage(param):
            continue
        if param.dtype not in allowed or (fp16 and param.requires_grad and param.dtype != torch.float32):
            bad.append(f"{name}: {str(param.dtype).removeprefix('torch.')}{' (trainable)' * param.requires_grad}")
    return bad


def float32_trainable_parameters(*models: torch.nn.Module) -> int:
    """Cast every trainable floating-point parameter of ``models`` that is not float32 to float32 (in place, same
    ``Parameter`` objects: an optimizer over them stays valid). Returns how many were cast."""
    count = 0
    params = {id(p): p for m in models if isinstance(m, torch.nn.Module) for p in m.parameters()}
    for param in params.values():
        if param.requires_grad and param.is_floating_point() and param.dtype != torch.float32:
            param.data = param.data.to(torch.float32)
            count += 1
    return count


def _cast_input_hook(module: torch.nn.Module, args: tuple):
    weight = getattr(module, "weight", None)
    if weight is None or not args or not torch.is_tensor(args[0]) or not args[0].is_floating_point():
        return None
    if args[0].dtype == weight.dtype or torch.is_autocast_enabled(args[0].device.type):
        return None  # under autocast the matmul dtype is autocast's: leave the numbers exactly as they were
    return (args[0].to(weight.dtype), *args[1:])


def cast_inputs_to_weight_dtype(module: torch.nn.Module) -> int:
    """Make every ``nn.Linear`` in ``module`` (e.g. a score head, also inside peft's ``modules_to_save`` wrapper)
    cast its input to its weight's dtype when autocast is off; idempotent. Returns the number of layers hooked.

    peft's LoRA layers do the same for their adapters. Under autocast nothing changes (autocast picks the matmul
    dtype). Copies made later with ``copy.deepcopy`` (peft's ``modules_to_save``) keep the hook."""
    count = 0
    for layer in module.modules():
        if isinstance(layer, torch.nn.Linear):
            if not getattr(layer, _CAST_HOOK_ATTR, False):
                layer.register_forward_pre_hook(_cast_input_hook)
                setattr(layer, _CAST_HOOK_ATTR, True)
            count += 1
    return count


def prepare_kbit_model_keeping_dtypes(model, *, gradient_checkpointing: bool, gradient_checkpointing_kwargs=None):
    """peft's ``prepare_model_for_kbit_training`` but for its float32 upcast of the non-quantized weights.

    What peft does and this does too (written out here because peft has no switch for the upcast alone): freeze
    every parameter; with ``gradient_checkpointing``, make the input embeddings' output require gradients when
    checkpointing is reentrant (the inputs of a reentrant checkpoint must require grad) and enable transformers'
    checkpointing with ``gradient_checkpointing_kwargs``. Embeddings, LM head and norms keep the dtype they were
    loaded in (the 4-bit compute dtype); the norms still compute in float32 inside (transformers' RMSNorm does).
    """
    kwargs = dict(gradient_checkpointing_kwargs or {})
    for param in model.parameters():
        param.requires_grad = False
    if gradient_checkpointing:
        if kwargs.get("use_reentrant", True):
            model.enable_input_require_grads()
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.23
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:  # pragma: no cover - transformers < 5.23
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


class KeptParameterDtypes:
    """Keeps the dtypes a model was loaded with through a TRL trainer's constructor.

    ``kept = KeptParameterDtypes(model)`` before ``super().__init__``, ``kept.restore(self.model, fp16=...)`` after:
    a parameter the constructor recast (TRL's bfloat16 cast of a quantized model's trainable parameters) gets its
    own tensor back (same values); one the constructor created and cast (LoRA weights of a ``peft_config`` given
    to the trainer) becomes float32, as peft creates them (its values were rounded to bfloat16 by TRL: a slightly
    different initialisation, nothing more). With ``fp16`` every trainable parameter becomes float32.
    """

    def __init__(self, model):
        params = model.parameters() if isinstance(model, torch.nn.Module) else ()
        self.saved = {id(p): (p, p.data) for p in params if p.requires_grad}

    def restore(self, model: torch.nn.Module, *, fp16: bool = False) -> int:
        """Undo the constructor's recasts; returns how many parameters changed."""
        count = 0
        for param in model.parameters():
            if not param.requires_grad or not param.is_floating_point():
                continue
            entry = self.saved.get(id(param))
            if entry is not None and entry[0] is param:
                before = entry[1]
                if param.dtype != before.dtype:
                    same_place = before.device == param.device and before.shape == param.shape
                    param.data = before if same_place else param.data.to(before.dtype)
                    count += 1
            elif param.dtype == torch.bfloat16 and _quantized(model):
                param.data = param.data.to(torch.float32)
                count += 1
        if fp16:
            count += float32_trainable_parameters(model)
        return count


class KeepLoadedDtypesMixin:
    """Mixin for a trainer whose TRL parent recasts parameters in its constructor (TRL's `SFTTrainer`,
    `RewardTrainer`, `DPOTrainer` cast a quantized model's trainable parameters to bfloat16): the parameters keep the
    dtypes they were loaded with (:class:`KeptParameterDtypes`), and with `fp16` every trainable one is float32. Put
    it before the TRL class in the bases; the model is the constructor's first argument or `model=`."""

    def __init__(self, *args, **kwargs):
        kept = KeptParameterDtypes(kwargs["model"] if "model" in kwargs else (args[0] if args else None))
        super().__init__(*args, **kwargs)
        kept.restore(self.model, fp16=self.args.fp16)


def _quantized(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))
