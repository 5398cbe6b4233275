"""Every rule about how :class:`trl_ext.PPOConfig`'s settings combine, checked when the config is constructed. How it
works: docs/ppo-internals.md#how-the-settings-combine."""

from __future__ import annotations

import warnings

from ..errors import UserInputError
from ..runtime.engines import DEEPSPEED, FSDP, launched_engine, launched_gradient_clipping, launched_zero3
from .evaluation import evaluation_on
from .objective.estimators import ESTIMATORS, get_estimator, group_estimators
from .memory.chunk import AUTO
from .rollout.sampling import generation_kwargs_problem

__all__ = ["check_eval_inputs", "check_evaluation", "check_launch", "check_combinations", "check_trainer_inputs",
           "check_turn_credit"]


def check_launch(args) -> None:
    """What the launch (DeepSpeed, FSDP) or the installed transformers cannot run."""
    engine = launched_engine()
    if engine == FSDP:
        raise UserInputError(
            "PPO does not run under FSDP: TRL's PPO generates with the policy inside the sharded model without "
            "gathering its FSDP2 shards (RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor); "
            "launch PPO with a DeepSpeed config (recipes/accelerate/zero2.yaml or zero3.yaml) or DDP"
        )
    if args.ptx_mode == "separate" and args.ptx_coef > 0 and engine == DEEPSPEED:
        raise UserInputError(
            "ptx_mode: 'separate' is not supported under DeepSpeed: ZeRO steps every parameter of the policy and "
            "value model together, so the separate ptx step would also move the value model (Adam momentum on "
            "zero gradients); use ptx_mode 'joint'"
        )
    if engine == DEEPSPEED:
        clipping, where = launched_gradient_clipping()
        if where is not None and clipping != float(args.max_grad_norm or 0.0):
            raise UserInputError(f"max_grad_norm: {args.max_grad_norm} but {where} is {clipping} (DeepSpeed's engine "
                                 "clips the gradients); set them equal, or leave gradient_clipping out of the "
                                 "accelerate config (trl-ext then sets it from max_grad_norm)")
    if args.train_micro_batch_size is not None and engine == DEEPSPEED:
        raise UserInputError("train_micro_batch_size: not supported under DeepSpeed (its engine counts the "
                             "accumulation steps); use per_device_train_batch_size and gradient_accumulation_steps")
    if args.rollout_cuda_graphs and launched_zero3():
        raise UserInputError("rollout_cuda_graphs: not supported under DeepSpeed ZeRO-3 (its hooks gather the "
                             "parameters into new memory at every forward, which a CUDA graph cannot replay); use "
                             "ZeRO-2 or turn it off")
    if args.rollout_engine == "continuous_batching":
        from .rollout.engine import MIN_TRANSFORMERS, has_continuous_batching

        if not has_continuous_batching():
            raise UserInputError(f"rollout_engine: 'continuous_batching' needs transformers >= {MIN_TRANSFORMERS} "
                                 "(its continuous-batching engine as trl-ext drives it); upgrade transformers or use "
                                 "'generate'")
        if launched_zero3():
            raise UserInputError(
                "rollout_engine: 'continuous_batching' is not supported under DeepSpeed ZeRO-3 (the engine runs the "
                "model in its own thread, outside ZeRO-3's parameter gathering); use 'generate' or ZeRO-2"
            )


def check_combinations(args) -> None:
    """The combinations of PPO's settings (after each field's own range and choices)."""
    if args.rollout_cuda_graphs and args.rollout_engine == "continuous_batching":
        raise UserInputError("rollout_cuda_graphs: replays generate's decoding steps; the continuous-batching engine "
                             "has its own loop: use rollout_engine 'generate' (or 'auto') with it, or turn it off")
    check_batches(args)
    check_sampling(args)
    check_advantage_estimator(args)
    check_objective(args)


