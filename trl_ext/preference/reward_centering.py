"""Reward centering: fold a constant offset into a reward model's score head (InstructGPT, section C.2).

InstructGPT normalises its reward model after training "using a bias so that the labeler demonstrations achieve
a mean score of 0". :func:`fold_reward_offset` does that: it subtracts the offset from the score head's bias, so
the saved model outputs centred rewards with no wrapper at inference time.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..errors import UserInputError
from ..models import biased_score_model


def _is_peft(model) -> bool:
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover
        return False
    return isinstance(model, PeftModel)


def score_head(model) -> nn.Linear:
    """The `nn.Linear` that produces the reward: `model.score`, or the trained copy of it inside a PEFT model
    (`modules_to_save=["score"]` or `task_type="SEQ_CLS"`)."""
    root = model.get_base_model() if _is_peft(model) else model
    head = getattr(root, "score", None)
    if head is None:
        raise UserInputError(
            f"center_rewards_after_training: {type(root).__name__} has no `score` head; centering supports "
            "*ForSequenceClassification models with a `score` Linear"
        )
    if hasattr(head, "modules_to_save"):  # peft ModulesToSaveWrapper: the active adapter's trained copy
        adapter = head.active_adapters[0] if hasattr(head, "active_adapters") else head.active_adapter
        head = head.modules_to_save[adapter]
    if not isinstance(head, nn.Linear):
        raise UserInputError(
            f"center_rewards_after_training: the score head is a {type(head).__name__}, not an nn.Linear; "
            "centering cannot fold an offset into it"
        )
    return head


def check_centering_supported(model) -> None:
    """Fail before training when the offset could not be saved: a PEFT adapter whose score head has no bias.

    The adapter stores a copy of `score`; on reload peft copies the base model's bias-free head and would drop
    a bias silently.
    """
    if _is_peft(model) and score_head(model).bias is None:
        raise UserInputError(
            "center_rewards_after_training with a PEFT adapter needs a score head with a bias, and this one has "
            "none: the adapter could not store the offset. Merge the adapter after training "
            "(model.merge_and_unload()) and centre the merged model with RewardTrainer.center_rewards(), or "
            "set center_rewards_after_training=False"
        )


def fold_reward_offset(model, offset: float) -> None:
    """Subtract `offset` from the reward model's output by changing the score head's bias in place.

    A head without a bias (transformers' `GenericForSequenceClassification`: Llama, Qwen2, Mistral, ...) is
    replaced by an identical `nn.Linear` with a bias, and the model becomes an instance of
    :func:`trl_ext.models.biased_score_model.biased_score_class` of its class: same forward, and `save_pretrained` also
    writes the loader file and `config.auto_map`, so the saved model reloads with its bias through
    `AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True)`.
    """
    head = score_head(model)
    if head.bias is None:
        if _is_peft(model):
            check_centering_supported(model)
        new = nn.Linear(
            head.in_features, head.out_features, bias=True, device=head.weight.device, dtype=head.weight.dtype
        )
        with torch.no_grad():
            new.weight.copy_(head.weight)
            new.bias.zero_()
        new.weight.requires_grad_(head.weight.requires_grad)
        model.score = new
        model.__class__ = biased_score_model.biased_score_class(type(model))
        head = new
    with torch.no_grad():
        head.bias.sub_(offset)
