"""Relative paths in a recipe: one rule for data, models and function files (docs/recipes.md, "Paths").

A relative path written in the recipe file is looked for in the recipe's folder first, then in the current directory
(:func:`trl_ext.models.paths.find_relative`); one found in the recipe's folder is replaced by its absolute path, so the
resolved recipe (``trl_ext_recipe.yaml``) runs from anywhere. A path given on the command line (``--key value``) is
the shell's: relative to the current directory only. ``output_dir`` is not looked for: it is where the run writes,
relative to the current directory. A path found nowhere stops the run with one line naming both places looked at and,
when a shipped script or recipe beside this one makes that path, the command that makes it (:func:`maker_of`).

``check`` cannot check Hub names (it does not go online): :func:`hub_names` lists them for its "not checked" lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import yaml

from ..errors import UserInputError
from ..models.paths import find_relative, looks_local, places_text

_TINY = "tiny://"


def resolve_recipe_paths(merged: dict, cli: dict, recipe_path, keys) -> None:
    """Apply the rule to the recipe file's path ``keys`` (the loader's ``PATH_KEYS``) in ``merged`` (in place); raise
    for a local path found nowhere. Keys set on the command line (``cli``) are left as they are (the loader's later
    path check looks for them in the current directory)."""
    recipe_dir = Path(recipe_path).parent
    for key in keys:
        value = merged.get(key)
        if key in cli or not isinstance(value, str) or not value or value.startswith(_TINY):
            continue
        found, places = find_relative(value, recipe_dir)
        if found is not None:
            merged[key] = found
        elif looks_local(value):
            maker = maker_of(value, recipe_dir)
            made = f"; it is made by `{maker}`" if maker else ""
            raise UserInputError(f"recipe: key '{key}': local path '{value}' does not exist (looked in "
                                 f"{places_text(places)}){made}")


def maker_of(path: str, recipe_dir: Path) -> str | None:
    """The command that makes ``path``, when something in the recipe's folder does: a recipe there whose
    ``output_dir`` is ``path`` or holds it (``trl-ext train RECIPE``), else a script there whose output folder (the default of
    its ``--out`` argument or ``out*`` parameter) is ``path`` or holds it, the deepest such folder first
    (``python SCRIPT``)."""
    norm = Path(path).as_posix().rstrip("/")
    for recipe in sorted(recipe_dir.glob("*.yaml")):
        try:
            out = (yaml.safe_load(recipe.read_text()) or {}).get("output_dir")
        except (OSError, yaml.YAMLError, AttributeError):
            continue
        out = Path(out).as_posix().rstrip("/") if isinstance(out, str) else None
        if out is not None and (norm == out or norm.startswith(out + "/")):  # its folder, or inside it (value_model/)
            return f"trl-ext train {recipe.as_posix()}"
    best: tuple[int, Path] | None = None
    for script in sorted(recipe_dir.glob("*.py")):
        for out in _output_defaults(script):
            out = out.rstrip("/")
            if (norm == out or norm.startswith(out + "/")) and (best is None or len(out) > best[0]):
                best = (len(out), script)
    return f"python {best[1].as_posix()}" if best else None


def _output_defaults(script: Path) -> list[str]:
    """String defaults of a script's output argument: ``add_argument("--out...", default="...")`` or a function
    parameter named ``out*`` with a string default."""
    try:
        tree = ast.parse(script.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument" and node.args:
            flag = node.args[0]
            if isinstance(flag, ast.Constant) and str(flag.value).lstrip("-").startswith("out"):
                found += [kw.value.value for kw in node.keywords if kw.arg == "default"
                          and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.args[len(node.args.args) - len(node.args.defaults):]
            found += [d.value for a, d in zip(args, node.args.defaults)
                      if a.arg.startswith("out") and isinstance(d, ast.Constant) and isinstance(d.value, str)]
    return found


def hub_names(recipe) -> list[tuple[str, str]]:
    """``(what, name)`` of the recipe's datasets and models that are Hub names, not local paths: ``check`` (offline)
    cannot tell whether they exist or what they hold."""
    out = []
    s, p = recipe.script_args, recipe.pipeline
    for what, name in (("dataset", s.dataset_name), ("ptx dataset", getattr(p, "ptx_dataset_name", None)),
                       ("eval dataset", getattr(p, "eval_dataset_name", None))):
        if isinstance(name, str) and name and not looks_local(name):
            out.append((what, name))
    models = [("model", recipe.model_args)]
    models += [("reward model", recipe.reward_model_args), ("value model", recipe.value_model_args)]
    seen = set()
    for what, args in models:
        name = getattr(args, "model_name_or_path", None) if args is not None else None
        if isinstance(name, str) and name and not name.startswith(_TINY) and not looks_local(name) \
                and name not in seen:
            seen.add(name)
            out.append((what, name))
    return out