def check_batches(args) -> None:
    """The rollout batch against its splits, the stop token, the episode count, the memory target."""
    local_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if local_batch % args.num_mini_batches:
        raise UserInputError(
            f"num_mini_batches: {args.num_mini_batches} does not divide the rollout batch "
            f"per_device_train_batch_size * gradient_accumulation_steps = {local_batch} (valid: a divisor of it)"
        )
    if args.whiten_rewards and local_batch // args.num_mini_batches < 8:
        raise UserInputError(
            f"whiten_rewards: needs mini-batches of at least 8 samples per process, got "
            f"{local_batch // args.num_mini_batches} (per_device_train_batch_size * gradient_accumulation_steps / "
            "num_mini_batches)"
        )
    if args.stop_token and args.stop_token_id is not None:
        raise UserInputError(f"stop_token: {args.stop_token!r} and stop_token_id {args.stop_token_id} are both set; "
                             "choose one")
    if args.total_episodes is None and args.num_train_epochs <= 0:
        raise UserInputError(
            f"num_train_epochs: {args.num_train_epochs!r} with no total_episodes trains on zero episodes "
            "(valid: a number > 0, or set total_episodes >= 1)"
        )
    if args.local_rollout_forward_batch_size == AUTO and args.max_memory_gib is None and args.use_cpu:
        raise UserInputError(
            "local_rollout_forward_batch_size: 'auto' on CPU (use_cpu: true) needs max_memory_gib, the memory "
            "target in GiB (only on CUDA does it default to the device's free memory)"
        )
    if args.train_micro_batch_size == AUTO and args.max_memory_gib is None and args.use_cpu:
        raise UserInputError("train_micro_batch_size: 'auto' on CPU (use_cpu: true) needs max_memory_gib")


def check_sampling(args) -> None:
    """The rollout's sampling keys (:mod:`trl_ext.ppo.rollout.sampling`; each key's range is in its field): what
    `generation_kwargs` may hold (GenerationConfig keys other than the named sampling keys and those the trainer
    sets, valid together)."""
    problem = generation_kwargs_problem(args.generation_kwargs)
    if problem is not None:
        raise UserInputError(f"generation_kwargs: {problem}")
    if args.repetition_penalty != 1.0 and args.rollout_engine == "continuous_batching":
        raise UserInputError("repetition_penalty: transformers' continuous-batching engine has no repetition "
                             "penalty (it drops the processor); use rollout_engine 'generate' (or 'auto') with it")


def check_advantage_estimator(args) -> None:
    """The estimator's keys and the critic's (``critic_warmup``): combinations that make sense (before any model is
    loaded), each from what the estimator's registration says (:mod:`.objective.estimators`); ``kl_in`` as the
    config resolved it (:func:`~.objective.estimators.default_kl_in`)."""
    name, k = args.advantage_estimator, args.num_samples_per_prompt
    estimator = get_estimator(name)
    local_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps
    if local_batch % k:
        raise UserInputError(
            f"num_samples_per_prompt: {k} does not divide the episodes per update and process, "
            f"per_device_train_batch_size * gradient_accumulation_steps = {local_batch}; use a divisor of it"
        )
    if estimator.group and k < 2:
        raise UserInputError(
            f"num_samples_per_prompt: advantage_estimator {name!r} compares the samples of a prompt and needs "
            f"at least 2, got {k}"
        )
    if estimator.value_model and args.kl_in != "reward":
        raise UserInputError(f"kl_in: 'loss' needs a critic-free advantage_estimator; {name} takes 'reward'")
    if args.turn_credit == "turn" and not estimator.turn_credit:
        with_turns = ", ".join(n for n, e in ESTIMATORS.items() if e.turn_credit)
        raise UserInputError(f"turn_credit: 'turn' is a form of {with_turns}; advantage_estimator {name!r} has none "
                             "(gae credits each token through its value model): set turn_credit to 'episode'")
    if not estimator.value_model and args.whiten_rewards:
        raise UserInputError(
            f"whiten_rewards: applies to advantage_estimator 'gae' only, not {name!r}; set it to false"
        )
    if not estimator.value_model:
        for key, off in (("critic_warmup", 0), ("critic_learning_rate", None), ("critic_lam", None),
                         ("length_adaptive_lam_alpha", None)):
            if getattr(args, key) != off:
                raise UserInputError(f"{key}: {getattr(args, key)!r} sets the value model, and advantage_estimator "
                                     f"{name!r} has none; remove it, or set advantage_estimator to 'gae'")


