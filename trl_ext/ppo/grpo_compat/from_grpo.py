"""TRL's `GRPOConfig` as a :class:`trl_ext.PPOConfig`: :meth:`trl_ext.PPOConfig.from_grpo_config`. How it works:
docs/ppo-internals.md#a-grpoconfig-as-a-ppoconfig."""

from __future__ import annotations

import dataclasses
import math
import warnings

from ...errors import UserInputError
from ..objective.estimators import default_kl_in
from ..rollout.sampling import NAMED_KEYS

__all__ = ["MAPPED", "NOT_HONOURED", "REFUSED", "RENAMED", "ppo_kwargs_from_grpo", "renamed_kwargs"]

LOSS_TYPES = {  # TRL loss_type -> our keys
    "grpo": {"loss_aggregation": "seq_mean_token_mean"},
    "bnpo": {"loss_aggregation": "token_mean"},
    "dr_grpo": {"loss_aggregation": "seq_mean_token_sum_norm"},
    "dapo": {"loss_aggregation": "global_token_mean"},
    "cispo": {"loss_aggregation": "global_token_mean", "policy_loss": "cispo"},
}

MAPPED: dict[str, str] = {
    "num_generations": "num_samples_per_prompt (with advantage_estimator: grpo)",
    "beta": "kl_coef, with kl_in: loss (k3)",
    "epsilon": "cliprange",
    "epsilon_high": "cliprange_high (cispo: epsilon_high - 1)",
    "delta": "delta",
    "loss_type": "loss_aggregation / policy_loss",
    "importance_sampling_level": "ratio_level",
    "scale_rewards": "grpo_scale_by_std (group: true, none: false)",
    "num_iterations": "num_ppo_epochs",
    "max_completion_length": "response_length (stop_token: eos)",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k (None: 0)",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "generation_kwargs": "generation_kwargs (its temperature/top_p/top_k/min_p/repetition_penalty win, as in GRPO)",
    "cache_implementation": "generation_kwargs['cache_implementation'] (the generate engine's KV cache)",
    "reward_weights": "reward_weights",
    "mask_truncated_completions": "mask_truncated_completions",
    "use_bias_correction_kl": "use_bias_correction_kl",
    "entropy_coef": "entropy_coef",
    "model_init_kwargs": "model_init_kwargs",
    "trust_remote_code": "model_init_kwargs['trust_remote_code']",
    "chat_template_kwargs": "chat_template_kwargs",
    "max_tool_calling_iterations": "max_tool_calling_iterations (the trainer's tools / environment_factory)",
    "ds3_gather_for_generation": "ds3_gather_for_generation",
    "log_completions": "log_completions",
    "num_completions_to_print": "num_completions_to_print",
    "use_transformers_continuous_batching": "rollout_engine: continuous_batching",
    "use_transformers_paged": "rollout_engine: continuous_batching (TRL's deprecated name)",
    "disable_dropout": "always on (TRL's PPO turns dropout off)",
    "steps_per_generation": "must equal gradient_accumulation_steps",
    "generation_batch_size": "per_device_train_batch_size * processes * gradient_accumulation_steps",
    # TrainingArguments fields that count optimizer steps or prompt passes
    "gradient_accumulation_steps": "gradient_accumulation_steps (per update: x per_device_train_batch_size)",
    "max_steps": "total_episodes (updates = max_steps / num_iterations)",
    "num_train_epochs": "num_train_epochs x num_generations",
    "warmup_steps": "warmup_steps / num_iterations",
    "logging_steps": "logging_steps / num_iterations",
    "save_steps": "save_steps / num_iterations",
    "eval_steps": "eval_steps / num_iterations",
}
"""GRPO key -> what it becomes here."""

REFUSED: dict[str, str] = {
    "sync_ref_model": "the reference model stays fixed here (TR-DPO's reference sync is not implemented)",
    "top_entropy_quantile": "every completion token counts in the loss here (no entropy mask)",
    "use_adaptive_entropy": "entropy_coef is fixed here (no adaptive entropy control)",
    "off_policy_mask_threshold": "no off-policy sequence masking here",
    "multi_objective_aggregation": "rewards are summed, then normalised per group here (sum_then_normalize)",
}
"""GRPO keys with no counterpart that change what the run samples or optimises: a non-default value is refused."""

