"""Value checks of recipe keys that the configs cannot make themselves, and the bridge from the configs' errors. How
it works: docs/internals-recipes.md#recipe-validation."""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from ..field_rules import INT64_MAX, MODEL_PREFIXES, RANGES, Bound, KeySpec, key_specs, value_problem
from ..errors import UserInputError

__all__ = ["INT64_MAX", "MODEL_PREFIXES", "RANGES", "Bound", "KeySpec", "key_specs", "check_null", "check_value",
           "check_namespace", "recipe_message", "find_culprit", "check_lora", "check_value_trains",
           "check_model_limits", "check_episodes"]

# ----------------------------------------------------------------------------------------------------------------
# The checks


def check_null(key: str, spec: KeySpec) -> None:
    """``key: null`` where the key cannot be null."""
    if not spec.nullable:
        raise UserInputError(f"recipe: key '{key}': null is not valid (valid: {spec.describe()})")


def check_value(key: str, value: Any, spec: KeySpec) -> None:
    """A parsed value of ``key`` against its choices, finiteness, size and range (lists: each element)."""
    problem = value_problem(value, spec)
    if problem:
        raise UserInputError(f"recipe: key '{key}': {problem}")


def check_namespace(namespace, keys, specs: dict[str, KeySpec]) -> None:
    """Check the parsed values of the recipe's explicit ``keys`` (an argparse namespace, before the dataclasses are
    built, so that these one-line errors come before the libraries' own). ``specs``: the keys to check here (those
    of the dataclasses that do not check their own fields)."""
    for key in keys:
        spec = specs.get(key)
        if spec is not None and hasattr(namespace, key):
            check_value(key, getattr(namespace, key), spec)


def recipe_message(message: str, keys) -> str:
    """A config's one-line error ``<key>: <problem>`` as the recipe's ``recipe: key '<key>': <problem>`` (``keys``:
    the recipe's valid keys); other messages unchanged."""
    m = re.match(r"(\w+): (.*)", message, re.S)
    if m and m.group(1) in keys:
        return f"recipe: key '{m.group(1)}': {m.group(2)}"
    return message


def find_culprit(message: str, keys: list[str], builds: Callable[[list[str]], bool]) -> Optional[str]:
    """The recipe key a library's validation error is about.

    A key the message names (as ``key`` or ``--key``; the longest match wins) if the recipe sets it; else the
    first key whose removal from the recipe makes the configs build (``builds(keys_left)``); else None.
    """
    named = [k for k in keys if re.search(rf"(?<![\w]){re.escape(k)}(?![\w])", message)]
    if named:
        return max(named, key=len)
    for key in keys:
        if key == "trainer":
            continue
        try:
            if builds([k for k in keys if k != key]):
                return key
        except Exception:  # noqa: BLE001 - still failing without the key: not the culprit
            continue
    return None


def check_lora(model_args, *, prefix: str = "") -> None:
    """Build peft's ``LoraConfig`` from a ``ModelConfig`` with ``use_peft`` and turn its ``ValueError`` into one line
    naming the ``<prefix>lora_*`` key (peft's own validation; the ranges of r, alpha and dropout are in RANGES)."""
    if not getattr(model_args, "use_peft", False):
        return
    from ..models.lora import lora_config_for

    try:
        lora_config_for(model_args, task_type="CAUSAL_LM")
    except UserInputError:
        raise
    except (ValueError, TypeError) as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        peft_to_key = {"r": "lora_r", "target_modules": "lora_target_modules", "modules_to_save":
                       "lora_modules_to_save", "use_dora": "use_dora", "use_rslora": "use_rslora"}
        key = next((k for p, k in peft_to_key.items() if re.search(rf"\b{p}\b", msg)), "use_peft")
        raise UserInputError(f"recipe: key '{prefix}{key}': {msg}") from None


def check_value_trains(value_args) -> None:
    """A quantized value model trains only through a LoRA adapter: refuse one without (it would stay frozen)."""
    if value_args is not None and (value_args.load_in_4bit or value_args.load_in_8bit) and not value_args.use_peft:
        bits = "4" if value_args.load_in_4bit else "8"
        raise UserInputError(
            f"recipe: a {bits}-bit value model (value_load_in_{bits}bit, or the policy's quantization it follows) "
            "without a LoRA adapter would train nothing (a quantized model trains through its adapter): set "
            f"value_use_peft: true, or value_load_in_{bits}bit: false to train the value model in full")


def check_model_limits(trainer: str, training_args, model_config: Optional[dict]) -> None:
    """Values that cannot fit the policy checkpoint (its ``config.json``, when local): PPO's ``response_length``
    must leave room for a prompt within ``max_position_embeddings``."""
    positions = (model_config or {}).get("max_position_embeddings")
    response = getattr(training_args, "response_length", None)
    if trainer == "ppo" and positions and response is not None and response >= positions:
        raise UserInputError(
            f"recipe: key 'response_length': {response} leaves no room for a prompt in the model's "
            f"max_position_embeddings {positions} (valid: an integer < {positions})"
        )


def check_episodes(training_args, num_rows: int) -> None:
    """PPO without ``total_episodes`` trains ``int(num_train_epochs * rows)`` episodes: refuse zero."""
    if getattr(training_args, "total_episodes", 0) is None and int(training_args.num_train_epochs * num_rows) < 1:
        raise UserInputError(
            f"recipe: key 'num_train_epochs': {training_args.num_train_epochs} of {num_rows} prompts is zero "
            "episodes (valid: num_train_epochs * prompts >= 1, or set total_episodes)"
        )