def check_objective(args) -> None:
    """The objective keys (:mod:`trl_ext.ppo.objective.objectives`): combinations of clips, KL terms and sampling."""
    for name in ("dual_clip", "delta"):
        if getattr(args, name) is not None and args.policy_loss == "cispo":
            raise UserInputError(f"{name}: bounds the clipped surrogate; policy_loss 'cispo' has none (its "
                                 "weight is capped at 1 + cliprange_high); set it to null")
    upper = 1 + (args.cliprange if args.cliprange_high is None else args.cliprange_high)
    if args.delta is not None and not args.delta > upper:
        raise UserInputError(f"delta: must exceed 1 + cliprange_high = {upper} (below it the two-sided clip cuts "
                             f"inside the clip range), got {args.delta!r}")
    if args.use_bias_correction_kl and args.kl_in != "loss":
        raise UserInputError(f"use_bias_correction_kl: corrects the KL term of the loss; kl_in is {args.kl_in!r} "
                             "(set kl_in: loss, or leave use_bias_correction_kl false)")
    if args.mask_truncated_completions and args.stop_token is None and args.stop_token_id is None:
        raise UserInputError("mask_truncated_completions: needs a stop token (stop_token: eos or stop_token_id): "
                             "without one every completion runs to response_length")
    if args.dynamic_sampling and not get_estimator(args.advantage_estimator).group:
        raise UserInputError(
            f"dynamic_sampling: drops groups of equal scores, which needs a group advantage_estimator "
            f"({', '.join(group_estimators())}), not {args.advantage_estimator!r}"
        )


def check_evaluation(args) -> None:
    """The evaluation keys (:mod:`trl_ext.ppo.evaluation`), before HF's own checks (which raise ValueErrors)."""
    strategy = str(getattr(args.eval_strategy, "value", args.eval_strategy)).lower()
    if strategy == "epoch":
        raise UserInputError("eval_strategy: 'epoch' has no meaning in PPO (updates cycle over the prompts without "
                             "HF's epochs); use 'steps' with eval_steps, counted in updates")
    steps = args.eval_steps
    if strategy == "steps" and steps is not None and steps > 1 and steps != int(steps):
        raise UserInputError(f"eval_steps: {steps} is not a whole number of updates (valid: an integer >= 1, or a "
                             "fraction < 1 of the run's updates)")
    if getattr(args, "eval_on_start", False):  # a TrainingArguments field since transformers 4.41
        raise UserInputError("eval_on_start: not supported by PPO; the first evaluation comes after update "
                             "eval_steps (set eval_on_start to false)")


def check_eval_inputs(args, has_eval_data: bool, multi_turn: bool) -> None:
    """Evaluation (`eval_strategy` not `no`) against the run: it needs evaluation prompts and single-turn episodes.
    Called by the trainer (`eval_dataset`, `tools`) and by the recipe loader before any model loads."""
    if not evaluation_on(args):
        return
    if not has_eval_data:
        raise UserInputError("eval_strategy: 'steps' needs evaluation prompts and the run has none; pass "
                             "eval_dataset (a recipe: dataset_test_split or eval_dataset_name) or set eval_strategy "
                             "'no'")
    if multi_turn:
        raise UserInputError("eval_strategy: evaluation of multi-turn episodes (tools, environment_factory) is not "
                             "supported; set eval_strategy 'no'")


def check_turn_credit(args, multi_turn: bool) -> None:
    """``turn_credit: turn`` needs episodes of turns (``tools`` or ``environment_factory``). Called by the trainer and
    by the recipe loader before any model loads."""
    if args.turn_credit == "turn" and not multi_turn:
        raise UserInputError("turn_credit: 'turn' needs episodes of turns (tools or environment_factory) and this run "
                             "has none (each response is one turn); set turn_credit to 'episode'")


def check_trainer_inputs(args, ptx_dataset, kl_controller, eval_dataset=None, multi_turn: bool = False):
    """What :class:`trl_ext.PPOTrainer`'s own arguments add to the settings: ptx data for a ptx coefficient, a
    controller object that is one, evaluation prompts for ``eval_strategy`` (:func:`check_eval_inputs`; ``multi_turn``:
    the run has tools), turns for ``turn_credit: turn`` (:func:`check_turn_credit`). Returns the ptx dataset to use
    (None when ``ptx_coef`` is 0, with a warning)."""
    check_eval_inputs(args, eval_dataset is not None and len(eval_dataset) > 0, multi_turn)
    check_turn_credit(args, multi_turn)
    if args.ptx_coef > 0 and ptx_dataset is None:
        raise UserInputError(
            f"ptx_coef: is {args.ptx_coef} but no ptx_dataset was given; pass ptx_dataset= or set ptx_coef=0"
        )
    if ptx_dataset is not None and args.ptx_coef == 0:
        warnings.warn("ptx_dataset is ignored because ptx_coef is 0; set ptx_coef > 0 to use it", stacklevel=3)
        ptx_dataset = None
    if kl_controller is not None and not (
        hasattr(kl_controller, "value") and callable(getattr(kl_controller, "update", None))
    ):
        raise UserInputError("kl_controller: needs a `value` attribute and an `update(kl, n_steps)` method")
    return ptx_dataset
