"""Value checks of recipe keys: nullability and ranges of every numeric key, stated once.

What is derived from the dataclasses (TRL's ``ScriptArguments``/``ModelConfig``/trainer configs, transformers'
``TrainingArguments``, trl-ext's configs and :class:`~trl_ext.recipes.loader.PipelineArguments`):

* **types and choices**: parsed as TRL's command line would (``HfArgumentParser``; see ``loader.resolve_recipe``);
* **null**: allowed only where the field's type is ``Optional`` or its default is ``None``;
* **numbers**: a float must be finite, an integer must fit in 64 bits, and a number whose default is not negative
  (or ``None``) must not be negative.

What cannot be derived is stated in :data:`RANGES` (one row per key, interval notation; ``inf`` is infinity). A
field may state its own range in its metadata (``field(..., metadata={"range": "[1, inf)"})``), which is how a new
config key gets a tighter range without editing this table. The reward and value models' ``reward_*``/``value_*``
keys take the row of the ``ModelConfig`` key they prefix.

Errors raised by the libraries' own validation (``TrainingArguments.__post_init__``, TRL's configs) are turned into
one line naming the recipe key at fault by :func:`find_culprit`.

Every check raises :class:`~trl_ext.errors.UserInputError` with one line: the key, the value and what is valid.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ..errors import UserInputError

INT64_MAX = 2**63 - 1

# Ranges that cannot be derived from a field's type and default. Interval notation: "[1, inf)" is an integer or number
# >= 1, "(0, inf)" is > 0, "[0, 1)" is 0 <= x < 1. Sources: the libraries' documentation of each key, and what makes
# a run do nothing or crash later (a zero learning rate or LoRA rank, zero episodes, a zero-length response).
RANGES: dict[str, str] = {
    # transformers.TrainingArguments
    "learning_rate": "(0, inf)",
    "adam_beta1": "[0, 1)",
    "adam_beta2": "[0, 1)",
    "adam_epsilon": "(0, inf)",
    "per_device_train_batch_size": "[1, inf)",
    "per_device_eval_batch_size": "[1, inf)",
    "gradient_accumulation_steps": "[1, inf)",
    "eval_accumulation_steps": "[1, inf)",
    "max_steps": "[-1, inf)",  # -1 (or any value <= 0): train num_train_epochs
    "local_rank": "[-1, inf)",
    "logging_steps": "(0, inf)",  # < 1: a fraction of the total steps
    "save_steps": "(0, inf)",
    "eval_steps": "(0, inf)",
    "seed": "[0, 4294967295]",  # numpy's seed range
    "data_seed": "[0, 4294967295]",
    "label_smoothing_factor": "[0, 1)",
    "dataloader_prefetch_factor": "[1, inf)",
    "ddp_timeout": "(0, inf)",
    "ddp_bucket_cap_mb": "[1, inf)",
    "torch_empty_cache_steps": "[1, inf)",
    "dataset_num_proc": "[1, inf)",
    # trl.ModelConfig (LoRA keys: peft does not check them until the adapter is built)
    "lora_r": "[1, inf)",
    "lora_alpha": "(0, inf)",
    "lora_dropout": "[0, 1)",
    # TRL's trainer configs
    "max_length": "[1, inf)",
    "pad_to_multiple_of": "[1, inf)",
    "beta": "(0, inf)",  # DPO
    "ref_model_mixup_alpha": "[0, 1]",
    "ref_model_sync_steps": "[1, inf)",
    "discopop_tau": "(0, inf)",
    "ld_alpha": "[0, 1]",
    "precompute_ref_batch_size": "[1, inf)",
    "response_length": "[1, inf)",  # PPO
    "temperature": "(0, inf)",
    "total_episodes": "[1, inf)",
    "num_ppo_epochs": "[1, inf)",
    # trl_ext.PPOConfig's objective keys (trl_ext.ppo.objectives)
    "cliprange_low": "[0, 1]",
    "dual_clip": "(1, inf)",
    "delta": "(1, inf)",
    "max_sampling_rounds": "[1, inf)",
    "num_mini_batches": "[1, inf)",
    "cliprange": "(0, inf)",
    "gamma": "[0, 1]",
    "lam": "[0, 1]",
    "batch_size": "[1, inf)",  # PPO's derived sizes: computed by the trainer, but a value given must be possible
    "local_batch_size": "[1, inf)",
    "mini_batch_size": "[1, inf)",
    "local_mini_batch_size": "[1, inf)",
    "micro_batch_size": "[1, inf)",
    "num_total_batches": "[1, inf)",
    "world_size": "[1, inf)",
    # trl-ext's configs
    "label_smoothing": "[0, 0.5]",  # conservative DPO / reward label smoothing: the flipped-label probability
    "kl_target": "(0, inf)",
    "kl_horizon": "[1, inf)",
    "ptx_batch_size": "[1, inf)",
    "ptx_max_length": "[1, inf)",
    "reward_clip": "(0, inf)",
    "num_samples_per_prompt": "[1, inf)",
    "max_memory_gib": "(0, inf)",
    # local_rollout_forward_batch_size (an int or "auto") is checked by its own argparse type,
    # trl_ext.ppo.rollout_chunk.rollout_chunk_value
}

MODEL_PREFIXES = ("reward_", "value_")


@dataclass(frozen=True)
class Bound:
    """An interval; ``None`` ends are unbounded."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False

    @classmethod
    def parse(cls, text: str) -> "Bound":
        m = re.fullmatch(r"\s*([\[(])\s*([^,]+?)\s*,\s*([^,]+?)\s*([\])])\s*", text)
        if not m:
            raise ValueError(f"bad interval {text!r}")  # programming error in RANGES or a field's metadata

        def end(s):
            return None if s.lstrip("+-") == "inf" else float(s)

        return cls(end(m.group(2)), end(m.group(3)), m.group(1) == "(", m.group(4) == ")")

    def __contains__(self, x: float) -> bool:
        if self.low is not None and (x < self.low or (self.low_open and x == self.low)):
            return False
        if self.high is not None and (x > self.high or (self.high_open and x == self.high)):
            return False
        return True

    def describe(self, kind: str) -> str:
        noun = "an integer" if kind == "int" else "a number"

        def num(v):
            return str(int(v)) if float(v).is_integer() else repr(v)

        if self.low is not None and self.high is not None:
            lo, hi = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{noun} in {lo}{num(self.low)}, {num(self.high)}{hi}"
        if self.low is not None:
            return f"{noun} {'>' if self.low_open else '>='} {num(self.low)}"
        if self.high is not None:
            return f"{noun} {'<' if self.high_open else '<='} {num(self.high)}"
        return noun


