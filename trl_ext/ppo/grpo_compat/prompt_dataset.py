"""The trainer's prompt datasets as TRL's `GRPOTrainer` takes them: a `prompt` column, text or chat messages. How it
works: docs/ppo-internals.md#prompt-datasets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...field_rules import MappingArgs, mapping_field
from ...errors import UserInputError

__all__ = ["PromptArgs", "prepare_prompt_datasets", "tokenize_prompts"]


@dataclass
class PromptArgs(MappingArgs):
    """Config field of the prompt rendering, mixed into :class:`trl_ext.PPOConfig` (TRL `GRPOConfig`'s key).

    Parameters:
        chat_template_kwargs (`dict[str, Any]`, *optional*):
            Keyword arguments of `apply_chat_template` when the trainer renders chat-message prompts (a `prompt`
            column of message lists), e.g. `{"enable_thinking": false}`. As TRL's `GRPOConfig` key of that name.
    """

    chat_template_kwargs: dict[str, Any] | str | None = mapping_field(
        "Keyword arguments of apply_chat_template for chat-message prompts (GRPOConfig's key).")


def tokenize_prompts(dataset, tokenizer, *, num_proc: int | None = None, keep_columns: bool = False,
                     chat_template_kwargs: dict | None = None):
    """`prompt` -> `input_ids` as TRL's GRPOTrainer tokenizes prompts (module docstring); a dataset with
    `input_ids` is returned as it is (reduced to `input_ids` unless `keep_columns`).

    `keep_columns`: keep every other column next to `input_ids` (`prompt`, `solution`, ...) for reward functions;
    otherwise only `input_ids` is left, as TRL's PPO expects.
    """
    if "input_ids" in dataset.column_names:
        return dataset if keep_columns else dataset.select_columns(["input_ids"])
    template_kwargs = dict(chat_template_kwargs or {})

    def tokenize(example):
        prompt = example["prompt"]
        if isinstance(prompt, list):
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, **template_kwargs)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(prompt, padding=False)["input_ids"]
        return {"input_ids": list(ids)}

    return dataset.map(tokenize, remove_columns=[] if keep_columns else dataset.column_names, num_proc=num_proc)


def _prepared(dataset, tokenizer, args, name: str, keep_columns: bool):
    names = getattr(dataset, "column_names", None)
    if dataset is None or names is None or isinstance(names, dict):  # None; streamed; a dict of datasets
        return dataset
    if "input_ids" in names:
        return dataset
    if "prompt" not in names:
        raise UserInputError(
            f"{name}: has no column 'prompt' or 'input_ids' (columns: {', '.join(names) or 'none'}); PPOTrainer "
            "takes prompts as text or chat messages in 'prompt' (as GRPOTrainer does), or tokenized in 'input_ids'"
        )
    tokenizer.padding_side = "left"  # generation continues each prompt; GRPOTrainer pads prompts on the left too
    return tokenize_prompts(dataset, tokenizer, num_proc=getattr(args, "dataset_num_proc", None),
                            keep_columns=keep_columns, chat_template_kwargs=getattr(args, "chat_template_kwargs", None))


def prepare_prompt_datasets(args, tokenizer, train_dataset, eval_dataset, *, keep_columns: bool):
    """`(train_dataset, eval_dataset)` with `input_ids`: a `prompt` column tokenized (module docstring), one with
    `input_ids` unchanged; refuses, in one line naming its columns, a dataset with neither.

    `keep_columns`: keep the other columns (the trainer has `reward_funcs`, which receive them)."""
    return (_prepared(train_dataset, tokenizer, args, "train_dataset", keep_columns),
            _prepared(eval_dataset, tokenizer, args, "eval_dataset", keep_columns))
