"""Dataset columns next to the tokenized prompt: the collator that carries them, and their repetition per sample.

TRL's PPO trains on a dataset of ``input_ids`` that ``DataCollatorWithPadding`` pads; reward functions also need
the other columns of each row (the reference answer, test cases, ...), one value per completion. The collator pads
the tensors as before and passes every other column through as a list, in the batch's row order.
"""

from __future__ import annotations

__all__ = ["TENSOR_COLUMNS", "ColumnsCollator", "batch_columns"]

TENSOR_COLUMNS = ("input_ids", "attention_mask")
"""The columns the inner collator pads; every other column travels as a list."""


class ColumnsCollator:
    """Wraps a padding collator (TRL's ``DataCollatorWithPadding``): it pads ``input_ids`` (and
    ``attention_mask``); any other column is returned as a list of the rows' values, in row order.

    With a dataset of ``input_ids`` only, its batches are the inner collator's (bit for bit).
    """

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, features: list[dict]) -> dict:
        batch = self.inner([{key: row[key] for key in row if key in TENSOR_COLUMNS} for row in features])
        for key in features[0] if features else ():
            if key not in TENSOR_COLUMNS:
                batch[key] = [row[key] for row in features]
        return batch


def batch_columns(batch: dict) -> dict[str, list]:
    """The columns of a collated batch that are lists (the dataset's non-tensor columns)."""
    return {key: value for key, value in batch.items() if key not in TENSOR_COLUMNS and isinstance(value, list)}
