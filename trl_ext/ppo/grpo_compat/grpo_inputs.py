"""GRPOTrainer's inputs in :class:`trl_ext.PPOTrainer`: what lets a GRPOTrainer script run with the trainer's name
changed. One call from ``PPOTrainer.__init__``, first thing after a ``GRPOConfig`` is mapped to a ``PPOConfig``
(:func:`trl_ext.ppo.config.ppo_config_from`):

* models may be ids or paths, loaded as GRPOTrainer loads them, and the tokenizer from the policy's checkpoint when
  ``processing_class`` is None (:mod:`trl_ext.ppo.grpo_compat.model_ids`);
* datasets may have a ``prompt`` column, text or chat messages, tokenized as GRPOTrainer tokenizes them, keeping the
  other columns for reward functions (:mod:`trl_ext.ppo.grpo_compat.prompt_dataset`).

With loaded models, a tokenizer and tokenized datasets everything passes through unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

from .model_ids import load_model_ids
from .prompt_dataset import prepare_prompt_datasets

__all__ = ["TrainerInputs", "grpo_inputs"]


class TrainerInputs(NamedTuple):
    args: object
    processing_class: object
    model: object
    ref_model: object
    reward_model: object
    value_model: object
    reward_funcs: object
    train_dataset: object
    eval_dataset: object


def grpo_inputs(args, processing_class, model, ref_model, reward_model, value_model, reward_funcs, train_dataset,
                eval_dataset, multi_turn: bool = False) -> TrainerInputs:
    """The trainer's inputs with GRPOTrainer's forms resolved: loaded models and tokenizer, tokenized datasets (the
    other columns kept for reward functions, and for tools: ``multi_turn``)."""
    processing_class, model, ref_model, reward_model, value_model, reward_funcs = load_model_ids(
        args, processing_class, model, ref_model, reward_model, value_model, reward_funcs)
    train_dataset, eval_dataset = prepare_prompt_datasets(args, processing_class, train_dataset, eval_dataset,
                                                          keep_columns=reward_funcs is not None or multi_turn)
    return TrainerInputs(args, processing_class, model, ref_model, reward_model, value_model, reward_funcs,
                         train_dataset, eval_dataset)
