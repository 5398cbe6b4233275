"""``reward_funcs`` entries (a recipe's, ``trl-ext score --reward-funcs``) -> reward functions: the entry forms of
:mod:`trl_ext.user_code.entries`, plus a remote reward (``http(s)://...`` or ``{url: ..., timeout_s: 30, retries: 2,
label_column: label, name: NAME}``: :class:`trl_ext.rewards.remote.RemoteReward`, OpenRLHF's contract).

:func:`check_reward_func` checks a function's signature against the calling contract of TRL's ``GRPOTrainer``, which
``trl_ext.PPOTrainer`` follows (:mod:`trl_ext.rewards.contract`); :func:`check_requirements` refuses a function that
cannot run on this machine (``trl.rewards.accuracy_reward`` without ``math_verify``). Every problem is one
:class:`~trl_ext.errors.UserInputError` line naming the entry.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import UserInputError
from ..user_code.entries import Entry, load_entry, parse_entry
from .contract import CONTRACT_KEYWORDS, keyword_columns, reward_func_names

__all__ = [
    "parse_reward_spec", "load_reward_func", "resolve_reward_funcs", "check_reward_func", "check_requirements",
    "reward_func_name", "TRAINER_KEYWORDS", "DEFAULT_KEY",
]

DEFAULT_KEY = "reward_funcs"
# Keywords the trainer passes besides the dataset's columns (TRL 1.16 GRPOTrainer._calculate_rewards).
TRAINER_KEYWORDS = CONTRACT_KEYWORDS
REMOTE_KEYS = ("url", "timeout_s", "retries", "label_column", "name")
REMOTE_DEFAULTS = {"timeout_s": 30.0, "retries": 2, "label_column": "label", "name": None}
# Modules whose reward functions need packages trl-ext does not install: module -> (packages, how to install).
REQUIREMENTS = {
    "trl.rewards.accuracy_rewards": (
        ("math_verify", "latex2sympy2_extended"), 'pip install "math-verify[antlr4_13_2]"'),
}


def parse_reward_spec(spec: Any, index: int = 0, *, key: str = DEFAULT_KEY, where: Optional[str] = None) -> Entry:
    """One ``reward_funcs`` entry parsed (:func:`~trl_ext.user_code.entries.parse_entry`), a remote reward's settings
    checked and their defaults filled in."""
    entry = parse_entry(spec, index, key=key, where=where)
    if entry.kind != "remote":
        return entry
    unknown = [k for k in entry.kwargs if k not in REMOTE_KEYS]
    if unknown:
        raise entry.fail(f"unknown field {unknown[0]!r} of a remote reward (fields: {', '.join(REMOTE_KEYS)})")
    return Entry("remote", _check_url(entry.target, entry.where), _remote_settings(entry.kwargs, entry.where),
                 entry.where)


def _check_url(url: Any, where: str) -> str:
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s:]+(:\d+)?(/\S*)?$", url.strip()):
        raise UserInputError(f"{where}: 'url' must be an http(s)://host[:port]/path address, got {url!r}")
    return url.strip()


def _remote_settings(spec: dict, where: str) -> dict:
    out = dict(REMOTE_DEFAULTS)
    for name in ("timeout_s", "retries", "label_column", "name"):
        if spec.get(name) is not None:
            out[name] = spec[name]
    timeout = out["timeout_s"]
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 \
            or timeout == float("inf"):
        raise UserInputError(f"{where}: 'timeout_s' must be a number of seconds > 0, got {timeout!r}")
    retries = out["retries"]
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise UserInputError(f"{where}: 'retries' must be an integer >= 0, got {retries!r}")
    for name in ("label_column", "name"):
        if out[name] is not None and (not isinstance(out[name], str) or not out[name].strip()):
            raise UserInputError(f"{where}: {name!r} must be a non-empty string, got {out[name]!r}")
    out["timeout_s"] = float(timeout)
    return out


def load_reward_func(entry: Entry, base_dir: str | Path = ".") -> Callable:
    """The reward function ``entry`` stands for: a ``RemoteReward``, or what
    :func:`~trl_ext.user_code.entries.load_entry` imports."""
    if entry.kind != "remote":
        return load_entry(entry, base_dir, what="a reward function")
    from .remote import RemoteReward

    settings = entry.kwargs
    return RemoteReward(url=entry.target, timeout_s=settings["timeout_s"], retries=settings["retries"],
                        label_column=settings["label_column"], name=settings["name"])


def resolve_reward_funcs(specs: list | None, base_dir: str | Path = ".", *, key: str = DEFAULT_KEY) -> list:
    """The callables of a recipe's ``reward_funcs`` entries, in order (``base_dir``: the recipe's folder, for
    ``file.py:function`` entries). Each is checked by :func:`check_requirements`."""
    if specs is None:
        return []
    if not isinstance(specs, (list, tuple)):
        specs = [specs]
    funcs = []
    for index, spec in enumerate(specs):
        parsed = spec if isinstance(spec, Entry) else parse_reward_spec(spec, index, key=key)
        func = load_reward_func(parsed, base_dir)
        check_requirements(func, parsed.where)
        funcs.append(func)
    return funcs


def reward_func_name(func) -> str:
    """The name metrics use for a reward (``rewards/<name>/mean``), as the trainer names it
    (:func:`trl_ext.rewards.contract.reward_func_names`)."""
    return reward_func_names([func])[0]


def check_requirements(func, where: str) -> None:
    """Refuse a function that needs a package this machine lacks (a table of known ones: :data:`REQUIREMENTS`)."""
    module = getattr(func, "__module__", None) or type(func).__module__
    need = REQUIREMENTS.get(module)
    if not need:
        return
    packages, install = need
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        raise UserInputError(f"{where}: cannot run here: it needs the {' and '.join(missing)} package"
                             f"{'s' if len(missing) > 1 else ''}, not installed ({install})")


def check_reward_func(func, name: str, columns: Optional[list[str]], extra_keywords=()) -> None:
    """Check ``func``'s signature against what the trainer passes it (see the module docstring).

    ``name`` names the entry in the message (e.g. ``"recipe: key 'reward_funcs' entry 1 'f.py:f'"``); ``columns``
    are the train dataset's columns, or None when unknown (a hub dataset in ``trl-ext check``: only the trainer's own
    keywords are checked then). Refuses a required parameter that the trainer does not pass, a positional-only
    parameter without a default, and (without ``**kwargs``) a keyword the function would receive but does not take;
    for a remote reward, a ``label_column`` other than the default ``label`` that the dataset lacks.
    """
    label_column = getattr(func, "label_column", None)  # a remote reward sends this column as its labels
    if isinstance(label_column, str) and columns is not None and label_column not in columns \
            and label_column != REMOTE_DEFAULTS["label_column"]:  # the default may be absent: no labels are sent
        raise UserInputError(f"{name}: label_column {label_column!r} is not a column of the dataset (the dataset's "
                             f"columns: {', '.join(columns) or 'none'})")
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no Python signature to read (a builtin): the call will tell
        return
    passed = list(TRAINER_KEYWORDS) + list(extra_keywords)  # extra: `environments` in a run with environments
    if columns is not None:  # the columns the trainer passes (contract.keyword_columns: not prompt, input_ids, ...)
        passed += [c for c in keyword_columns({c: None for c in columns}) if c not in passed]
    params = signature.parameters
    listing = f"(the dataset's columns: {', '.join(columns) or 'none'})" if columns is not None else \
        "(the dataset's columns are not known here; `trl-ext train` checks them)"
    for p in params.values():
        required = p.default is inspect.Parameter.empty
        if p.kind is inspect.Parameter.POSITIONAL_ONLY and required:
            raise UserInputError(f"{name}: parameter '{p.name}' is positional-only; the trainer passes every "
                                 "argument by keyword")
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY) and required \
                and p.name not in passed:
            if columns is None and p.name in keyword_columns({p.name: None}):
                continue  # perhaps a column of the hub dataset
            extra = " ('prompt' arrives as 'prompts')" if p.name == "prompt" else ""
            raise UserInputError(f"{name}: function '{reward_func_name(func)}' needs '{p.name}', which is neither "
                                 f"an argument the trainer passes nor a column of the dataset{extra} {listing}")
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unexpected = [k for k in passed if k not in params]
    if unexpected:
        raise UserInputError(f"{name}: function '{reward_func_name(func)}' takes no **kwargs but would receive "
                             f"{', '.join(repr(k) for k in unexpected)}; add **kwargs to its parameters")

