"""Import a shipped recipe folder's script (recipes/gold/make_data.py, recipes/verifiable/evaluate.py, ...) under a
name of its own: the gold and verifiable tasks both have a `make_data.py` and an `evaluate.py`, and one pytest worker
may import both (a plain `import make_data` would hand the second test the first task's module)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def recipe_module(folder: str, name: str):
    """`recipes/<folder>/<name>.py` as module `recipes_<folder>_<name>` (its folder on sys.path while it loads, so
    that it finds its sibling modules, whose names are unique)."""
    key = f"recipes_{folder.replace('-', '_').replace('.', '_')}_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = RECIPES / folder / f"{name}.py"
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        sys.modules[key] = module
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(key, None)
        raise
    finally:
        sys.path.remove(str(path.parent))
    return module


def read_jsonl(path) -> list[dict]:
    """The rows of a JSON-lines file a recipe's `make_data.py` wrote."""
    return [json.loads(line) for line in Path(path).read_text().splitlines()]
