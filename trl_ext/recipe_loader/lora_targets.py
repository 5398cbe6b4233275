"""`trl-ext check`: LoRA ``target_modules`` against the model's modules, without loading any weight.

Each model of the recipe that gets a LoRA adapter (the trained model; PPO's reward and value models with
``reward_use_peft``/``value_use_peft``) is built on the meta device from its ``config.json`` (``accelerate``'s
``init_empty_weights``: no weight is read or allocated), and :func:`trl_ext.models.lora.check_lora_targets` matches
the ``lora_target_modules`` entries against its module names, as peft will. The config is read from a local
checkpoint, a built ``tiny://`` model or the Hugging Face cache (``local_files_only``: no network); a model whose
config is not on this machine is left to ``trl-ext train``, which checks after loading. Adapter directories (a
LoRA reward model) bring their own LoRA settings and are not checked here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import UserInputError

__all__ = ["check_recipe_lora_targets", "meta_model"]


def _local_config(path: str, trust_remote_code: bool = False):
    from transformers import AutoConfig

    from .loader import resolve_tiny_name

    local = Path(resolve_tiny_name(path)).expanduser()
    if local.is_dir() and not (local / "config.json").exists():
        return None  # an adapter directory, or not a model
    try:
        return AutoConfig.from_pretrained(str(local) if local.is_dir() else path, local_files_only=True,
                                          trust_remote_code=trust_remote_code)
    except Exception:  # noqa: BLE001 - not on this machine (a hub model never downloaded): `train` checks it
        return None


def meta_model(config, *, scalar: bool):
    """A model of ``config``'s architecture on the meta device (no weights): a causal LM, or with ``scalar`` a
    one-output sequence classifier (the reward/value models)."""
    import copy

    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    with init_empty_weights():
        if scalar:
            config = copy.deepcopy(config)
            config.num_labels = 1
            return AutoModelForSequenceClassification.from_config(config)
        return AutoModelForCausalLM.from_config(config)


def _check(model_args, *, key_prefix: str, scalar: bool) -> Optional[str]:
    """Check one model's targets; returns a note when its config is not on this machine."""
    from ..models.lora import check_lora_targets, lora_config_for

    if model_args is None or not model_args.use_peft or not model_args.model_name_or_path:
        return None
    lora_config = lora_config_for(model_args, task_type="SEQ_CLS" if scalar else "CAUSAL_LM")
    targets = None if lora_config is None else lora_config.target_modules
    if targets is None or targets == "all-linear" or (not isinstance(targets, str) and "all-linear" in targets):
        return None  # peft's default modules, or every Linear: nothing to match
    config = _local_config(model_args.model_name_or_path, bool(getattr(model_args, "trust_remote_code", False)))
    if config is None:
        return (f"{key_prefix}lora_target_modules not matched against '{model_args.model_name_or_path}': its "
                "config.json is not on this machine (train checks it after loading)")
    try:
        model = meta_model(config, scalar=scalar)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build here: train reports it
        return None
    try:
        check_lora_targets(model, lora_config)
    except UserInputError as err:
        message = str(err)
        if message.startswith("lora_target_modules "):
            message = message[len("lora_target_modules "):]
        raise UserInputError(f"recipe: key '{key_prefix}lora_target_modules': {message} "
                             f"('{model_args.model_name_or_path}', built without weights)") from None
    return None


def check_recipe_lora_targets(recipe) -> list[str]:
    """Check the LoRA targets of every model of ``recipe`` that gets a LoRA adapter; returns notes for the models
    whose config is not on this machine. Raises a one-line :class:`UserInputError` naming the key."""
    notes = [_check(recipe.model_args, key_prefix="", scalar=recipe.trainer == "reward")]
    if recipe.trainer == "ppo" and not recipe.pipeline.shared_base:
        notes.append(_check(recipe.reward_model_args, key_prefix="reward_", scalar=True))
        notes.append(_check(recipe.value_model_args, key_prefix="value_", scalar=True))
    return [n for n in notes if n]
