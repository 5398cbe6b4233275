"""Padded query+response sequences in PPO: sampling responses, cutting them at the stop token, forward passes.

A batch of episodes is a ``(batch, context_length + response_length)`` tensor of token ids: the (left-padded)
queries followed by the sampled responses, right-padded with ``pad_token_id`` after a stop token. Pad tokens are
masked out of attention, fed to the model as id 0, and positions count only real tokens. Same conventions and
operations as TRL 1.12's PPO (so numbers match on every TRL version).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationConfig

from ...models.positions import first_true_indices  # noqa: F401 - re-exported with the other sequence helpers

INVALID_LOGPROB = 1.0
"""Placeholder log-prob written at padding positions (after a response's last token)."""


def truncate_response(stop_token_id: int, pad_token_id: int, responses: torch.Tensor) -> torch.Tensor:
    """Keep each response up to and including its first ``stop_token_id``; pad everything after it."""
    stop = first_true_indices(responses == stop_token_id).unsqueeze(-1)
    positions = torch.arange(responses.shape[-1], device=responses.device)
    return torch.masked_fill(responses, positions > stop, pad_token_id)


def padded_model_inputs(query_responses: torch.Tensor, pad_token_id: int) -> dict[str, torch.Tensor]:
    """``input_ids`` (pads as 0), ``attention_mask`` (real tokens) and ``position_ids`` (count of real tokens
    before each position) of padded sequences."""
    attention_mask = query_responses != pad_token_id
    return {
        "input_ids": torch.masked_fill(query_responses, ~attention_mask, 0),
        "attention_mask": attention_mask,
        "position_ids": attention_mask.cumsum(1) - attention_mask.long(),  # exclusive cumsum
    }


def forward(model: torch.nn.Module, query_responses: torch.Tensor, pad_token_id: int, logits_to_keep: int = 0):
    """``model``'s output (with hidden states) on padded query+response sequences; ``logits_to_keep``: the policy's
    logits of the last positions only (transformers' argument; 0: every position)."""
    keep = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
    return model(**padded_model_inputs(query_responses, pad_token_id), return_dict=True, output_hidden_states=True,
                 **keep)


def generate(
    policy: torch.nn.Module, queries: torch.Tensor, pad_token_id: int, generation_config: GenerationConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample responses to left-padded ``queries``: ``(queries + responses, logits of every sampled step)``.

    The logits are the processed scores ``generate`` sampled from (after temperature), ``(batch, steps, vocab)``.
    """
    context_length = queries.shape[1]
    inputs = padded_model_inputs(queries, pad_token_id)
    output = policy.generate(
        input_ids=inputs["input_ids"],
        attention_mask=inputs["attention_mask"],
        # no position_ids: generate derives them from the attention mask
        generation_config=generation_config,
        return_dict_in_generate=True,
        output_scores=True,
    )
    logits = torch.stack(output.scores, 1)
    return torch.cat((queries, output.sequences[:, context_length:]), dim=1), logits


def _pad_right(chunks: list[torch.Tensor], value) -> torch.Tensor:
    """Concatenate along dim 0, right-padding dim 1 of each chunk to the longest."""
    length = max(chunk.shape[1] for chunk in chunks)
    padded = []
    for chunk in chunks:
        widths = [0, 0] * (chunk.dim() - 2) + [0, length - chunk.shape[1]]  # F.pad: last dimension first
        padded.append(F.pad(chunk, widths, value=value))
    return torch.cat(padded, 0)


@torch.no_grad()
def batch_generation(
    policy: torch.nn.Module,
    queries: torch.Tensor,
    chunk_size: int,
    pad_token_id: int,
    generation_config: GenerationConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`generate` over ``queries`` in chunks of ``chunk_size``; sequences padded with ``pad_token_id`` and
    logits with 0 to the longest chunk (a chunk stops early when all its responses hit EOS)."""
    query_responses, logits = [], []
    for start in range(0, queries.shape[0], chunk_size):
        query_response, chunk_logits = generate(policy, queries[start : start + chunk_size], pad_token_id,
                                                generation_config)
        query_responses.append(query_response)
        logits.append(chunk_logits)
    return _pad_right(query_responses, pad_token_id), _pad_right(logits, 0)
