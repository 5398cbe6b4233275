"""The rules every trl-ext config checks about each of its own fields, when it is constructed. How it works:
docs/internals.md#field-rules."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Optional

from .errors import UserInputError

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
    # trl_ext.PPOConfig's objective keys (trl_ext.ppo.objective.objectives)
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
    "label_smoothing": "[0, 0.5)",  # conservative DPO / reward label smoothing: the flipped-label probability
    "kl_target": "(0, inf)",
    "kl_horizon": "[1, inf)",
    "ptx_batch_size": "[1, inf)",
    "ptx_max_length": "[1, inf)",
    "reward_clip": "(0, inf)",
    "num_samples_per_prompt": "[1, inf)",
    "critic_warmup": "[0, inf)",
    "critic_learning_rate": "(0, inf)",
    "critic_lam": "[0, 1]",
    "length_adaptive_lam_alpha": "(0, inf)",
    "max_memory_gib": "(0, inf)",
    "reward_timeout_s": "(0, inf)",
    "max_tool_calling_iterations": "[1, inf)",  # trl_ext.ppo.episodes.config
    "tool_timeout_s": "(0, inf)",
    "max_consecutive_nonfinite_skips": "[1, inf)",
    "top_p": "(0, 1]",  # the rollout's sampling keys (trl_ext.ppo.rollout.sampling; TRL GRPOConfig's ranges)
    "top_k": "[0, inf)",
    "min_p": "[0, 1]",
    "repetition_penalty": "(0, inf)",
    # local_rollout_forward_batch_size (an int or "auto") is checked by its own argparse type,
    # trl_ext.ppo.memory.chunk.rollout_chunk_value
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
                elif enums and all(m is str or m in enums for m in members):  # an Enum, or its value
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


def value_problem(value: Any, spec: KeySpec) -> Optional[str]:
    """What is wrong with ``value`` for the key of ``spec`` (the text after ``<key>: ``), or None if nothing.

    ``None`` is left to the caller (a recipe says ``null``, Python ``None``); lists are checked element by element;
    a string of a number-or-string field (``local_rollout_forward_batch_size: auto``) is not a number to check."""
    if value is None:
        return None
    if spec.choices and not isinstance(value, (list, tuple)):
        plain = value.value if isinstance(value, enum.Enum) else value
        if plain not in spec.choices:
            return f"invalid choice {plain!r} (valid: {spec.describe()})"
        return None
    if spec.bound is None or isinstance(value, bool):
        return None
    if isinstance(value, (list, tuple)):
        return next((p for p in (value_problem(v, spec) for v in value) if p), None)
    if isinstance(value, str):  # a union with str (pad_to_multiple_of: int | str) parses numbers as strings
        try:
            value = int(value) if spec.kind == "int" else float(value)
        except ValueError:
            return None  # a string value of the key (e.g. "auto")
    if not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value} is not a finite number (valid: {spec.describe()})"
    if isinstance(value, int) and abs(value) > INT64_MAX:
        return f"{value} does not fit in 64 bits (valid: {spec.describe()})"
    if spec.kind == "int" and isinstance(value, float):
        return f"{value!r} is not an integer (valid: {spec.describe()})"
    if value not in spec.bound:
        return f"{value!r} is out of range (valid: {spec.describe()})"
    return None


def check_fields(config) -> None:
    """Every field of the dataclass ``config`` against its nullability, choices and range (see the module); called
    first thing in each trl-ext config's ``__post_init__``."""
    for name, spec in key_specs((type(config),)).items():
        value = getattr(config, name, None)
        # None: refused for numbers, flags and choices (HfArgumentParser passes None for some list-like fields)
        if value is None and not spec.nullable and (spec.kind in ("int", "float", "bool") or spec.choices):
            raise UserInputError(f"{name}: None is not valid (valid: {spec.describe()})")
        problem = value_problem(value, spec)
        if problem:
            raise UserInputError(f"{name}: {problem}")


def choices_of(literal) -> tuple:
    """The values of a ``Literal`` type (``Optional`` allowed): the one place a key's choices are written."""
    members, _ = _strip_optional(literal)
    return tuple(v for m in members for v in typing.get_args(m))


