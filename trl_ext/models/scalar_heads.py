"""Per-token outputs of scalar-headed models (reward and value models), for plain and PEFT-wrapped models.

TRL's ``get_reward`` runs ``getattr(model, model.base_model_prefix)`` and then ``model.score``. On a
``peft.PeftModel`` the attribute lookup goes through PEFT's ``__getattr__`` chain and lands on the whole
``*ForSequenceClassification`` model rather than its backbone (so the head and the pooling run twice, and a model
whose backbone prefix is not forwarded fails). :func:`scalar_model_parts` resolves the backbone and the head of the
*underlying* model instead: PEFT injects LoRA layers in place, so the backbone keeps its adapters, and a head saved
with ``modules_to_save=["score"]`` (or ``task_type="SEQ_CLS"``) is PEFT's wrapper that routes to the trained copy.
"""

from __future__ import annotations

import torch

from .positions import first_true_indices


def scalar_model_parts(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(backbone, score_head)`` of a ``*ForSequenceClassification``-style model, unwrapping PEFT and DDP."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if hasattr(inner, "get_base_model"):  # peft.PeftModel
        inner = inner.get_base_model()
    prefix = getattr(inner, "base_model_prefix", None)
    backbone = getattr(inner, prefix, None) if prefix else None
    head = getattr(inner, "score", None)
    if backbone is None or head is None:
        from ..errors import UserInputError

        raise UserInputError(
            f"reward/value model: {type(inner).__name__} has no backbone `{prefix}` and `score` head; load it with "
            "AutoModelForSequenceClassification(num_labels=1)"
        )
    return backbone, head


def scalar_model_outputs(
    model: torch.nn.Module, query_responses: torch.Tensor, pad_token_id: int, context_length: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drop-in for TRL's ``get_reward``: ``(per-token logits, score at the last non-pad token, its index)``.

    Same arithmetic as TRL's for a plain model; also right for a PEFT-wrapped one (see module docstring). The head
    reads the backbone's ``last_hidden_state`` (what HF's own sequence classifiers score, and the very tensor TRL
    takes as ``hidden_states[-1]``) without asking for every layer's hidden states, which TRL keeps alive in its
    no-grad scoring passes (``(layers + 1) x batch x length x hidden`` values).
    """
    backbone, head = scalar_model_parts(model)
    attention_mask = query_responses != pad_token_id
    position_ids = attention_mask.cumsum(1) - attention_mask.long()  # exclusive cumsum
    input_ids = torch.masked_fill(query_responses, ~attention_mask, 0)
    output = backbone(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        return_dict=True,
        use_cache=False,
    )
    reward_logits = head(output.last_hidden_state)
    sequence_lengths = first_true_indices(query_responses[:, context_length:] == pad_token_id) - 1 + context_length
    return (
        reward_logits,
        reward_logits[torch.arange(reward_logits.size(0), device=reward_logits.device), sequence_lengths].squeeze(-1),
        sequence_lengths,
    )
