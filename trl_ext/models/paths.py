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