@dataclass(frozen=True)
class KeySpec:
    """What a recipe key accepts, derived from its dataclass field (and :data:`RANGES`).

    Attributes:
        key: the recipe key.
        kind: ``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"list"``, ``"dict"`` or ``"other"`` (the field's type
            without ``Optional``; a union of a number and a string, as ``pad_to_multiple_of: int | str``, is its
            number kind).
        nullable: whether ``null`` is valid.
        bound: the valid range of a number (``None`` for non-numbers).
        choices: the valid values of a key with choices (``None`` if free).
        default: the field's default.
    """

    key: str
    kind: str
    nullable: bool
    bound: Optional[Bound]
    choices: Optional[tuple]
    default: Any

    def describe(self) -> str:
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.bound is not None:
            return self.bound.describe(self.kind)
        return {"bool": "true or false", "str": "a string", "list": "a list", "dict": "a mapping"}.get(self.kind,
                                                                                                    "a value")


def _strip_optional(tp) -> tuple[list, bool]:
    """The members of a (possibly Optional/Union) type, and whether None is one of them."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = list(typing.get_args(tp))
    else:
        args = [tp]
    has_none = type(None) in args
    return [a for a in args if a is not type(None)], has_none


def _kind(members: list) -> str:
    bases = [typing.get_origin(a) or a for a in members]
    if bool in bases and len(bases) == 1:
        return "bool"
    if int in bases:
        return "int"
    if float in bases:
        return "float"
    if typing.Literal in bases or str in bases or any(isinstance(b, type) and issubclass(b, str) for b in bases):
        return "str"
    if list in bases or tuple in bases:
        return "list"
    if dict in bases:
        return "dict"
    if any(isinstance(b, type) and issubclass(b, enum.Enum) for b in bases):
        return "str"
    return "other"


def key_specs(dataclass_types) -> dict[str, KeySpec]:
    """A :class:`KeySpec` for every field of ``dataclass_types`` (the recipe's dataclasses), by recipe key."""
    return dict(_key_specs(tuple(dataclass_types)))


@functools.lru_cache(maxsize=None)
def _key_specs(dataclass_types: tuple) -> dict[str, KeySpec]:
    specs: dict[str, KeySpec] = {}
    for dc in dataclass_types:
        try:
            hints = typing.get_type_hints(dc)
        except Exception:  # noqa: BLE001 - an unresolvable annotation: fall back to the raw ones
            hints = {}
        for f in dataclasses.fields(dc):
            if not f.init or f.name in specs:
                continue
            tp = hints.get(f.name, f.type)
            members, has_none = _strip_optional(tp)
            kind = _kind(members)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
            nullable = has_none or default is None
            choices = f.metadata.get("choices")
            if choices is None:
                lits = [a for a in members if typing.get_origin(a) is typing.Literal]
                enums = [a for a in members if isinstance(a, type) and issubclass(a, enum.Enum)]
                if lits and len(lits) == len(members):
                    choices = [c for lit in lits for c in typing.get_args(lit)]
                elif enums and len(enums) == len(members):
                    choices = [e.value for e in enums[0]]
            bound = None
            if kind in ("int", "float"):
                bound = _bound_for(f, default)
            specs[f.name] = KeySpec(f.name, kind, nullable, bound, tuple(choices) if choices else None, default)
    return specs


def _bound_for(f: dataclasses.Field, default) -> Bound:
    name = f.name
    stated = f.metadata.get("range") or RANGES.get(name)
    if stated is None:
        for prefix in MODEL_PREFIXES:
            if name.startswith(prefix) and name[len(prefix):] in RANGES:
                stated = RANGES[name[len(prefix):]]
    if stated is not None:
        return Bound.parse(stated) if isinstance(stated, str) else stated
    numeric_default = isinstance(default, (int, float)) and not isinstance(default, bool)
    if default is None or (numeric_default and default >= 0):
        return Bound(low=0)
    return Bound()


# ----------------------------------------------------------------------------------------------------------------
# The checks


def check_null(key: str, spec: KeySpec) -> None:
    """``key: null`` where the key cannot be null."""
    if not spec.nullable:
        raise UserInputError(f"recipe: key '{key}': null is not valid (valid: {spec.describe()})")


def check_value(key: str, value: Any, spec: KeySpec) -> None:
    """A parsed value of ``key`` against its finiteness, size and range (lists: each element)."""
    if spec.bound is None or value is None or isinstance(value, bool):
        return
    if isinstance(value, (list, tuple)):
        for v in value:
            check_value(key, v, spec)
        return
    if isinstance(value, str):  # a union with str (pad_to_multiple_of: int | str) parses numbers as strings
        try:
            value = int(value) if spec.kind == "int" else float(value)
        except ValueError:
            return  # a string value of the key (e.g. "auto")
    if not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise UserInputError(f"recipe: key '{key}': {value} is not a finite number (valid: {spec.describe()})")
    if isinstance(value, int) and abs(value) > INT64_MAX:
        raise UserInputError(f"recipe: key '{key}': {value} does not fit in 64 bits (valid: {spec.describe()})")
    if value not in spec.bound:
        raise UserInputError(f"recipe: key '{key}': {value!r} is out of range (valid: {spec.describe()})")


def check_namespace(namespace, keys, specs: dict[str, KeySpec]) -> None:
    """Check the parsed values of the recipe's explicit ``keys`` (an argparse namespace, before the dataclasses are
    built, so that these one-line errors come before the libraries' own)."""
    for key in keys:
        spec = specs.get(key)
        if spec is not None and hasattr(namespace, key):
            check_value(key, getattr(namespace, key), spec)


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


def check_nothing_to_do(trainer: str, training_args) -> None:
    """Refuse runs that would train zero steps (before anything is written).

    Zero episodes (PPO ``total_episodes``: in :data:`RANGES`) and ``num_train_epochs: 0`` with no positive
    ``max_steps`` (or, for PPO, no ``total_episodes``) would save an untrained model and exit 0.
    """
    epochs = getattr(training_args, "num_train_epochs", None)
    if epochs is None or epochs > 0:
        return
    if trainer == "ppo":
        if getattr(training_args, "total_episodes", None) is None:
            raise UserInputError(
                f"recipe: key 'num_train_epochs': {epochs!r} with no total_episodes trains on zero episodes "
                "(valid: a number > 0, or set total_episodes >= 1)"
            )
    elif getattr(training_args, "max_steps", -1) <= 0:
        raise UserInputError(
            f"recipe: key 'num_train_epochs': {epochs!r} with no max_steps trains zero steps "
            "(valid: a number > 0, or set max_steps >= 1)"
        )


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


def check_ppo_batches(training_args) -> None:
    """PPO's combinations that its trainer would refuse only after every model has loaded (TRL's checks, earlier):
    the rollout batch (``per_device_train_batch_size * gradient_accumulation_steps``) split into
    ``num_mini_batches``; ``whiten_rewards`` with mini-batches under 8; ``stop_token`` with ``stop_token_id``."""
    a = training_args
    local_batch = a.per_device_train_batch_size * a.gradient_accumulation_steps
    if local_batch % a.num_mini_batches:
        raise UserInputError(
            f"recipe: key 'num_mini_batches': {a.num_mini_batches} does not divide the rollout batch "
            f"per_device_train_batch_size * gradient_accumulation_steps = {local_batch} (valid: a divisor of it)"
        )
    if getattr(a, "whiten_rewards", False) and local_batch // a.num_mini_batches < 8:
        raise UserInputError(
            f"recipe: key 'whiten_rewards': needs mini-batches of at least 8 samples per process, got "
            f"{local_batch // a.num_mini_batches} (per_device_train_batch_size * gradient_accumulation_steps / "
            "num_mini_batches)"
        )
    if getattr(a, "stop_token", None) and getattr(a, "stop_token_id", None) is not None:
        raise UserInputError("recipe: keys 'stop_token' and 'stop_token_id' are both set; choose one")


def check_episodes(training_args, num_rows: int) -> None:
    """PPO without ``total_episodes`` trains ``int(num_train_epochs * rows)`` episodes: refuse zero."""
    if getattr(training_args, "total_episodes", 0) is None and int(training_args.num_train_epochs * num_rows) < 1:
        raise UserInputError(
            f"recipe: key 'num_train_epochs': {training_args.num_train_epochs} of {num_rows} prompts is zero "
            "episodes (valid: num_train_epochs * prompts >= 1, or set total_episodes)"
        )
