"""The extensions of :class:`trl_ext.PPOTrainer`, each one object built once from the config after the parent's
``__init__`` (:func:`build_features`; None when the extension is off). The trainer keeps each as an attribute of
the same name and hands them to the parts and steps that use them (docs/ppo.md, "One update, step by step")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .completions_log import CompletionsLog
from .episodes.multi_turn import MultiTurnRollout
from .episodes.turn_rewards import TurnRewards
from .optimize_loop import objective_for_micro_batches
from .objective.critic import Critic, build_critic
from .objective.critic_warmup import CriticWarmup
from .objective.kl_controllers import build_kl_controller
from .objective.objectives import ObjectiveConfig
from .ptx_data import PretrainingMix, PtxConfig
from .memory.chunk import AUTO, ChunkChoice, resolve_auto_rollout_chunk
from .rollout.decode_graphs import DecodeGraphs
from .rollout.dynamic_sampling import DynamicSampling
from .rollout.engine import build_rollout_engine
from .rollout.reward_funcs import RewardFunctionScoring, build_reward_scoring

__all__ = ["Features", "build_features"]


@dataclass
class Features:
    """The run's extensions (None when off)."""

    objective: ObjectiveConfig
    """The loss keys (:mod:`.objective.objectives`; with ``train_micro_batch_size``, ``token_mean`` over the
    mini-batch)."""
    reward_model: Any
    """The reward model as the parent prepared it; None with reward functions only."""
    reward_scoring: RewardFunctionScoring | None
    critic: Critic
    """With or without a value model (never None)."""
    critic_warmup: CriticWarmup | None
    rollout_chunk_choice: ChunkChoice | None
    """``local_rollout_forward_batch_size: auto``'s choice (None when the chunk was given)."""
    rollout_engine: Any
    rollout_engine_choice: Any
    decode_graphs: DecodeGraphs | None
    kl_ctl: Any
    ptx: PretrainingMix | None
    completions_log: CompletionsLog | None
    dynamic_sampling: DynamicSampling | None
    multi_turn: MultiTurnRollout | None
    turn_rewards: TurnRewards | None


def build_features(args, *, processing_class, accelerator, model, reward_model, prompt_length: int, shared_base,
                   reward_list, ptx_dataset, kl_controller, toolbox, fsdp: bool) -> Features:
    """Every extension of one trainer, from the config and what the parent built: ``model`` (the prepared policy and
    value wrapper), ``reward_model`` (the parent's), ``prompt_length`` (the longest train prompt), ``shared_base``
    (policy, reward and value model on one base), ``reward_list`` (:func:`~.rollout.reward_funcs.prepare_reward_funcs`),
    the trainer's ``ptx_dataset``, ``kl_controller`` and ``toolbox`` arguments, ``fsdp`` (an FSDP launch).
    Touches no global RNG (the parent left them where its ``train()`` expects)."""
    objective = objective_for_micro_batches(ObjectiveConfig.from_args(args), args)
    reward_scoring, reward_model = build_reward_scoring(reward_list, reward_model, processing_class, args,
                                                        accelerator)
    critic = build_critic(args, accelerator, multi_turn=toolbox is not None)
    policy_and_value = accelerator.unwrap_model(model)
    chunk_choice = None
    if args.local_rollout_forward_batch_size == AUTO:  # the largest chunk that fits args.max_memory_gib
        chunk_choice = resolve_auto_rollout_chunk(
            args, accelerator, getattr(policy_and_value, "policy", policy_and_value), prompt_length,
            shared=bool(shared_base), value_model=critic.has_value_model, reward_model=reward_model is not None)
    # None: generate; else continuous batching (auto: a rule)
    rollout_engine, engine_choice = build_rollout_engine(args, accelerator, prompt_length)
    multi_turn = None
    if toolbox is not None:
        MultiTurnRollout.check_launch(accelerator, fsdp, args.ds3_gather_for_generation)
        multi_turn = MultiTurnRollout(toolbox, args, processing_class, engine_prompt_length=(
            rollout_engine.plan.prompt_length if rollout_engine is not None else None))
    return Features(
        objective=objective,
        reward_model=reward_model,
        reward_scoring=reward_scoring,
        critic=critic,
        critic_warmup=CriticWarmup.build(args, policy_and_value),  # the first updates train the value model alone
        rollout_chunk_choice=chunk_choice,
        rollout_engine=rollout_engine,
        rollout_engine_choice=engine_choice,
        # rollout_cuda_graphs: generate's decoding steps as CUDA graphs over a static cache
        decode_graphs=DecodeGraphs.build(args, rollout_engine, accelerator),
        kl_ctl=(kl_controller if kl_controller is not None
                else build_kl_controller(args.kl_controller, args.kl_coef, args.kl_target, args.kl_horizon)),
        ptx=(PretrainingMix(ptx_dataset, processing_class, PtxConfig.from_args(args), accelerator)
             if ptx_dataset is not None else None),
        completions_log=(CompletionsLog.from_args(args, processing_class, accelerator)
                         if args.log_completions else None),
        dynamic_sampling=(DynamicSampling.from_args(args, accelerator, processing_class.pad_token_id)
                          if args.dynamic_sampling else None),
        multi_turn=multi_turn,
        turn_rewards=TurnRewards.build(toolbox, accelerator),  # environments' get_turn_reward
    )
