"""Whether a model or dataset name is meant as a local path or as a Hub id (``name`` or ``org/name``).

One rule for the recipe checks and the model loaders, so that a path the recipe check lets through is not refused
later by a loader (or the other way round).
"""

from __future__ import annotations

import os

DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".yaml")


def looks_local(path: str) -> bool:
    """True for anything that exists, starts with ``.``, ``/``, ``~`` or a drive, has more than one ``/`` (Hub ids
    have at most one), ends like a data file, or is ``dir/name`` under an existing ``./dir``."""
    if path.startswith((".", "/", "~", "\\")) or os.path.isabs(path) or os.path.splitdrive(path)[0]:
        return True
    if os.path.exists(path) or path.lower().endswith(DATA_FILE_SUFFIXES):
        return True
    parts = path.replace("\\", "/").split("/")
    if len(parts) > 2:
        return True
    return len(parts) == 2 and os.path.isdir(parts[0])  # e.g. "models/my-run" where ./models exists


def find_relative(path: str | os.PathLike, base_dir: str | os.PathLike | None) -> tuple[str | None, list[str]]:
    """The rule for relative paths in a recipe: look in ``base_dir`` (the recipe's folder) first, then in the current
    directory. Returns ``(the path found or None, the places looked at)``; an absolute (or ``~``) path is only
    looked for as it is. A path found in ``base_dir`` comes back absolute, so that it holds from any directory; one
    found in the current directory comes back as written."""
    path = os.fspath(path)
    expanded = os.path.expanduser(path)
    if os.path.isabs(expanded) or base_dir is None:
        return (path if os.path.exists(expanded) else None), [expanded]
    in_base = os.path.normpath(os.path.join(os.fspath(base_dir), path))
    places = [in_base] if os.path.normpath(os.path.abspath(in_base)) == os.path.abspath(path) else [in_base, path]
    if os.path.exists(in_base):
        return (os.path.abspath(in_base) if len(places) > 1 else path), places
    if len(places) > 1 and os.path.exists(path):
        return path, places
    return None, places


def places_text(places: list[str]) -> str:
    """``'a' (the recipe's folder) and 'b' (the current directory)`` for an error message."""
    if len(places) == 1:
        return f"'{places[0]}'"
    return f"'{places[0]}' (the recipe's folder) and '{places[1]}' (the current directory)"
