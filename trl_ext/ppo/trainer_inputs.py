"""The arguments of :class:`trl_ext.PPOTrainer`, checked and turned into what the parent's ``__init__`` takes, before
any of it runs (:func:`prepare_trainer_inputs`): GRPOTrainer's inputs, the trainer's own arguments against the
config, multi-turn tools, reward functions, LoRA targets, a shared base, float32 gradients under fp16. Bad input is
refused here with one line naming the culprit (docs/ppo.md, "The trainer's arguments").

GRPOTrainer's inputs, so that a GRPOTrainer script runs with the trainer's name changed, first thing after a
``GRPOConfig`` is mapped to a ``PPOConfig`` (:func:`trl_ext.ppo.config.ppo_config_from`): models may be ids or
paths, loaded as GRPOTrainer loads them, and the tokenizer from the policy's checkpoint when ``processing_class`` is
None (:mod:`trl_ext.ppo.grpo_compat.model_ids`); datasets may have a ``prompt`` column, text or chat messages,
tokenized as GRPOTrainer tokenizes them, keeping the other columns for reward functions and tools
(:mod:`trl_ext.ppo.grpo_compat.prompt_dataset`). With loaded models, a tokenizer and tokenized datasets everything
passes through unchanged."""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from torch import nn

from ..errors import UserInputError
from ..models.dtypes import float32_trainable_parameters
from ..models.lora import check_lora_targets
from ..models.shared_base import SharedBaseScalarModel
from .config import PPOConfig, ppo_config_from
from .combination_rules import check_trainer_inputs
from .episodes.toolbox import Toolbox
from .grpo_compat.model_ids import load_model_ids
from .grpo_compat.prompt_dataset import prepare_prompt_datasets
from .objective.critic import check_value_model
from .rollout.reward_funcs import prepare_reward_funcs

__all__ = ["TrainerInputs", "check_shared_base_roles", "prepare_trainer_inputs"]


class TrainerInputs(NamedTuple):
    """What the parent's ``__init__`` gets (``parent``: its keyword arguments but ``args``) and what the extensions
    are built from after it."""

    args: PPOConfig
    parent: dict[str, Any]
    reward_list: Any
    """The rewards, weights and names of ``reward_funcs`` (None without)."""
    ptx_dataset: Any
    toolbox: Toolbox | None
    shared_base: bool
    """Policy, reward and value model are adapters of one base (:mod:`trl_ext.models.shared_base`)."""


def prepare_trainer_inputs(args, processing_class, model, ref_model, reward_model, train_dataset, value_model,
                           data_collator, eval_dataset, optimizers, callbacks, peft_config, ptx_dataset,
                           kl_controller, reward_funcs, tools, environment_factory) -> TrainerInputs:
    """The trainer's arguments (those of :class:`trl_ext.PPOTrainer`), checked and converted (module docstring)."""
    # GRPOTrainer's inputs (module docstring): a GRPOConfig, model ids, `prompt` datasets
    args = ppo_config_from(args)
    processing_class, model, ref_model, reward_model, value_model, reward_funcs = load_model_ids(
        args, processing_class, model, ref_model, reward_model, value_model, reward_funcs)
    train_dataset, eval_dataset = prepare_prompt_datasets(
        args, processing_class, train_dataset, eval_dataset,
        keep_columns=reward_funcs is not None or bool(tools or environment_factory))
    if not isinstance(args, PPOConfig):
        raise UserInputError(f"args: expected a trl_ext.PPOConfig, got {type(args).__name__}")
    ptx_dataset = check_trainer_inputs(args, ptx_dataset, kl_controller,  # the trainer's own arguments
                                       eval_dataset, multi_turn=bool(tools or environment_factory))
    value_model = check_value_model(args, value_model)  # critic-free: a stand-in without parameters
    if args.critic_learning_rate is not None and optimizers[0] is not None:
        raise UserInputError("critic_learning_rate: sets the value model's parameter groups of the optimizer the "
                             "trainer builds, and an optimizer was passed; set the rates in your optimizer's "
                             "groups instead, or pass none")
    toolbox = None
    if tools or environment_factory:  # multi-turn episodes (trl_ext/ppo/episodes): TRL's contract
        toolbox = Toolbox.for_trainer(tools, environment_factory, processing_class, args, train_dataset)
        train_dataset = toolbox.render_dataset(train_dataset)  # prompt lengths with the tools' schema
        reward_funcs = toolbox.with_environment_rewards(reward_funcs)
    reward_model, data_collator, reward_list = prepare_reward_funcs(
        args, processing_class, reward_model, reward_funcs, data_collator,
        getattr(train_dataset, "column_names", None),  # each function's signature against the columns
        extra_keywords=("environments",) if toolbox is not None and toolbox.factories else ())
    if peft_config is not None and isinstance(model, nn.Module):  # as the loaders and `trl-ext check` do
        check_lora_targets(model, peft_config)
    shared_base = check_shared_base_roles(model, reward_model, value_model, peft_config, args)
    if args.fp16:  # the loss scaler needs float32 gradients (trl_ext.models.dtypes)
        float32_trainable_parameters(model, value_model)
    parent = dict(processing_class=processing_class, model=model, ref_model=ref_model, reward_model=reward_model,
                  train_dataset=train_dataset, value_model=value_model, data_collator=data_collator,
                  eval_dataset=eval_dataset, optimizers=optimizers, callbacks=callbacks, peft_config=peft_config)
    return TrainerInputs(args, parent, reward_list, ptx_dataset, toolbox, shared_base)


def check_shared_base_roles(model, reward_model, value_model, peft_config, args) -> bool:
    """Validate reward/value models that share the policy's base before a trainer is built; True if any does.

    Raises:
        UserInputError: such a model sits on another model than ``model``, ``peft_config`` is given as well (the
            policy must already carry its adapter), or the run uses DeepSpeed or FSDP (not supported with a
            shared base).
    """
    shared = False
    for role, scalar in (("reward_model", reward_model), ("value_model", value_model)):
        if not isinstance(scalar, SharedBaseScalarModel):
            continue
        shared = True
        if scalar.policy is not model:
            raise UserInputError(
                f"{role}: its adapter sits on another model's base than the policy passed as `model`; build it with "
                "trl_ext.models.shared_base.add_scalar_adapter(policy, ...) on that same policy"
            )
    if not shared:
        return False
    if peft_config is not None:
        raise UserInputError(
            "peft_config: with reward/value adapters on the policy's base, the policy already is a peft model; pass "
            "peft_config=None"
        )
    use_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" or bool(
        getattr(args, "deepspeed", None)
    )
    use_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or bool(getattr(args, "fsdp", None))
    if use_deepspeed or use_fsdp:
        raise UserInputError(
            "shared base: reward/value adapters on the policy's base are supported on one device or with DDP, not "
            f"with {'DeepSpeed' if use_deepspeed else 'FSDP'}; load separate reward and value models instead"
        )
    return True
