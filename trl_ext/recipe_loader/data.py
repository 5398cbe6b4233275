"""Datasets for recipes: open a split from the hub, a local file or a ``save_to_disk`` directory, check its columns.
How it works: docs/internals-recipes.md#recipe-data."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserInputError
from .file_text import check_file_text

FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def open_split(name: str, split: str, *, config: str | None = None, key: str = "dataset_name",
               split_key: str = "dataset_train_split", streaming: bool = False):
    """Open one split of a dataset.

    ``name`` is a local ``.json``/``.jsonl``/``.parquet``/``.csv`` file (its only split is ``train``), a directory
    written by ``save_to_disk`` (a ``Dataset``, whose only split is ``train``, or a ``DatasetDict``), a directory of
    data files (splits from the file names, as ``datasets.load_dataset`` infers them), or a hub dataset name.
    """
    import datasets

    path = Path(os.path.expanduser(name))
    if path.is_file():
        builder = FILE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise UserInputError(
                f"{key}: unsupported file type '{path.suffix}' for '{name}' (use .json, .jsonl, .parquet or .csv)"
            )
        check_file_text(path, key=key)  # undecodable text or a bad jsonl line: one line, not a parser traceback

        def load_file():
            try:
                return datasets.load_dataset(builder, data_files=str(path), split="train")
            except Exception as err:  # noqa: BLE001 - any parser failure is reported as the user's file
                first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise UserInputError(f"{key}: cannot read '{name}': {first}") from None

        splits = {"train": load_file}
    elif path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.Dataset):
            splits = {"train": lambda: loaded}
        else:
            splits = {s: (lambda s=s: loaded[s]) for s in loaded}
    else:
        try:
            loaded = datasets.load_dataset(str(path) if path.is_dir() else name, config, streaming=streaming)
        except UserInputError:
            raise
        except Exception as err:  # noqa: BLE001 - any loader failure is reported as the user's key
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserInputError(f"{key}: cannot open dataset '{name}': {first}") from None
        splits = {s: (lambda s=s: loaded[s]) for s in loaded}
    if split not in splits:
        raise UserInputError(
            f"{split_key}: dataset '{name}' has no split '{split}' (splits: {', '.join(sorted(splits))})"
        )
    return splits[split]()


def eval_source(recipe) -> tuple[str, str, str | None, str, str]:
    """Where a recipe's evaluation data is: ``(name, split, config, name key, split key)``: ``eval_dataset_name``
    (its ``eval_dataset_split``) when set, else ``dataset_name``'s ``dataset_test_split`` (TRL's ScriptArguments)."""
    p, s = recipe.pipeline, recipe.script_args
    if getattr(p, "eval_dataset_name", None):
        return p.eval_dataset_name, p.eval_dataset_split, None, "eval_dataset_name", "eval_dataset_split"
    return s.dataset_name, s.dataset_test_split, s.dataset_config, "dataset_name", "dataset_test_split"


def open_eval_split(recipe, *, required: bool, streaming: bool = False):
    """The recipe's evaluation split (:func:`eval_source`), or None when it has none and the run can do without
    (``required`` False: TRL's sample generations). With ``required`` (``eval_strategy`` not ``no``) a missing split
    is refused in one line naming the keys that give one."""
    name, split, config, key, split_key = eval_source(recipe)
    try:
        return open_split(name, split, config=config, key=key, split_key=split_key, streaming=streaming)
    except UserInputError as err:
        if "has no split" not in str(err):
            raise
        if not required:
            return None
        problem = str(err).split(": ", 1)[1]
        raise UserInputError(f"eval_strategy: evaluation needs its data, and {problem}; name it with "
                             "dataset_test_split or eval_dataset_name, or set eval_strategy 'no'") from None


def check_columns(dataset, trainer: str, *, name: str, split: str, text_column: str = "text") -> None:
    """Raise a one-line UserInputError if ``dataset`` lacks the columns ``trainer`` needs.

    ``text_column`` is SFT's ``dataset_text_field`` and PPO-ptx's ``ptx_text_column``.
    """
    names = dataset.column_names
    if names is None:  # a streamed dataset whose features are unknown: look at its first example
        names = list(next(iter(dataset), {}).keys())
    cols = list(names)
    have = set(cols)
    where = f"dataset '{name}' split '{split}'"
    listing = f"(columns: {', '.join(cols) or 'none'})"
    if trainer == "sft":
        if "input_ids" in have:
            return
        if "prompt" in have:
            if "completion" not in have:
                raise UserInputError(
                    f"{where} has 'prompt' but no column 'completion' {listing}; SFT on prompt-completion data needs "
                    "both"
                )
            return
        if text_column not in have and "messages" not in have and "conversations" not in have:
            raise UserInputError(
                f"{where} has no column '{text_column}' {listing}; SFT needs '{text_column}' (the dataset_text_field), "
                "'messages', 'prompt' and 'completion', or 'input_ids'"
            )
    elif trainer == "reward":
        if "responses" in have:
            return
        missing = [c for c in ("chosen", "rejected") if c not in have]
        if missing:
            raise UserInputError(
                f"{where} has no column '{missing[0]}' {listing}; reward training needs 'chosen' and 'rejected' "
                "(or a ranked 'responses' list)"
            )
    elif trainer == "dpo":
        missing = [c for c in ("chosen", "rejected") if c not in have]
        if missing:
            raise UserInputError(f"{where} has no column '{missing[0]}' {listing}; DPO needs 'chosen' and 'rejected'")
    elif trainer == "ppo":
        if "prompt" not in have and "input_ids" not in have:
            raise UserInputError(
                f"{where} has no column 'prompt' {listing}; PPO needs 'prompt' (text or chat messages) or 'input_ids'"
            )
    elif trainer == "ptx":
        if text_column not in have and "input_ids" not in have:
            raise UserInputError(
                f"{where} has no column '{text_column}' {listing}; set ptx_text_column or provide 'input_ids'"
            )
    else:  # pragma: no cover - programming error
        raise ValueError(f"unknown trainer {trainer!r}")


def tokenize_prompts(dataset, tokenizer, *, num_proc: int | None = None, keep_columns: bool = False,
                     chat_template_kwargs: dict | None = None):
    """PPO prompts -> ``input_ids`` as TRL's GRPOTrainer tokenizes them (chat messages through the chat template with
    the generation prompt): :func:`trl_ext.ppo.grpo_compat.prompt_dataset.tokenize_prompts`, which the trainer also
    uses.

    ``keep_columns``: keep every other column next to ``input_ids`` (``prompt``, ``solution``, ...), for reward
    functions, which receive them; otherwise only ``input_ids`` is left, as TRL's PPO expects.
    """
    from ..ppo.grpo_compat.prompt_dataset import tokenize_prompts as tokenize

    return tokenize(dataset, tokenizer, num_proc=num_proc, keep_columns=keep_columns,
                    chat_template_kwargs=chat_template_kwargs)


def ptx_texts(dataset, text_column: str):
    """The ptx dataset reduced to its text (``text``) or ``input_ids`` column, as PPO-ptx expects."""
    if "input_ids" in dataset.column_names:
        return dataset.select_columns(["input_ids"])
    ds = dataset.select_columns([text_column])
    return ds.rename_column(text_column, "text") if text_column != "text" else ds