def help_from_docstring(cls):
    """Class decorator: each field of ``cls`` that its class docstring documents (TRL's ``Parameters:`` layout,
    ``name (`type`, ...):`` then the indented description, or a line ``- ``name``: description``) and that has no
    ``help`` of its own gets the first sentence of that description as its ``metadata["help"]`` (the command line's
    help): one description per field, written once, in the docstring."""
    described = docstring_fields(cls.__doc__ or "")
    for f in dataclasses.fields(cls):
        if f.name in described and "help" not in f.metadata:
            f.metadata = types.MappingProxyType({**f.metadata, "help": first_sentence(described[f.name])})
    return cls


def docstring_fields(doc: str) -> dict[str, str]:
    """``{field: description}`` of a docstring's ``name (`type`, ...):`` entries and ``- ``name``: description``
    lines (descriptions on one line)."""
    out: dict[str, str] = {}
    name, lines, indent = None, [], 0
    for line in doc.splitlines():
        m = re.match(r"^(\s*)(\w+) \(`[^`]*`.*\):\s*$", line)
        bullet = re.match(r"^\s*- ``(\w+)``: (.+)$", line)
        if bullet:
            if name:
                out[name], name = " ".join(lines), None
            out[bullet.group(1)] = bullet.group(2).strip()
        elif m:
            if name:
                out[name] = " ".join(lines)
            name, lines, indent = m.group(2), [], len(m.group(1))
        elif name and line.strip() and len(line) - len(line.lstrip()) > indent:
            lines.append(line.strip())
        elif name and line.strip():
            out[name], name = " ".join(lines), None
    if name:
        out[name] = " ".join(lines)
    return out


def first_sentence(text: str) -> str:
    """``text`` up to its first period that ends a sentence (outside backticks and parentheses)."""
    depth, code = 0, False
    for i, ch in enumerate(text):
        if ch == "`":
            code = not code
        elif not code and ch in "([":
            depth += 1
        elif not code and ch in ")]":
            depth = max(0, depth - 1)
        elif ch == "." and not code and depth == 0 and (i + 1 == len(text) or text[i + 1] == " "):
            if text[:i].split()[-1:] not in (["al"], ["e.g"], ["i.e"], ["sec"], ["eq"], ["vs"]):
                return text[: i + 1]
    return text


def check_steps(config) -> None:
    """A run of the SFT, reward or DPO trainer that would train zero steps (and save an untrained model)."""
    epochs = getattr(config, "num_train_epochs", None)
    if epochs is not None and epochs <= 0 and getattr(config, "max_steps", -1) <= 0:
        raise UserInputError(f"num_train_epochs: {epochs!r} with no max_steps trains zero steps "
                             "(valid: a number > 0, or set max_steps >= 1)")


#: The dict-valued keys that :class:`MappingArgs` parses (kept out of the fields' metadata: HfArgumentParser passes
#: every metadata entry to argparse).
MAPPING_FIELDS = frozenset({"model_init_kwargs", "chat_template_kwargs", "generation_kwargs"})


def mapping_field(help_: str):
    """A dict-valued config key (one of :data:`MAPPING_FIELDS`), None by default; :class:`MappingArgs` parses its JSON
    text (the command line's)."""
    return dataclasses.field(default=None, metadata={"help": help_})


class MappingArgs:
    """Config mixin: each of :data:`MAPPING_FIELDS` the dataclass has goes through :func:`mapping_value` after init."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if f.name in MAPPING_FIELDS:
                setattr(self, f.name, mapping_value(f.name, getattr(self, f.name)))
        super().__post_init__()


def mapping_value(name: str, value):
    """A dict-valued config key: a dict, None, or its JSON text (the command line's form) -> dict or None."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise UserInputError(f"{name}: not a JSON object: {value!r} ({err.msg})") from None
    if value is not None and not isinstance(value, dict):
        raise UserInputError(f"{name}: expected a mapping of keyword arguments, got {value!r}")
    return value
