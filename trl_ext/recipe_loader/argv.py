"""Recipe values as the command-line tokens TRL's parser reads (:func:`to_argv`), and resolved values back as plain
YAML (:func:`plain`): the loader's two conversions (:mod:`trl_ext.recipe_loader.loader`)."""

from __future__ import annotations

import enum
import json
from typing import Any

from ..errors import UserInputError

__all__ = ["STRUCTURED_LIST_KEYS", "plain", "to_argv"]

# List keys whose entries may be mappings (passed to the parser as JSON text, parsed back in the pipeline step).
STRUCTURED_LIST_KEYS = ("reward_funcs",)


def to_argv(key: str, value: Any, action) -> list[str]:
    if key in STRUCTURED_LIST_KEYS:  # mappings in the list travel as JSON text
        entries = value if isinstance(value, (list, tuple)) else [value]
        return [f"--{key}", *(json.dumps(v) if isinstance(v, (dict, list)) else _scalar_str(key, v) for v in entries)]
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