WARNED: dict[str, str] = {
    "router_aux_loss_coef": "no MoE load-balancing loss",
    "cast_lm_head_to_fp32": "the LM head keeps its dtype",
    "num_generations_eval": "evaluation generates one completion per prompt (greedy, or eval_do_sample)",
    "shuffle_dataset": "the prompts are always shuffled",
    "pad_to_multiple_of": "prompts and completions are not padded to a multiple",
    "transformers_continuous_batching_config": "rollout_engine continuous_batching sizes its own cache",
    "log_multimodal": "text only",
    "log_unique_prompts": "the completions log has every row",
    "log_completions_hub_repo": "the completions log goes to wandb and completions.jsonl",
    "ref_model_mixup_alpha": "no reference sync",
    "ref_model_sync_steps": "no reference sync",
    "entropy_coef_min": "no adaptive entropy control",
    "entropy_coef_max": "no adaptive entropy control",
    "entropy_coef_delta": "no adaptive entropy control",
    "entropy_target": "no adaptive entropy control",
    "sapo_temperature_neg": "no sapo loss",
    "sapo_temperature_pos": "no sapo loss",
    "vespo_k_pos": "no vespo loss",
    "vespo_lambda_pos": "no vespo loss",
    "vespo_k_neg": "no vespo loss",
    "vespo_lambda_neg": "no vespo loss",
}
"""GRPO keys with no counterpart that do not change what is optimised: a non-default value is named in the
warning. The vLLM keys (``use_vllm``, ``vllm_*``) are warned the same way: generation runs with transformers here."""

RENAMED: dict[str, tuple[str, ...]] = {
    "num_generations": ("num_samples_per_prompt",),
    "num_iterations": ("num_ppo_epochs",),
    "beta": ("kl_coef",),
    "epsilon": ("cliprange",),
    "epsilon_high": ("cliprange_high",),
    "loss_type": ("loss_aggregation", "policy_loss"),
    "importance_sampling_level": ("ratio_level",),
    "scale_rewards": ("grpo_scale_by_std",),
    "max_completion_length": ("response_length",),
}
"""GRPO keys that PPOConfig names otherwise -> the PPOConfig keys they set (:func:`renamed_kwargs`): what a PPO
recipe accepts under GRPO's name (``trl_ext.recipe_loader.grpo_keys``)."""


def renamed_kwargs(values: dict) -> dict:
    """The PPOConfig keywords of ``values``, GRPO keys of :data:`RENAMED` (any of them) -> their values; the one
    mapping of those keys, for :meth:`trl_ext.PPOConfig.from_grpo_config` and PPO recipes alike.

    Raises:
        UserInputError: a value with no counterpart (a loss type or reward scaling trl-ext lacks, no completion length,
            a cispo cap below 1), naming the GRPO key.
    """
    get = values.get
    plain = ("num_generations", "num_iterations", "beta", "epsilon", "importance_sampling_level")
    kwargs = {RENAMED[name][0]: values[name] for name in plain if name in values}
    if "scale_rewards" in values:
        scale = {True: "group", False: "none"}.get(get("scale_rewards"), get("scale_rewards"))
        if scale not in ("group", "none"):
            raise UserInputError(f"scale_rewards: {scale!r} has no counterpart in trl-ext (group std: 'group', "
                                 "none: 'none'); the batch std of PPO Lite is not implemented")
        kwargs["grpo_scale_by_std"] = scale == "group"
    loss_type = get("loss_type")
    if "loss_type" in values:
        if loss_type not in LOSS_TYPES:
            raise UserInputError(f"loss_type: {loss_type!r} has no counterpart in trl-ext; use one of "
                                 f"{', '.join(LOSS_TYPES)}")
        kwargs.update(LOSS_TYPES[loss_type])
    if loss_type == "cispo":  # TRL caps the weight at epsilon_high (default: epsilon); ours at 1 + cliprange_high
        cap = get("epsilon") if get("epsilon_high") is None else get("epsilon_high")
        if cap is None or cap < 1:
            raise UserInputError(f"epsilon_high: loss_type 'cispo' caps the importance weight at epsilon_high = {cap} "
                                 "(< 1 weakens every token); set epsilon_high (ScaleRL uses 5.0)")
        kwargs["cliprange_high"] = cap - 1
    elif "epsilon_high" in values:
        kwargs["cliprange_high"] = get("epsilon_high")
    if "max_completion_length" in values:
        if get("max_completion_length") is None:
            raise UserInputError("max_completion_length: None (up to the model's length) has no counterpart; trl-ext "
                                 "generates response_length tokens at most: set max_completion_length")
        kwargs.update(response_length=get("max_completion_length"), stop_token="eos")
    return kwargs


