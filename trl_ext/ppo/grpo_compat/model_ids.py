"""Models given to :class:`trl_ext.PPOTrainer` as a model id or a local path, loaded as TRL's `GRPOTrainer` loads
them. How it works: docs/ppo-internals.md#models-given-by-id."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...field_rules import MappingArgs, mapping_field
from ...errors import UserInputError

__all__ = ["ModelInitArgs", "LoadedModels", "load_model_ids"]


@dataclass
class ModelInitArgs(MappingArgs):
    """Config field of models given by id, mixed into :class:`trl_ext.PPOConfig` (TRL `GRPOConfig`'s key).

    Parameters:
        model_init_kwargs (`dict[str, Any]`, *optional*):
            Keyword arguments of `from_pretrained` for the models the trainer gets as a model id or path (`model`,
            `ref_model`, `reward_model`, `value_model`, model ids in `reward_funcs`), e.g. `{"dtype": "bfloat16"}`;
            `revision` and `trust_remote_code` also apply to the tokenizer loaded when `processing_class` is None.
            As TRL's `GRPOConfig` key (its `trust_remote_code` goes here as `trust_remote_code`). Recipes load
            their models from their model keys instead and refuse it.
    """

    model_init_kwargs: dict[str, Any] | str | None = mapping_field(
        "from_pretrained keyword arguments of the models given to PPOTrainer as ids (GRPOConfig's key).")


class LoadedModels(NamedTuple):
    """The trainer's model arguments with every id or path replaced by the loaded model."""

    processing_class: Any
    model: Any
    ref_model: Any
    reward_model: Any
    value_model: Any
    reward_funcs: Any


def _is_id(value) -> bool:
    return isinstance(value, (str, os.PathLike))


def _init_kwargs(args) -> dict:
    """GRPOTrainer's `from_pretrained` kwargs: `model_init_kwargs`, `device_map` None under DDP/DeepSpeed."""
    kwargs = dict(getattr(args, "model_init_kwargs", None) or {})
    if args.distributed_state.distributed_type in ("MULTI_GPU", "DEEPSPEED"):
        kwargs["device_map"] = None
    kwargs.setdefault("trust_remote_code", False)
    return kwargs


def _load_failed(role: str, name, err: Exception) -> UserInputError:
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    return UserInputError(f"{role}: cannot load {os.fspath(name)!r}: {first}")


def _causal_lm(role: str, name, args):
    from ...trl_internals import create_model_from_path

    try:
        return create_model_from_path(os.fspath(name), **_init_kwargs(args))
    except (OSError, ValueError) as err:
        raise _load_failed(role, name, err) from None


def _scalar_model(role: str, name, args, tokenizer):
    import torch
    from trl import ModelConfig

    from ...models.loaders import load_scalar_model

    kwargs = _init_kwargs(args)
    dtype = kwargs.get("dtype", "float32")  # GRPOTrainer's default for the policy; the same for these
    kwargs["dtype"] = getattr(torch, dtype) if dtype in ("bfloat16", "float16", "float32") else dtype
    try:
        return load_scalar_model(ModelConfig(model_name_or_path=os.fspath(name)), tokenizer=tokenizer, **kwargs)
    except (OSError, ValueError) as err:
        raise _load_failed(role, name, err) from None


def _tokenizer(model, args):
    from transformers import AutoTokenizer

    from ...models.loaders import set_pad_token

    name = getattr(model.config, "_name_or_path", None)
    if not name:
        raise UserInputError("processing_class: None, and the model does not say where it was loaded from; pass "
                             "processing_class=AutoTokenizer.from_pretrained(...)")
    kwargs = _init_kwargs(args)
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, revision=kwargs.get("revision"),
                                                  trust_remote_code=kwargs["trust_remote_code"],
                                                  padding_side="left", truncation_side="left")
    except (OSError, ValueError) as err:
        raise _load_failed("processing_class", name, err) from None
    set_pad_token(tokenizer)
    return tokenizer


def load_model_ids(args, processing_class, model, ref_model, reward_model, value_model, reward_funcs) -> LoadedModels:
    """The trainer's model arguments with ids and paths loaded and a tokenizer when none is given (module
    docstring); unchanged when every model is loaded and `processing_class` is given."""
    if model is None:
        raise UserInputError("model: required: a loaded causal LM, or a model id or local path (as GRPOTrainer takes)")
    funcs = reward_funcs if isinstance(reward_funcs, list) else [reward_funcs]
    ids = [m for m in (model, ref_model, reward_model, value_model, *funcs) if _is_id(m)]
    if not ids and processing_class is not None:
        return LoadedModels(processing_class, model, ref_model, reward_model, value_model, reward_funcs)
    from transformers import set_seed

    from ...models.loaders import set_pad_token

    set_seed(args.seed)
    loaded = []
    if _is_id(model):
        model = _causal_lm("model", model, args)
        loaded.append(model)
    if processing_class is None:
        processing_class = _tokenizer(model, args)
    if _is_id(ref_model):
        ref_model = _causal_lm("ref_model", ref_model, args)
        loaded.append(ref_model)
    if _is_id(reward_model):
        reward_model = _scalar_model("reward_model", reward_model, args, processing_class)
    if _is_id(value_model):
        value_model = _scalar_model("value_model", value_model, args, processing_class)
    funcs = [_scalar_model("reward_funcs", f, args, processing_class) if _is_id(f) else f for f in funcs]
    for lm in loaded:  # as GRPOTrainer: the model agrees with the tokenizer on the pad token
        set_pad_token(processing_class, lm)
    if reward_funcs is not None:
        reward_funcs = funcs if isinstance(reward_funcs, list) else funcs[0]
    return LoadedModels(processing_class, model, ref_model, reward_model, value_model, reward_funcs)
