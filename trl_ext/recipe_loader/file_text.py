"""Local data files read as text before ``datasets`` parses them (whose own error is a traceback): a
``.jsonl``/``.json``/``.csv`` file whose bytes are not UTF-8, an empty file, or a ``.jsonl`` line that is not a JSON
object, each as one line naming the file, row (line) and column.

:func:`trl_ext.recipe_loader.data.open_split` calls :func:`check_file_text` on every local file it opens; the row checks
after parsing are in :mod:`trl_ext.recipe_loader.data_rows`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..errors import UserInputError

__all__ = ["check_file_text"]


def check_file_text(path: str | Path, *, key: str = "dataset_name") -> None:
    """Refuse a local text data file that is not UTF-8, or a ``.jsonl`` line that is not a JSON object."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".csv"):
        return
    data = path.read_bytes()
    what = "dataset" if key == "dataset_name" else key
    if not data.strip():
        raise UserInputError(f"{what} '{path}' is empty: no rows to train on")
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start)
        where = f"{what} '{path}' line {line + 1}"
        column = _column_of_bad_bytes(data.split(b"\n")[line]) if suffix == ".jsonl" else None
        if suffix == ".jsonl":
            where = f"{what} '{path}' row {_row_of_line(data, line)} (line {line + 1})"
        col = f" column '{column}'" if column else ""
        raise UserInputError(f"{where}{col}: undecodable text (byte 0x{data[err.start]:02x} is not UTF-8)") from None
    if suffix != ".jsonl":
        return
    row = 0
    for i, raw in enumerate(data.decode("utf-8").split("\n")):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as err:
            raise UserInputError(f"{what} '{path}' row {row} (line {i + 1}): not valid JSON ({err.msg})") from None
        if not isinstance(value, dict):
            raise UserInputError(f"{what} '{path}' row {row} (line {i + 1}): not a JSON object of columns")
        row += 1


def _row_of_line(data: bytes, line: int) -> int:
    return sum(1 for raw in data.split(b"\n")[:line] if raw.strip())


def _column_of_bad_bytes(raw: bytes) -> Optional[str]:
    try:
        value = json.loads(raw.decode("utf-8", errors="replace"))
    except json.JSONDecodeError:
        return None
    if isinstance(value, dict):
        return next((k for k, v in value.items() if "\ufffd" in json.dumps(v, ensure_ascii=False)), None)
    return None