NOT_HONOURED_PREFIXES = ("vllm_",)
NOT_HONOURED: frozenset[str] = frozenset(REFUSED) | frozenset(WARNED) | {"use_vllm"}


def not_honoured(name: str) -> bool:
    """Whether GRPO key `name` is one trl-ext has no counterpart for (refused or warned when not at its default)."""
    return name in NOT_HONOURED or name.startswith(NOT_HONOURED_PREFIXES)


_NEUTRAL = {"pad_to_multiple_of": ("auto", None), "scale_rewards": ("group", True)}
"""Values that mean "off" besides the field's default (post-init forms, TRL versions' defaults)."""


def _default(cls, name):
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


def _is_set(grpo, name) -> bool:
    value = getattr(grpo, name, None)
    return not (value == _default(type(grpo), name) or value in _NEUTRAL.get(name, ()))


def _unhonoured(grpo) -> tuple[list[str], list[str]]:
    """(refused, warned): `name=value (why)` of the keys without a counterpart that are not at their default."""
    refused, warned = [], []
    for f in dataclasses.fields(type(grpo)):
        name = f.name
        if not not_honoured(name) or not _is_set(grpo, name):
            continue
        shown = f"{name}={getattr(grpo, name)!r}"
        if name in REFUSED:
            refused.append(f"{shown} ({REFUSED[name]})")
        else:
            why = WARNED.get(name, "generation runs with transformers here (no vLLM)")
            warned.append(f"{shown} ({why})")
    return refused, warned


def _per_update(value, iterations: int):
    """A step count in optimizer steps -> in updates (`iterations` optimizer steps each); ratios (< 1) unchanged."""
    if value is None or value < 1 or iterations == 1:
        return value
    return math.ceil(value / iterations)


def _batch_kwargs(grpo) -> dict:
    """Batch sizes, passes and run length (module docstring)."""
    per_device, accumulation = grpo.per_device_train_batch_size, grpo.gradient_accumulation_steps
    steps = getattr(grpo, "steps_per_generation", None) or accumulation
    if steps != accumulation:
        raise UserInputError(
            f"steps_per_generation: {steps} (or generation_batch_size {getattr(grpo, 'generation_batch_size', None)})"
            f" with gradient_accumulation_steps {accumulation}: one PPO update takes one optimizer step per pass over "
            "its completions; set steps_per_generation to gradient_accumulation_steps (and generation_batch_size to "
            "None) for the same completions per optimizer step"
        )
    k, iterations = grpo.num_generations, getattr(grpo, "num_iterations", 1)
    if (per_device * accumulation) % k:
        raise UserInputError(
            f"num_generations: {k} does not divide the completions each process generates per generation, "
            f"per_device_train_batch_size * gradient_accumulation_steps = {per_device * accumulation}; trl-ext keeps "
            "the completions of a prompt on one process"
        )
    kwargs = {"per_device_train_batch_size": per_device, "gradient_accumulation_steps": accumulation,
              "num_mini_batches": 1, **renamed_kwargs({"num_generations": k, "num_iterations": iterations})}
    if grpo.max_steps is not None and grpo.max_steps > 0:
        updates = math.ceil(grpo.max_steps / iterations)
        kwargs["total_episodes"] = updates * per_device * accumulation * grpo.world_size
    else:
        kwargs["num_train_epochs"] = grpo.num_train_epochs * k
    for name in ("warmup_steps", "logging_steps", "save_steps", "eval_steps"):
        kwargs[name] = _per_update(getattr(grpo, name, None), iterations)
    return kwargs


def _objective_kwargs(grpo) -> dict:
    """Loss, clipping, KL and advantage keys."""
    values = {"beta": grpo.beta, "epsilon": grpo.epsilon, "epsilon_high": getattr(grpo, "epsilon_high", None),
              "loss_type": getattr(grpo, "loss_type", "dapo"), "scale_rewards": getattr(grpo, "scale_rewards", "group"),
              "importance_sampling_level": getattr(grpo, "importance_sampling_level", "token")}
    return {"advantage_estimator": "grpo", "kl_in": "loss", **renamed_kwargs(values),
            "delta": getattr(grpo, "delta", None),
            "use_bias_correction_kl": getattr(grpo, "use_bias_correction_kl", False),
            "entropy_coef": getattr(grpo, "entropy_coef", 0.0),
            "mask_truncated_completions": getattr(grpo, "mask_truncated_completions", False)}


