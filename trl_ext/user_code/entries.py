"""``module:function`` entries, the one way a recipe or a command line names Python code: reward functions, tools,
environment factories.

Forms: ``module:function``, dotted ``module.function``, ``path/to/file.py:function`` (a relative path: the recipe's
folder first, then the current directory) and ``{name: FACTORY, kwargs: {...}}`` (``FACTORY`` called with
``kwargs`` returns the callable). A URL (``http(s)://...`` or ``{url: ...}``) parses as kind ``"remote"``: only
``reward_funcs`` takes it (:mod:`trl_ext.rewards.resolve`). Every problem is one
:class:`~trl_ext.errors.UserInputError` line ``<where>: <problem>``.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import inspect
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..errors import UserInputError, one_line
from ..models.paths import find_relative, places_text

__all__ = ["FORMS", "Entry", "absolute_entry", "entry_from_text", "entry_where", "load_entry", "parse_entry"]

FORMS = "'module:function' or 'path/to/file.py:function'"
FACTORY_KEYS = ("name", "kwargs")


@dataclass(frozen=True)
class Entry:
    """One parsed entry: ``kind`` (``"function"``, ``"factory"`` or ``"remote"``), ``target`` (the ``module:function``
    text, or the URL), ``kwargs`` (the factory's, or a remote entry's other fields), ``where`` (how messages name it,
    e.g. ``recipe: key 'tools' entry 2 'my_tools.py:add'``)."""

    kind: str
    target: str
    kwargs: dict = field(default_factory=dict)
    where: str = ""

    def fail(self, message: str) -> UserInputError:
        return UserInputError(f"{self.where}: {message}")


def entry_where(key: str, index: int, label: str) -> str:
    """How messages name entry ``index`` (0-based) of ``key``: a recipe key, or a command-line option (``--...``)."""
    owner = key if key.startswith("--") else f"recipe: key {key!r}"
    return f"{owner} entry {index + 1} {label!r}"


def parse_entry(value: Any, index: int = 0, *, key: str, where: Optional[str] = None) -> Entry:
    """One entry, a string or a mapping, read without importing anything; ``where`` replaces the name
    :func:`entry_where` gives (a key that holds one entry, not a list)."""
    if isinstance(value, str):
        label = value.strip()
        where = where or entry_where(key, index, label)
        if not label:
            raise UserInputError(f"{where}: empty; give {FORMS}")
        if label.startswith(("http://", "https://")):
            return Entry("remote", label, {}, where)
        _split_target(label, where)
        return Entry("function", label, {}, where)
    if isinstance(value, dict):
        where = where or entry_where(key, index, str(value.get("url") or value.get("name") or value))
        if "url" in value:
            return Entry("remote", value["url"], {k: v for k, v in value.items() if k != "url"}, where)
        if "name" not in value:
            raise UserInputError(f"{where}: a mapping needs 'name' (a factory, with 'kwargs') or 'url' (a remote "
                                 "reward)")
        unknown = [k for k in value if k not in FACTORY_KEYS]
        if unknown:
            raise UserInputError(f"{where}: unknown field {unknown[0]!r} of a factory entry (fields: name, kwargs; "
                                 "or url for a remote reward)")
        name, kwargs = value["name"], value.get("kwargs") or {}
        if not isinstance(name, str) or not name.strip():
            raise UserInputError(f"{where}: 'name' must be {FORMS}")
        if not isinstance(kwargs, dict):
            raise UserInputError(f"{where}: 'kwargs' must be a mapping of the factory's arguments, got {kwargs!r}")
        _split_target(name.strip(), where)
        return Entry("factory", name.strip(), {str(k): v for k, v in kwargs.items()}, where)
    where = where or entry_where(key, index, repr(value))
    raise UserInputError(f"{where}: give {FORMS}, {{name: FACTORY, kwargs: {{...}}}} or {{url: ...}}")


def entry_from_text(text: str, where: str) -> Any:
    """A command-line value as an entry: a mapping comes as JSON text."""
    if not text.lstrip().startswith("{"):
        return text
    try:
        return json.loads(text)
    except ValueError as err:
        raise UserInputError(f"{where}: not valid JSON ({err})") from None


def load_entry(entry: Entry, base_dir: str | Path = ".", *, what: str) -> Callable:
    """The callable ``entry`` names: its module or file imported, a factory called. ``what``: what the callable is, in
    messages (``"a tool"``)."""
    if entry.kind == "remote":
        raise entry.fail(f"{what} is a Python function called in the training process; give {FORMS}")
    func = _lookup(entry.target, Path(base_dir), entry.where)
    if entry.kind != "factory":
        return func
    try:
        inspect.signature(func).bind(**entry.kwargs)
    except TypeError as err:
        raise entry.fail(f"its kwargs do not fit the factory: {err}") from None
    except ValueError:  # no signature (a builtin): let the call say
        pass
    try:
        func = func(**entry.kwargs)
    except Exception as err:  # noqa: BLE001 - the factory's own error, as one line
        raise entry.fail(f"calling the factory failed: {one_line(err)}") from None
    if not callable(func):
        raise entry.fail(f"the factory returned {type(func).__name__}, not {what}")
    return func


def absolute_entry(value: Any, base_dir: Path) -> Any:
    """``value`` (an entry as written) with a relative ``file.py`` made absolute where it was found (``base_dir``
    first, then the current directory), so that a copy of the recipe runs from anywhere."""
    def absolute(target: str) -> str:
        file, colon, attr = target.rpartition(":")
        if colon and file.endswith(".py") and not Path(file).expanduser().is_absolute():
            found = find_relative(file, base_dir)[0] or str(base_dir / file)
            return f"{Path(found).resolve()}:{attr}"
        return target

    if isinstance(value, str):
        return absolute(value)
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return {**value, "name": absolute(value["name"])}
    return value


def _split_target(target: str, where: str) -> tuple[Optional[str], Optional[str], str]:
    """``(file, module, attribute path)``: exactly one of file and module is set."""
    if ":" in target:
        left, _, attr = target.rpartition(":")
        if not left or not attr or not all(part.isidentifier() for part in attr.split(".")):
            raise UserInputError(f"{where}: expected {FORMS}")
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
    """Import a Python file once, under a module name made from its resolved path (worker processes and pickle find
    its functions by that name), its folder on ``sys.path`` as ``python file.py`` puts it (so the file can import its
    siblings); ``shown``: its name in messages."""
    if not path.is_file():
        raise UserInputError(f"{where}: file '{shown}' does not exist (looked for '{path}')")
    resolved = path.resolve()
    digest = hashlib.sha1(str(resolved).encode()).hexdigest()[:10]
    stem = re.sub(r"\W", "_", resolved.stem)
    name = f"trl_ext_file_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    if str(resolved.parent) not in sys.path:
        sys.path.insert(0, str(resolved.parent))
    module_spec = importlib.util.spec_from_file_location(name, resolved)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # noqa: BLE001 - any error of the user's file, as one line
        del sys.modules[name]
        raise UserInputError(f"{where}: importing '{shown}' failed: {one_line(err)}") from None
    return module


def _import_module(module: str, attr: str, where: str):
    """``(module object, remaining attribute path)``; for a dotted name without ``:``, the longest importable
    prefix."""
    try:
        return importlib.import_module(module), attr
    except ModuleNotFoundError as err:
        if err.name and module != err.name and not module.startswith(err.name + "."):
            raise UserInputError(f"{where}: importing module '{module}' failed: {one_line(err)}") from None
        if "." in module:  # `pkg.mod.Class.method` as a dotted name: try one level up
            head, _, tail = module.rpartition(".")
            try:
                return _import_module(head, f"{tail}.{attr}", where)
            except UserInputError:
                pass
        raise UserInputError(f"{where}: no module named '{module}'") from None
    except Exception as err:  # noqa: BLE001 - the module's own import error, as one line
        raise UserInputError(f"{where}: importing module '{module}' failed: {one_line(err)}") from None


def _lookup(target: str, base_dir: Path, where: str):
    file, module, attr = _split_target(target, where)
    if file is not None:
        found, places = find_relative(file, base_dir)
        if found is None:
            raise UserInputError(f"{where}: file '{file}' does not exist (looked in {places_text(places)})")
        obj, owner = _import_file(Path(found), where, file), f"file '{file}'"
    else:
        obj, attr = _import_module(module, attr, where)
        owner = f"module '{obj.__name__}'"
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            hint = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
            raise UserInputError(f"{where}: {owner} has no function '{attr}'"
                                 + (f" (did you mean '{hint[0]}'?)" if hint else ""))
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserInputError(f"{where}: '{attr}' in {owner} is not callable")
    return obj
