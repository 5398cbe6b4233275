"""Row checks of recipe datasets: bad rows found before training, each as one line naming the file, row and column.
How it works: docs/internals-recipes.md#data-rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from ..errors import UserInputError
from .data import check_columns, open_split

# Columns whose values are text a trainer learns from or conditions on, per trainer kind.
TEXT_COLUMNS = {
    "sft": ("prompt", "completion", "messages", "conversations"),  # plus the dataset_text_field
    "reward": ("prompt", "chosen", "rejected", "responses"),
    "dpo": ("prompt", "chosen", "rejected"),
    "ppo": ("prompt",),
    "ptx": (),  # the ptx_text_column
}
BATCH = 1000


def _where(name: str, split: str, row: int, column: Optional[str] = None) -> str:
    line = f" (line {row + 1})" if str(name).endswith(".jsonl") else ""
    col = f" column '{column}'" if column else ""
    return f"dataset '{name}' split '{split}' row {row}{line}{col}"


def _text_problem(value) -> Optional[str]:
    """What is wrong with a text value (a string, a list of chat messages, or a list of responses), or None."""
    if value is None:
        return "missing (null)"
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return "undecodable text (not UTF-8)"
    if isinstance(value, str):
        if "\ufffd" in value:
            return "undecodable text (U+FFFD replacement characters)"
        return None if value.strip() else ("empty text" if not value else "whitespace-only text")
    if isinstance(value, dict):  # a chat message; an empty system prompt or a tool call's null content is fine
        if value.get("role") == "system" and isinstance(value.get("content"), str) or value.get("tool_calls"):
            return None
        return _text_problem(value.get("content"))
    if isinstance(value, (list, tuple)):
        if not value:
            return "empty list"
        for item in value:
            problem = _text_problem(item)
            if problem:
                return problem
    return None


def _columns(trainer: str, names, text_column: str) -> list[str]:
    cols = [c for c in TEXT_COLUMNS[trainer] if c in names]
    if trainer in ("sft", "ptx") and text_column in names and text_column not in cols:
        cols.append(text_column)
    return cols


RESPONSE_COLUMNS = ("chosen", "rejected", "responses", "completion")


def check_rows(dataset, trainer: str, *, name: str, split: str, text_column: str = "text",
               allow_empty_responses: bool = False) -> None:
    """Refuse an empty dataset and the first bad row (see the module docstring); ``dataset`` is a ``datasets``
    ``Dataset`` (a streamed dataset is not read here). ``allow_empty_responses``: the recipe key of that name
    (empty or whitespace-only text in :data:`RESPONSE_COLUMNS` is then accepted)."""
    if not hasattr(dataset, "__len__"):
        return
    if len(dataset) == 0:
        raise UserInputError(f"dataset '{name}' split '{split}' has no rows: nothing to train on")
    names = dataset.column_names or []
    if "input_ids" in names:  # already tokenized
        return
    cols = _columns(trainer, names, text_column)
    if not cols:
        return
    pairs = trainer in ("reward", "dpo") and "chosen" in cols and "rejected" in cols
    start = 0
    for batch in dataset.select_columns(cols).iter(batch_size=BATCH):
        n = len(batch[cols[0]])
        for i in range(n):
            for col in cols:
                value = batch[col][i]
                if col == "prompt" and trainer in ("reward", "dpo", "sft") and value is None:
                    continue  # an optional prompt (reward/DPO pairs with the prompt in chosen/rejected)
                problem = _text_problem(value)
                if problem and allow_empty_responses and col in RESPONSE_COLUMNS and problem.endswith("text") \
                        and ("empty" in problem or "whitespace" in problem):
                    problem = None
                if problem:
                    raise UserInputError(f"{_where(name, split, start + i, col)}: {problem}")
            if pairs and batch["chosen"][i] == batch["rejected"][i]:
                raise UserInputError(
                    f"{_where(name, split, start + i, 'rejected')}: identical to 'chosen' (a pair must differ)"
                )
        start += n


def prompt_length_limit(trainer: str, training_args, model_config=None) -> Optional[tuple[int, str]]:
    """The number of tokens a prompt must stay under, and what sets it; None when there is no limit (or unknown).

    ``model_config``: the checkpoint's config (``config.json`` as a dict or a ``PretrainedConfig``), for PPO.
    """
    if trainer in ("sft", "reward", "dpo"):
        limit = getattr(training_args, "max_length", None)
        return (int(limit), f"max_length: {limit}") if limit else None
    if trainer == "ppo" and model_config is not None:
        get = model_config.get if isinstance(model_config, dict) else (lambda k: getattr(model_config, k, None))
        positions = get("max_position_embeddings")
        if positions:
            response = training_args.response_length
            return (int(positions) - response + 1,
                    f"the model's max_position_embeddings {positions} - response_length {response}")
    return None


def check_prompt_lengths(dataset, trainer: str, tokenizer, limit: Optional[tuple[int, str]], *, name: str,
                         split: str) -> None:
    """Refuse the first row whose prompt alone has ``limit[0]`` tokens or more (PPO: more than the model's positions
    minus the response length). Plain-text prompts and chat-message prompts (through the chat template)."""
    if limit is None or not hasattr(dataset, "__len__"):
        return
    max_tokens, reason = limit
    names = dataset.column_names or []
    if "input_ids" in names and trainer == "ppo":
        column, tokenized = "input_ids", True
    elif "prompt" in names:
        column, tokenized = "prompt", False
    else:
        return
    start = 0
    for batch in dataset.select_columns([column]).iter(batch_size=BATCH):
        values = batch[column]
        if tokenized:
            lengths = [len(v) for v in values]
        else:
            lengths = [_prompt_tokens(tokenizer, v) for v in values]
        for i, n in enumerate(lengths):
            if n is not None and n >= max_tokens:
                raise UserInputError(
                    f"{_where(name, split, start + i, column)}: the prompt alone has {n} tokens, over the limit "
                    f"({reason}); shorten or drop the row, or raise the limit"
                )
        start += len(values)


def _prompt_tokens(tokenizer, prompt) -> Optional[int]:
    if isinstance(prompt, str):
        return len(tokenizer(prompt)["input_ids"])  # as PPO tokenizes its prompts
    if isinstance(prompt, list) and getattr(tokenizer, "chat_template", None):
        try:
            ids = tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - a template that cannot render this prompt: TRL reports it later
            return None
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return len(ids)
    return None


def check_local_data(recipe) -> None:
    """`trl-ext check`: columns and rows of a local train split (and PPO-ptx text), that local evaluation data exists
    when ``eval_strategy`` is on (:func:`check_eval_data`), the reward functions' signatures
    against its columns, its chat prompts and the chat template with tools (:mod:`.tool_keys`), and the prompts'
    lengths when the tokenizer (and, for PPO, the model's ``config.json``) is local too. Hub datasets are checked by
    `train`."""
    from ..models.paths import looks_local
    from .reward_keys import check_reward_columns
    from .tool_keys import check_tool_data, check_tool_tokenizer

    s, args = recipe.script_args, recipe.training_args
    local = bool(s.dataset_name and looks_local(s.dataset_name))
    if not local:  # reward functions: the trainer's own keywords only (the hub dataset's columns are not known)
        check_reward_columns(recipe, None)
    if local:
        text_column = getattr(args, "dataset_text_field", "text")
        ds = open_split(s.dataset_name, s.dataset_train_split, config=s.dataset_config)
        check_columns(ds, recipe.trainer, name=s.dataset_name, split=s.dataset_train_split, text_column=text_column)
        check_reward_columns(recipe, ds.column_names)
        check_tool_data(recipe, ds, name=s.dataset_name, split=s.dataset_train_split)
        check_rows(ds, recipe.trainer, name=s.dataset_name, split=s.dataset_train_split, text_column=text_column,
                   allow_empty_responses=recipe.pipeline.allow_empty_responses)
        if recipe.trainer == "ppo":
            from .validation import check_episodes

            check_episodes(args, len(ds))
        tokenizer, config = _local_tokenizer_and_config(recipe.model_args.model_name_or_path)
        if tokenizer is not None:
            check_tool_tokenizer(recipe, tokenizer)
            limit = prompt_length_limit(recipe.trainer, args, config)
            check_prompt_lengths(ds, recipe.trainer, tokenizer, limit, name=s.dataset_name,
                                 split=s.dataset_train_split)
    check_eval_data(recipe)
    p = recipe.pipeline
    if getattr(p, "ptx_dataset_name", None) and looks_local(p.ptx_dataset_name) and recipe.trainer == "ppo":
        ds = open_split(p.ptx_dataset_name, p.ptx_dataset_split, config=p.ptx_dataset_config,
                        key="ptx_dataset_name", split_key="ptx_dataset_split")
        check_columns(ds, "ptx", name=p.ptx_dataset_name, split=p.ptx_dataset_split, text_column=p.ptx_text_column)
        check_rows(ds, "ptx", name=p.ptx_dataset_name, split=p.ptx_dataset_split, text_column=p.ptx_text_column)


def check_eval_data(recipe) -> None:
    """With ``eval_strategy`` on: PPO evaluates single-turn episodes only, and local evaluation data must exist
    (its rows are read by `train`)."""
    from ..models.paths import looks_local
    from .data import eval_source, open_eval_split

    args = recipe.training_args
    if str(getattr(args, "eval_strategy", "no")).split(".")[-1].lower() == "no":
        return
    if recipe.trainer == "ppo":
        from ..ppo.combination_rules import check_eval_inputs
        from .tool_keys import uses_tools

        check_eval_inputs(args, True, uses_tools(recipe))
    name = eval_source(recipe)[0]
    if name and looks_local(name):
        open_eval_split(recipe, required=True)


def _local_tokenizer_and_config(path: Optional[str]):
    """The tokenizer and ``config.json`` of a local checkpoint (``tiny://`` once built), else (None, None)."""
    from .loader import resolve_tiny_name

    if not path:
        return None, None
    directory = Path(resolve_tiny_name(path)).expanduser()
    if not directory.is_dir() or not (directory / "tokenizer_config.json").exists():
        return None, None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
    except Exception:  # noqa: BLE001 - `train` loads it and reports the problem
        return None, None
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else None
    return tokenizer, config
