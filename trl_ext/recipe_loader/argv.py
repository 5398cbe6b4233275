"""Recipe values as the command-line tokens TRL's parser reads (:func:`to_argv`), the entry keys as data past it
(:func:`entry_values`), and resolved values back as plain YAML (:func:`plain`, :func:`portable_value`): the loader's
conversions (:mod:`trl_ext.recipe_loader.loader`); the parser that reads the tokens (:class:`RecipeArgumentParser`)."""

from __future__ import annotations

import copy
import enum
import json
import re
import types
from pathlib import Path
from typing import Any

from ..errors import UserInputError
from ..user_code.entries import absolute_entry, entry_from_text, entry_where
from .arguments import ENTRY_KEYS

__all__ = ["RecipeArgumentParser", "entry_values", "plain", "portable_value", "to_argv"]

# Field metadata that trl_ext.field_rules reads and argparse must not receive (a field's own `range`).
CONFIG_RULES_METADATA = ("range",)


class RecipeArgumentParser:
    """An HfArgumentParser over the recipe's dataclasses whose errors are one-line UserInputErrors."""

    def __new__(cls, dataclass_types):
        from transformers import HfArgumentParser

        class Parser(HfArgumentParser):
            def error(self, message):  # argparse calls this on bad types and choices
                message = re.sub(r"argument --(\w+)(/--[\w-]+)*", r"key '\1'", message)
                raise UserInputError(f"recipe: {message}")

            @staticmethod
            def _parse_dataclass_field(parser, field):  # HfArgumentParser passes all metadata to argparse
                if any(key in field.metadata for key in CONFIG_RULES_METADATA):
                    field = copy.copy(field)
                    field.metadata = types.MappingProxyType(
                        {k: v for k, v in field.metadata.items() if k not in CONFIG_RULES_METADATA})
                HfArgumentParser._parse_dataclass_field(parser, field)

        parser = Parser(dataclass_types, allow_abbrev=False)
        for action in parser._actions:  # choices are checked by trl_ext.field_rules, with the configs' messages
            action.choices = None
        return parser


def entry_values(merged: dict, cli: dict) -> dict:
    """The recipe's :data:`~trl_ext.recipe_loader.arguments.ENTRY_KEYS` as data, a list key's one entry as a list;
    an entry from the command line is text (a mapping: JSON text)."""
    out = {}
    for key in (k for k in ENTRY_KEYS if merged.get(k) is not None):
        value, text = merged[key], key in cli
        if key == "environment_factory":
            out[key] = entry_from_text(value, f"recipe: key {key!r}") if text and isinstance(value, str) else value
            continue
        out[key] = [entry_from_text(v, entry_where(key, i, v)) if text and isinstance(v, str) else v
                    for i, v in enumerate(value if isinstance(value, list) else [value])]
    return out


def to_argv(key: str, value: Any, action) -> list[str]:
    if isinstance(value, (list, tuple)):
        if action.nargs not in ("+", "*"):
            raise UserInputError(f"recipe: key '{key}' takes one value, got a list {list(value)}")
        return [f"--{key}", *(_scalar_str(key, v) for v in value)]
    if isinstance(value, dict):
        return [f"--{key}", json.dumps(value)]
    return [f"--{key}", _scalar_str(key, value)]


def _scalar_str(key: str, value: Any) -> str:
    if isinstance(value, (dict, list)):
        raise UserInputError(f"recipe: key '{key}' got a nested value {value!r}; give plain values")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def plain(value: Any) -> Any:
    """A YAML-safe copy of a resolved value."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def portable_value(key: str, value: Any, base_dir: Path) -> Any:
    """An entry key's value with each entry's relative ``file.py`` made absolute (:func:`absolute_entry`): a list's
    entries (None: an empty list), ``environment_factory``'s one entry or mapping of environment names to entries."""
    if key != "environment_factory":
        return [absolute_entry(entry, base_dir) for entry in value or []]
    if isinstance(value, dict):
        return {name: absolute_entry(entry, base_dir) for name, entry in value.items()}
    return absolute_entry(value, base_dir)
