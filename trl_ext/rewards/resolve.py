"""Reward functions named in a recipe (``reward_funcs:``) or on the command line, resolved into callables.

Four forms of an entry:

* ``"module:function"`` or the dotted ``"module.function"``: an importable function, e.g.
  ``trl.rewards:accuracy_reward`` or ``trl.rewards.think_format_reward``;
* ``"path/to/file.py:function"``: a function in a Python file, a relative path looked for in the recipe's folder
  first, then in the current directory (:func:`trl_ext.models.paths.find_relative`, as data and models); the file is
  imported with :mod:`importlib` under a module name of its own (``trl_ext_reward_file_<stem>_<hash>``), once;
* ``{name: FACTORY, kwargs: {...}}``: ``FACTORY`` (either form above) is called with ``kwargs`` and returns the reward
  function, e.g. ``{name: trl.rewards.get_soft_overlong_punishment, kwargs: {max_completion_len: 64,
  soft_punish_cache: 16}}``;
* ``{url: http://host:port/path, timeout_s: 30, retries: 2, label_column: label, name: NAME}``: a reward computed by
  another service (OpenRLHF's remote reward contract), as :class:`trl_ext.rewards.remote.RemoteReward`.

:func:`check_reward_func` checks a function's signature against the calling contract of TRL's ``GRPOTrainer``,
which ``trl_ext.PPOTrainer`` follows (:mod:`trl_ext.rewards.contract`): the function is called with the keywords
``prompts``, ``completions``, ``completion_ids``, every dataset column but the prompt and the tokenized prompt
(``prompt``, ``input_ids``, ...), ``trainer_state``, ``log_extra`` and ``log_metric``. :func:`check_requirements`
refuses a function that cannot run on this machine (``trl.rewards.accuracy_reward`` without ``math_verify``).

Every problem is a :class:`~trl_ext.errors.UserInputError` of one line naming the entry.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import UserInputError
from ..models.paths import find_relative, places_text
from .contract import CONTRACT_KEYWORDS, keyword_columns, reward_func_names

__all__ = [
    "RewardSpec", "parse_reward_spec", "load_reward_func", "resolve_reward_funcs", "check_reward_func",
    "check_requirements", "reward_func_name", "TRAINER_KEYWORDS", "DEFAULT_KEY",
]

DEFAULT_KEY = "reward_funcs"
# Keywords the trainer passes besides the dataset's columns (TRL 1.16 GRPOTrainer._calculate_rewards).
TRAINER_KEYWORDS = CONTRACT_KEYWORDS
FACTORY_KEYS = ("name", "kwargs")
REMOTE_KEYS = ("url", "timeout_s", "retries", "label_column", "name")
REMOTE_DEFAULTS = {"timeout_s": 30.0, "retries": 2, "label_column": "label", "name": None}
# Modules whose reward functions need packages trl-ext does not install: module -> (packages, how to install).
REQUIREMENTS = {
    "trl.rewards.accuracy_rewards": (
        ("math_verify", "latex2sympy2_extended"), 'pip install "math-verify[antlr4_13_2]"'),
}


@dataclass(frozen=True)
class RewardSpec:
    """One parsed entry.

    Attributes:
        kind: ``"function"``, ``"factory"`` or ``"remote"``.
        target: the ``module:function`` / ``file.py:function`` / dotted name, or the URL of a remote reward.
        kwargs: the factory's keyword arguments, or the remote reward's settings (``timeout_s``, ``retries``,
            ``label_column``, ``name``, defaults filled in).
        where: how messages name the entry, e.g. ``"recipe: key 'reward_funcs' entry 2 'rewards.py:fmt'"``.
    """

    kind: str
    target: str
    kwargs: dict = field(default_factory=dict)
    where: str = ""

    def fail(self, message: str) -> UserInputError:
        return UserInputError(f"{self.where}: {message}")


def _where(key: str, index: int, label: str) -> str:
    return f"{key} entry {index + 1} {label!r}" if key.startswith("--") else \
        f"recipe: key {key!r} entry {index + 1} {label!r}"


def parse_reward_spec(spec: Any, index: int = 0, *, key: str = DEFAULT_KEY,
                      where: Optional[str] = None) -> RewardSpec:
    """Parse one entry (a string or a mapping) without importing anything; ``index`` (0-based) and ``key`` name it
    in messages (``key`` starting with ``--`` names a command-line option instead of a recipe key); ``where``, when
    given, is the name messages use instead (a key that is not a list: ``recipe: key 'environment_factory' ...``)."""
    named = where
    if isinstance(spec, str):
        label = spec.strip()
        where = named or _where(key, index, label)
        if not label:
            raise UserInputError(f"{where}: empty; give 'module:function' or 'path/to/file.py:function'")
        if label.startswith(("http://", "https://")):
            return RewardSpec("remote", label, dict(REMOTE_DEFAULTS), where)
        _split_target(label, where)
        return RewardSpec("function", label, {}, where)
    if isinstance(spec, dict):
        label = str(spec.get("url") or spec.get("name") or spec)
        where = named or _where(key, index, label)
        if "url" in spec:
            unknown = [k for k in spec if k not in REMOTE_KEYS]
            if unknown:
                raise UserInputError(f"{where}: unknown field {unknown[0]!r} of a remote reward "
                                     f"(fields: {', '.join(REMOTE_KEYS)})")
            return RewardSpec("remote", _check_url(spec["url"], where), _remote_settings(spec, where), where)
        if "name" in spec:
            unknown = [k for k in spec if k not in FACTORY_KEYS]
            if unknown:
                raise UserInputError(f"{where}: unknown field {unknown[0]!r} of a factory entry "
                                     "(fields: name, kwargs; or url for a remote reward)")
            name, kwargs = spec["name"], spec.get("kwargs") or {}
            if not isinstance(name, str) or not name.strip():
                raise UserInputError(f"{where}: 'name' must be 'module:function' or 'path/to/file.py:function'")
            if not isinstance(kwargs, dict):
                raise UserInputError(f"{where}: 'kwargs' must be a mapping of the factory's arguments, "
                                     f"got {kwargs!r}")
            _split_target(name.strip(), where)
            return RewardSpec("factory", name.strip(), {str(k): v for k, v in kwargs.items()}, where)
        raise UserInputError(f"{where}: a mapping needs 'name' (a factory, with 'kwargs') or 'url' (a remote "
                             "reward)")
    where = named or _where(key, index, repr(spec))
    raise UserInputError(f"{where}: give 'module:function', 'path/to/file.py:function', "
                         "{name: FACTORY, kwargs: {...}} or {url: ...}")


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


def _split_target(target: str, where: str) -> tuple[Optional[str], Optional[str], str]:
    """``(file, module, attribute path)``: exactly one of file and module is set."""
    if ":" in target:
        left, _, attr = target.rpartition(":")
        if not left or not attr or not all(part.isidentifier() for part in attr.split(".")):
            raise UserInputError(f"{where}: expected 'module:function' or 'path/to/file.py:function'")
        if left.endswith(".py"):
            return left, None, attr
        if not all(part.isidentifier() for part in left.split(".")):
            raise UserInputError(f"{where}: {left!r} is not a module name (a file must end in .py)")
        return None, left, attr
    if target.endswith(".py"):
        raise UserInputError(f"{where}: name the function in the file: 'path/to/file.py:function'")
    parts = target.split(".")
    if len(parts) < 2 or not all(part.isidentifier() for part in parts):
        raise UserInputError(f"{where}: expected 'module:function' or 'module.function'")
    return None, ".".join(parts[:-1]), parts[-1]


def _import_file(path: Path, where: str, shown: str):
    """Import a Python file once, under a module name made from its resolved path (``shown``: its name in
    messages)."""
    if not path.is_file():
        raise UserInputError(f"{where}: file '{shown}' does not exist (looked for '{path}')")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", resolved.stem)
    name = f"trl_ext_reward_file_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # workers and pickle find the functions by their module's name
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any error of the user's file, as one line
        del sys.modules[name]
        raise UserInputError(f"{where}: importing '{shown}' failed: {_one_line(err)}") from None
    return module


def _import_module(module: str, attr: str, where: str):
    """Import ``module`` (for a dotted name without ``:``, the longest importable prefix) and return
    ``(module object, remaining attribute path)``."""
    try:
        return importlib.import_module(module), attr
    except ModuleNotFoundError as err:
        if err.name and module != err.name and not module.startswith(err.name + "."):
            raise UserInputError(f"{where}: importing module '{module}' failed: {_one_line(err)}") from None
        if "." in module:  # `pkg.mod.Class.method` as a dotted name: try one level up
            head, _, tail = module.rpartition(".")
            try:
                return _import_module(head, f"{tail}.{attr}", where)
            except UserInputError:
                pass
        raise UserInputError(f"{where}: no module named '{module}'") from None
    except Exception as err:  # noqa: BLE001 - the module's own import error, as one line
        raise UserInputError(f"{where}: importing module '{module}' failed: {_one_line(err)}") from None


def _lookup(target: str, base_dir: Path, where: str):
    file, module, attr = _split_target(target, where)
    if file is not None:
        found, places = find_relative(file, base_dir)  # the recipe's folder first, then the current directory
        if found is None:
            raise UserInputError(f"{where}: file '{file}' does not exist (looked in {places_text(places)})")
        obj = _import_file(Path(found), where, file)
        owner = f"file '{file}'"
    else:
        obj, attr = _import_module(module, attr, where)
        owner = f"module '{obj.__name__}'"
    for part in attr.split("."):
        if not hasattr(obj, part):
            close = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            import difflib

            hint = difflib.get_close_matches(part, close, n=1, cutoff=0.6)
            raise UserInputError(f"{where}: {owner} has no function '{attr}'"
                                 + (f" (did you mean '{hint[0]}'?)" if hint else ""))
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserInputError(f"{where}: '{attr}' in {owner} is not callable")
    return obj


def load_reward_func(spec: RewardSpec, base_dir: str | Path = ".", *, what: str = "a reward function") -> Callable:
    """The callable one parsed entry stands for (imports the module or file; calls a factory; builds a
    ``RemoteReward``). ``what``: what a factory must return, in its message (the tools' entries say "a tool")."""
    base_dir = Path(base_dir)
    if spec.kind == "remote":
        try:
            from .remote import RemoteReward
        except ImportError:
            raise spec.fail("remote rewards need trl_ext.rewards.remote, which this install lacks") from None
        settings = spec.kwargs
        return RemoteReward(url=spec.target, timeout_s=settings["timeout_s"], retries=settings["retries"],
                            label_column=settings["label_column"], name=settings["name"])
    func = _lookup(spec.target, base_dir, spec.where)
    if spec.kind == "factory":
        try:
            inspect.signature(func).bind(**spec.kwargs)
        except TypeError as err:
            raise spec.fail(f"its kwargs do not fit the factory: {err}") from None
        except ValueError:  # no signature (a builtin): let the call say
            pass
        try:
            func = func(**spec.kwargs)
        except Exception as err:  # noqa: BLE001 - the factory's own error, as one line
            raise spec.fail(f"calling the factory failed: {_one_line(err)}") from None
        if not callable(func):
            raise spec.fail(f"the factory returned {type(func).__name__}, not {what}")
    return func


def resolve_reward_funcs(specs: list | None, base_dir: str | Path = ".", *, key: str = DEFAULT_KEY) -> list:
    """The callables of a recipe's ``reward_funcs`` entries, in order (``base_dir``: the recipe's folder, for
    ``file.py:function`` entries). Each is checked by :func:`check_requirements`."""
    if specs is None:
        return []
    if not isinstance(specs, (list, tuple)):
        specs = [specs]
    funcs = []
    for index, spec in enumerate(specs):
        parsed = spec if isinstance(spec, RewardSpec) else parse_reward_spec(spec, index, key=key)
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


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(err).__name__}: {first}" if first else type(err).__name__
