"""Ranked preference data (InstructGPT-style): K >= 2 responses per prompt, best first. How it works:
docs/internals.md#ranked-data."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from transformers.data.data_collator import DataCollatorMixin

from ..errors import UserInputError
from ..trl_internals import DataCollatorForPreference, get_dataset_column_names, pad, tokenize

logger = logging.getLogger(__name__)

PAIRWISE_COLUMNS = ("chosen", "rejected", "chosen_ids", "rejected_ids")
RANKED_COLUMNS = ("responses", "responses_ids")


def _is_messages(value) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(isinstance(m, dict) and "role" in m for m in value)


def preference_dataset_kind(dataset: Dataset | IterableDataset, dataset_name: str) -> str:
    """`"pairwise"` (TRL's chosen/rejected columns) or `"ranked"` (a `responses` column); raise on a mix."""
    columns = get_dataset_column_names(dataset)
    pairwise = [c for c in PAIRWISE_COLUMNS if c in columns]
    ranked = [c for c in RANKED_COLUMNS if c in columns]
    if pairwise and ranked:
        where = ""
        if isinstance(dataset, Dataset):
            pair_col, rank_col = pairwise[0], ranked[0]
            pair_rows = [i for i, v in enumerate(dataset[pair_col]) if v is not None]
            rank_rows = [i for i, v in enumerate(dataset[rank_col]) if v is not None]
            if pair_rows and rank_rows:
                where = f" (row {pair_rows[0]} is pairwise, row {rank_rows[0]} is ranked)"
        raise UserInputError(
            f"{dataset_name} dataset mixes pairwise columns {pairwise} and ranked columns {ranked}{where}; use one "
            "format per dataset (a pair is the ranked list responses=[chosen, rejected])"
        )
    if ranked:
        if "margin" in columns:
            raise UserInputError(
                f"{dataset_name} dataset: the `margin` column is only supported for pairwise data "
                "(chosen/rejected), not with `responses`; drop the column"
            )
        return "ranked"
    return "pairwise"


def _check_row(responses, idx: int, dataset_name: str, conversational: bool) -> None:
    if not isinstance(responses, list) or len(responses) < 2:
        got = f"{len(responses)} response(s)" if isinstance(responses, list) else type(responses).__name__
        raise UserInputError(
            f"{dataset_name} dataset row {idx}: `responses` must be a list of at least 2 responses, best first; "
            f"got {got}"
        )
    for j, response in enumerate(responses):
        ok = _is_messages(response) if conversational else isinstance(response, str)
        if not ok:
            expected = "a list of messages ({'role', 'content'} dicts)" if conversational else "a string"
            raise UserInputError(
                f"{dataset_name} dataset row {idx}: responses[{j}] must be {expected} like the other responses, "
                f"got {type(response).__name__}: {str(response)[:60]!r}"
            )


def tokenize_completion(example: dict[str, Any], response, processing_class, conversational: bool) -> list[int]:
    """Token ids of ``example``'s prompt followed by ``response``, as TRL's `RewardTrainer` tokenizes a `chosen`
    completion: EOS appended to plain text, `prompt + response`; chat messages through `trl.data_utils._tokenize`
    with the row's `tools` and `chat_template_kwargs`. Also what `trl-ext score` scores."""
    prompt = example.get("prompt")
    if conversational:
        tools = example.get("tools")
        tools = json.loads(tools) if isinstance(tools, str) else tools
        kwargs = {"tools": tools, **(example.get("chat_template_kwargs") or {})}
        messages = (prompt or []) + response
        return list(tokenize(processing_class, messages, **kwargs)["input_ids"])
    eos = processing_class.eos_token
    text = response if response.endswith(eos) else response + eos
    return list(tokenize(processing_class, (prompt or "") + text)["input_ids"])


def tokenize_ranked_row(
    example: dict[str, Any], idx: int, processing_class, conversational: bool, dataset_name: str
) -> dict[str, list[list[int]]]:
    """Tokenize the K responses of one row exactly as TRL's `RewardTrainer` tokenizes a `chosen` response."""
    responses = example["responses"]
    _check_row(responses, idx, dataset_name, conversational)
    ids = []
    for j, response in enumerate(responses):
        tokens = tokenize_completion(example, response, processing_class, conversational)
        if len(tokens) == 0:
            raise UserInputError(
                f"{dataset_name} dataset row {idx}: responses[{j}] tokenizes to no tokens; remove or fix the row"
            )
        ids.append(list(tokens))
    return {"responses_ids": ids}


def prepare_ranked_dataset(dataset, processing_class, args, dataset_name: str):
    """Tokenize (unless `responses_ids` is given), validate, and apply `max_length` to a ranked dataset.

    `max_length` (TRL drops a pair when either response is longer) drops each response longer than `max_length`
    and keeps the ranking of the others; a row left with fewer than 2 responses is dropped. For K = 2 this is
    TRL's rule.
    """
    map_kwargs = {}
    if isinstance(dataset, Dataset):
        map_kwargs["num_proc"] = args.dataset_num_proc
    columns = get_dataset_column_names(dataset)
    if "responses_ids" not in columns:
        first = next(iter(dataset))
        conversational = _is_messages(first.get("prompt")) or (
            isinstance(first["responses"], list) and len(first["responses"]) > 0 and _is_messages(first["responses"][0])
        )
        if isinstance(dataset, Dataset):
            map_kwargs["desc"] = f"Tokenizing {dataset_name} dataset"
        dataset = dataset.map(
            tokenize_ranked_row,
            with_indices=True,
            fn_kwargs={
                "processing_class": processing_class,
                "conversational": conversational,
                "dataset_name": dataset_name,
            },
            **map_kwargs,
        )
    else:

        def check(example, idx):
            responses_ids = example["responses_ids"]
            if not isinstance(responses_ids, list) or len(responses_ids) < 2:
                raise UserInputError(
                    f"{dataset_name} dataset row {idx}: `responses_ids` must hold at least 2 token lists, best first"
                )
            for j, ids in enumerate(responses_ids):
                if not isinstance(ids, list) or len(ids) == 0:
                    raise UserInputError(f"{dataset_name} dataset row {idx}: responses_ids[{j}] is empty or not a list")
            return example

        dataset = dataset.map(check, with_indices=True, **map_kwargs)
    if args.max_length is not None:
        max_length = args.max_length

        def keep_short(example):
            return {"responses_ids": [ids for ids in example["responses_ids"] if len(ids) <= max_length]}

        if isinstance(dataset, Dataset):
            map_kwargs["desc"] = f"Filtering {dataset_name} >{max_length} tokens"
        before = dataset
        dataset = dataset.map(keep_short, **map_kwargs)
        dataset = dataset.filter(lambda example: len(example["responses_ids"]) >= 2, **map_kwargs)
        if isinstance(dataset, Dataset):
            total = sum(len(r) for r in before["responses_ids"])
            kept = sum(len(r) for r in dataset["responses_ids"])
            if kept < total:
                logger.warning(
                    f"{dataset_name} dataset: max_length={max_length} dropped {total - kept} of {total} responses "
                    f"and {len(before) - len(dataset)} of {len(before)} rows (rows need 2 responses left)"
                )
    return dataset


@dataclass
class DataCollatorForRankedPreference(DataCollatorMixin):
    """Pads ranked examples into one batch: all K_e responses of every example, example by example, best first.

    Returns `input_ids` and `attention_mask` of shape `(sum_e K_e, max_len)` (right padding) and `num_responses`
    (`K_e` per example), so that every response of the batch is scored in one forward pass. Examples with
    different K share a batch. Pairwise examples (`chosen_ids`/`rejected_ids`) are passed to TRL's
    `DataCollatorForPreference` unchanged, so pairwise batches are exactly TRL's.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if "responses_ids" not in examples[0]:
            return DataCollatorForPreference(self.pad_token_id, self.pad_to_multiple_of)(examples)
        input_ids = [torch.tensor(ids) for example in examples for ids in example["responses_ids"]]
        attention_mask = [torch.ones_like(ids) for ids in input_ids]
        return {
            "input_ids": pad(
                input_ids, padding_value=self.pad_token_id, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of
            ),
            "attention_mask": pad(
                attention_mask, padding_value=0, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of
            ),
            "num_responses": torch.tensor([len(example["responses_ids"]) for example in examples]),
        }
