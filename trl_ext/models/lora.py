"""LoRA adapters from a ``trl.ModelConfig``: TRL's :func:`trl.get_peft_config` plus target checks.

Two things TRL does not do: it leaves the LoRA ``task_type`` to the user (a reward model wrapped as
``CAUSAL_LM`` does not save its score head, TRL #1379), and it passes unknown target module names on to peft,
whose error does not say which modules exist. :func:`lora_config_for` fixes the task type for the model being
loaded; :func:`check_lora_targets` names the missing targets and lists the Linear modules that are there.
"""

from __future__ import annotations

import copy
import re

from ..errors import UserInputError


def lora_config_for(model_args, *, task_type: str, modules_to_save: list[str] | None = None):
    """The ``peft.LoraConfig`` described by ``model_args`` (``use_peft``, ``lora_*``), or ``None``.

    Args:
        model_args: a ``trl.ModelConfig``.
        task_type: ``"CAUSAL_LM"`` for a policy, ``"SEQ_CLS"`` for a scalar (reward/value) model; replaces
            ``model_args.lora_task_type``, which must match the model class being loaded anyway.
        modules_to_save: module names trained in full and saved with the adapter, added to
            ``model_args.lora_modules_to_save`` (e.g. ``["score"]`` for a scalar head).
    """
    from trl import get_peft_config

    model_args = copy.copy(model_args)  # TRL reads fields only; never mutate the caller's config
    if not model_args.use_peft:
        return None
    model_args.lora_task_type = task_type
    targets = model_args.lora_target_modules
    # trl.ModelConfig turns a one-element list into a bare string, which peft then reads as a regex that must
    # match a module's FULL name: ["q_proj"] would match nothing. A plain name means "modules with this name".
    if isinstance(targets, str) and targets != "all-linear" and re.fullmatch(r"[A-Za-z_][\w.]*", targets):
        model_args.lora_target_modules = [targets]
    extra = list(modules_to_save or [])
    if extra:
        model_args.lora_modules_to_save = list(
            dict.fromkeys(list(model_args.lora_modules_to_save or []) + extra)
        )
    return get_peft_config(model_args)


def linear_module_names(model) -> list[str]:
    """Sorted short names of the ``torch.nn.Linear`` modules (incl. bitsandbytes' Linear4bit/8bitLt) in ``model``."""
    import torch

    return sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def check_lora_targets(model, lora_config) -> None:
    """Raise a one-line :class:`UserInputError` when ``lora_target_modules`` names modules absent from ``model``.

    Matching follows peft: a list entry matches a module whose name is the entry or ends with ``.entry``; a
    string is a regular expression that must match a module's full name; ``"all-linear"`` always matches.
    ``model`` may be an empty (meta-device) skeleton: only module names are read.
    """
    if lora_config is None:
        return
    targets = lora_config.target_modules
    names = [name for name, _ in model.named_modules() if name]
    available = ", ".join(linear_module_names(model))
    if targets is None:
        if lora_config.target_parameters:
            return
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

        model_type = getattr(getattr(model, "config", None), "model_type", None)
        if model_type not in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
            raise UserInputError(
                f"lora_target_modules is not set and peft has no default for model type {model_type!r}: "
                f"set it to 'all-linear' or some of the model's Linear modules: {available}"
            )
        return
    if isinstance(targets, str):
        if targets == "all-linear" or any(re.fullmatch(targets, n) for n in names):
            return
        raise UserInputError(
            f"lora_target_modules {targets!r} (a regex over full module names) matches no module of the model; "
            f"its Linear modules are: {available}"
        )
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise UserInputError(
            f"lora_target_modules {sorted(missing)} not found in the model; its Linear modules are: {available}"
        )
