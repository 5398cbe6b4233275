"""The rollout's sampling keys (TRL ``GRPOConfig``'s: ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``,
``generation_kwargs``) and the generation configs the trainer builds from them. How it works:
docs/ppo-internals.md#sampling-keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ...field_rules import MappingArgs, help_from_docstring, mapping_field

__all__ = ["SamplingArgs", "NAMED_KEYS", "OWNED_KEYS", "RolloutSampling", "rollout_generation_kwargs",
           "sample_generation_kwargs", "reshapes_sampling", "generation_kwargs_problem"]

NAMED_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
"""Sampling keys that are `PPOConfig` fields: `generation_kwargs` may not set them (one value per knob)."""

OWNED_KEYS: dict[str, str] = {
    "max_new_tokens": "response_length sets it",
    "max_length": "response_length sets the response's length",
    "do_sample": "the rollout samples; sample generations and evaluation choose their own",
    "num_return_sequences": "num_samples_per_prompt sets the samples per prompt",
    "num_beams": "the rollout samples one sequence per prompt row (no beam search)",
    "eos_token_id": "stop_token / stop_token_id set it",
    "pad_token_id": "the tokenizer's pad token is used",
    "return_dict_in_generate": "the rollout takes its log-probs itself",
    "output_scores": "the rollout takes its log-probs itself",
    "output_logits": "the rollout takes its log-probs itself",
}
"""`GenerationConfig` keys the trainer sets itself: refused in `generation_kwargs` (key -> why)."""


@help_from_docstring
@dataclass
class SamplingArgs(MappingArgs):
    """Config fields of the rollout's sampling, mixed into :class:`trl_ext.PPOConfig` (TRL `GRPOConfig`'s keys,
    same names, defaults and meaning; :mod:`trl_ext.ppo.rollout.sampling`). They shape what is sampled, not the
    log-probs: the rollout's and the loss's log-probs are those of the temperature-scaled full distribution
    (`log_softmax(logits / temperature)`), as in TRL's GRPOTrainer.

    Parameters:
        top_p (`float`, *optional*, defaults to `1.0`):
            Nucleus sampling: sample from the smallest set of tokens whose probability sums to at least `top_p`.
            Must be in (0, 1]; `1.0` = off. The log-probs stay those of the full distribution.
        top_k (`int`, *optional*, defaults to `0`):
            Sample from the `top_k` most probable tokens only; `0` = off (`1` is greedy). The log-probs stay those
            of the full distribution.
        min_p (`float`, *optional*):
            Drop the tokens whose probability is below `min_p` times the most probable token's; in [0, 1]. `None`
            (default) = off. The log-probs stay those of the full distribution.
        repetition_penalty (`float`, *optional*, defaults to `1.0`):
            Divide the logit of every token already in the prompt or the response by it (multiply when negative)
            before sampling: `> 1` discourages repeats, `< 1` encourages them; must be > 0; `1.0` = off. Set
            explicitly, it overrides a penalty in the policy's `generation_config`. The log-probs stay those of the
            unpenalised temperature-scaled distribution.
        generation_kwargs (`dict[str, Any]`, *optional*):
            More `transformers.GenerationConfig` keys for the rollout's sampling (e.g. `{"suppress_tokens": [5]}`,
            `{"cache_implementation": "static"}`). It may not repeat a key of its own (`temperature`, `top_p`,
            `top_k`, `min_p`, `repetition_penalty`) nor set one the trainer owns (`max_new_tokens`, `max_length`,
            `do_sample`, `num_return_sequences`, `num_beams`, `eos_token_id`, `pad_token_id` and the output flags);
            unknown keys are refused. Logits processors it adds shape the sampling only: the log-probs are then
            recomputed by one forward of the policy (`log_softmax(logits / temperature)`).
    """

    # ranges: trl_ext.field_rules.RANGES
    top_p: float = 1.0
    top_k: int = 0
    min_p: Optional[float] = None
    repetition_penalty: float = 1.0
    generation_kwargs: dict[str, Any] | str | None = mapping_field(
        "More transformers GenerationConfig keys for the rollout's sampling (GRPOConfig's key).")


def _sampling_keys(args) -> dict:
    """The sampling keys of `args` as `GenerationConfig` keyword arguments (`min_p` only when set); a config
    without them (the PPO base's own, :class:`~trl_ext.ppo.base.base_config.PPOBaseConfig`) gets TRL's "off" values."""
    kwargs = {"top_k": getattr(args, "top_k", 0), "top_p": getattr(args, "top_p", 1.0),
              "repetition_penalty": getattr(args, "repetition_penalty", 1.0)}
    if getattr(args, "min_p", None) is not None:
        kwargs["min_p"] = args.min_p
    return {**kwargs, **(getattr(args, "generation_kwargs", None) or {})}


def rollout_generation_kwargs(args) -> dict:
    """The rollout's `GenerationConfig` keyword arguments: TRL's PPO rollout (`response_length` new tokens at
    `temperature + 1e-7`, sampling) with the sampling keys of `args` (at their defaults: TRL's config)."""
    return {"max_new_tokens": args.response_length, "temperature": args.temperature + 1e-7, **_sampling_keys(args),
            "do_sample": True}


def sample_generation_kwargs(args) -> dict:
    """The sample generations' (`generate_completions`) keyword arguments: TRL's near-greedy temperature 0.01 with
    the sampling keys of `args`."""
    return {"max_new_tokens": args.response_length, "temperature": 0.01 + 1e-7, **_sampling_keys(args),
            "do_sample": True}


def reshapes_sampling(args) -> bool:
    """Whether any sampling key of `args` is on, i.e. the sampling distribution is not `softmax(logits / T)`."""
    return (getattr(args, "top_k", 0) not in (0, None) or getattr(args, "top_p", 1.0) < 1.0
            or getattr(args, "min_p", None) is not None or getattr(args, "repetition_penalty", 1.0) != 1.0
            or bool(getattr(args, "generation_kwargs", None)))


@dataclass(frozen=True)
class RolloutSampling:
    """The rollout's generation settings, read from the config when ``train()`` starts (the trainer's
    ``init_data_streams``): ``generate``'s keyword arguments and config, and whether a sampling key reshapes the
    distribution (:func:`reshapes_sampling`)."""

    kwargs: dict
    config: Any
    reshapes: bool

    @classmethod
    def from_args(cls, args) -> "RolloutSampling":
        from transformers import GenerationConfig

        kwargs = rollout_generation_kwargs(args)  # TRL's, with the sampling keys
        return cls(kwargs, GenerationConfig(**kwargs), reshapes_sampling(args))


def generation_kwargs_problem(generation_kwargs: dict | None) -> str | None:
    """Why `generation_kwargs` cannot be used (the config rule's message, after `generation_kwargs: `), or None."""
    if not generation_kwargs:
        return None
    from transformers import GenerationConfig

    named = [k for k in generation_kwargs if k in NAMED_KEYS]
    if named:
        return (f"{', '.join(map(repr, named))} {'is a key' if len(named) == 1 else 'are keys'} of its own: set "
                "it as that key (one value per knob), not in generation_kwargs")
    owned = [k for k in generation_kwargs if k in OWNED_KEYS]
    if owned:
        return "; ".join(f"{k!r} is the trainer's ({OWNED_KEYS[k]})" for k in owned) + "; remove it"
    defaults = GenerationConfig()
    unknown = [k for k in generation_kwargs if not hasattr(defaults, k)]
    if unknown:
        return f"{', '.join(map(repr, unknown))}: not a transformers GenerationConfig key"
    try:
        GenerationConfig(**generation_kwargs, do_sample=True).validate(strict=True)
    except (ValueError, TypeError) as err:
        return f"not a valid GenerationConfig: {' '.join(str(err).split())}"
    return None