def _other_kwargs(grpo) -> dict:
    """Sampling, reward, model-loading and logging keys."""
    init_kwargs = dict(getattr(grpo, "model_init_kwargs", None) or {})
    if getattr(grpo, "trust_remote_code", False):
        init_kwargs.setdefault("trust_remote_code", True)
    kwargs = {**renamed_kwargs({"max_completion_length": grpo.max_completion_length}), "temperature": grpo.temperature,
              "num_sample_generations": 0, "model_init_kwargs": init_kwargs or None,
              "chat_template_kwargs": getattr(grpo, "chat_template_kwargs", None),
              "reward_weights": getattr(grpo, "reward_weights", None),
              "log_completions": getattr(grpo, "log_completions", False),
              "num_completions_to_print": getattr(grpo, "num_completions_to_print", None),
              "ds3_gather_for_generation": getattr(grpo, "ds3_gather_for_generation", True),
              "max_tool_calling_iterations": getattr(grpo, "max_tool_calling_iterations", None)}
    if getattr(grpo, "use_transformers_continuous_batching", False) or getattr(grpo, "use_transformers_paged", False):
        kwargs["rollout_engine"] = "continuous_batching"
    kwargs.update(_sampling_kwargs(grpo))
    return kwargs


def _sampling_kwargs(grpo) -> dict:
    """The sampling keys. GRPO lets `generation_kwargs` override the named keys: those move to their keys here
    (`PPOConfig` takes one value per knob); `cache_implementation` goes into `generation_kwargs`."""
    extra = dict(getattr(grpo, "generation_kwargs", None) or {})
    top_k = getattr(grpo, "top_k", 0)
    kwargs = {"top_p": getattr(grpo, "top_p", 1.0), "top_k": 0 if top_k is None else top_k,
              "min_p": getattr(grpo, "min_p", None), "repetition_penalty": getattr(grpo, "repetition_penalty", 1.0)}
    for name in NAMED_KEYS:
        if name in extra:
            kwargs[name] = extra.pop(name)
    cache = getattr(grpo, "cache_implementation", None)
    if cache is not None:
        extra.setdefault("cache_implementation", cache)
    kwargs["generation_kwargs"] = extra or None
    return kwargs


def _training_arguments(grpo) -> dict:
    """Every init field of transformers' TrainingArguments not mapped nor warned about, as `grpo` holds it."""
    from transformers import TrainingArguments

    return {f.name: getattr(grpo, f.name) for f in dataclasses.fields(TrainingArguments)
            if f.init and f.name not in MAPPED and not not_honoured(f.name) and hasattr(grpo, f.name)}


def ppo_kwargs_from_grpo(grpo, overrides: dict | None = None) -> dict:
    """`PPOConfig` keyword arguments for TRL `GRPOConfig` `grpo` (module docstring), `overrides` winning.

    Raises:
        UserInputError: a key set to a value with no counterpart that changes the run (all of them, one line), or a
            mapped key's value with none (a loss type or reward scaling trl-ext lacks, several optimizer steps per
            generation).
    """
    refused, warned = _unhonoured(grpo)
    if refused:
        raise UserInputError("GRPOConfig: no counterpart in trl-ext's PPOTrainer for " + "; ".join(refused)
                             + "; set them to their defaults to run with trl-ext")
    kwargs = {**_training_arguments(grpo), **_batch_kwargs(grpo), **_objective_kwargs(grpo), **_other_kwargs(grpo)}
    if warned:
        warnings.warn("GRPOConfig: not honoured by trl-ext's PPOTrainer, ignored: " + "; ".join(warned),
                      UserWarning, stacklevel=3)
    overrides = dict(overrides or {})
    if "advantage_estimator" in overrides and "kl_in" not in overrides:
        kwargs["kl_in"] = None  # the estimator's own default (its registration: trl_ext.ppo.objective.estimators)
    kwargs.update(overrides)
    kl_in = default_kl_in(kwargs["kl_in"], kwargs["advantage_estimator"])  # as the config will resolve it
    if kl_in != "loss" and "use_bias_correction_kl" not in overrides:
        kwargs["use_bias_correction_kl"] = False  # it corrects a KL term of the loss, which the run then lacks
    return kwargs
