"""The advantage estimators, in one registry (the model: verl's ``register_adv_est``, verl/trainer/ppo/core_algos.py).
Each is registered once by :func:`register_estimator` as a function of one signature,
``fn(batch: EstimatorBatch, settings: EstimatorSettings) -> Estimate``, with what the config's rules and the run's
critic need to know of it (:class:`Estimator`: a value model or not, a group baseline, its default ``kl_in``, a
per-turn form). ``PPOConfig.advantage_estimator``'s choices, its rules, GRPOConfig's mapping and the critic
(:mod:`.critic`) read the registry: adding an estimator touches this module alone. The formulas are the pure
functions of :mod:`.advantages` (per sequence) and :mod:`.turn_credit` (per turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple

import torch

from .action_gae import gae_over_steps
from .advantages import (GRPO_STD_EPS, gae_advantages, grpo_advantages, length_adaptive_lam, returns_to_go,
                         rloo_advantages, sequence_advantages_to_tokens, whiten_over_batch)
from .masked_stats import masked_whiten
from .turn_credit import (group_turn_advantages, loo_turn_advantages, on_tokens, reached_turns,
                          turn_discounted_returns, turn_returns, turn_sums)

__all__ = ["ESTIMATORS", "Estimate", "Estimator", "EstimatorBatch", "EstimatorSettings", "TurnCredit",
           "default_kl_in", "get_estimator", "group_estimators", "register_estimator"]

TurnCredit = Literal["episode", "turn"]


@dataclass(frozen=True)
class EstimatorSettings:
    """The config keys the estimators read (documented in :class:`trl_ext.PPOConfig`), built once per run."""

    gamma: float = 1.0
    lam: float = 0.95
    critic_lam: float | None = None
    length_adaptive_lam_alpha: float | None = None
    grpo_scale_by_std: bool = True
    turn_credit: str = "episode"
    group_size: int = 1

    @classmethod
    def from_args(cls, args) -> EstimatorSettings:
        return cls(gamma=args.gamma, lam=args.lam, critic_lam=args.critic_lam,
                   length_adaptive_lam_alpha=args.length_adaptive_lam_alpha, grpo_scale_by_std=args.grpo_scale_by_std,
                   turn_credit=args.turn_credit, group_size=args.num_samples_per_prompt)


@dataclass
class EstimatorBatch:
    """One update's batch on this process, as the estimators read it; ``(batch, T)`` tensors over the response."""

    rewards: torch.Tensor
    """The per-token rewards of the critic's ``rewards`` step (``rollout.rewards``)."""
    mask: torch.Tensor
    """True on the tokens that count: the policy's response tokens (``~rollout.padding_mask``)."""
    values: torch.Tensor | None = None
    """The value model's values (GAE), 0 outside ``value_mask``."""
    value_mask: torch.Tensor | None = None
    """GAE's steps: ``mask`` and the position after the last token (``~rollout.padding_mask_p1``)."""
    over_steps: bool = False
    """Episodes with tools: GAE over ``value_mask``'s steps only (:mod:`.action_gae`)."""
    turns: torch.Tensor | None = None
    """``turn_credit: turn``: each counted token's turn, 1, 2, ... (:func:`.turn_credit.turn_index`); None: episode."""
    reduce_sum: Callable | None = None
    """Sums a tensor over every process (``accelerator.reduce(t, "sum")``); None: one process."""


class Estimate(NamedTuple):
    """What an estimator returns: ``advantages`` ``(batch, T)`` (0 where not counted), ``returns`` (the value
    targets; critic-free: the advantages) and, for one advantage per sequence, ``sequence_advantages`` ``(batch,)``."""

    advantages: torch.Tensor
    returns: torch.Tensor
    sequence_advantages: torch.Tensor | None = None


EstimatorFn = Callable[[EstimatorBatch, EstimatorSettings], Estimate]


@dataclass(frozen=True)
class Estimator:
    """One registered estimator: its function and what the rules and the critic read of it."""

    name: str
    fn: EstimatorFn
    value_model: bool = False
    """Needs a value model (GAE); every other estimator is critic-free."""
    group: bool = False
    """Its baseline is the other samples of the same prompt: needs ``num_samples_per_prompt >= 2``."""
    kl_in: str = "reward"
    """Where the KL goes when ``kl_in`` is not set."""
    turn_credit: bool = False
    """Has a per-turn form (``turn_credit: turn``)."""
    centres_rewards: bool = False
    """The critic's reward step subtracts the group's mean from the environment's rewards (REINFORCE++-baseline)."""


ESTIMATORS: dict[str, Estimator] = {}
"""The registry, in registration order (the config's choices are listed in it)."""


def register_estimator(name: str, **properties) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator: register ``fn`` as the estimator ``name`` with :class:`Estimator`'s ``properties``; a name is
    registered once (another function under a taken name is an error)."""

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        if name in ESTIMATORS and ESTIMATORS[name].fn is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered ({ESTIMATORS[name].fn.__name__})")
        ESTIMATORS[name] = Estimator(name, fn, **properties)
        return fn

    return decorator


def get_estimator(name: str) -> Estimator:
    """The registered estimator ``name`` (ValueError naming the registered ones otherwise)."""
    if name not in ESTIMATORS:
        raise ValueError(f"advantage_estimator: unknown {name!r}; registered: {', '.join(ESTIMATORS)}")
    return ESTIMATORS[name]


def default_kl_in(kl_in: str | None, advantage_estimator: str) -> str | None:
    """``kl_in`` as set, else the estimator's own (its :attr:`Estimator.kl_in`; None for a name not registered, which
    the config's choices then refuse): the one statement of that default, for :class:`trl_ext.PPOConfig` and
    GRPOConfig's mapping."""
    if kl_in is not None or advantage_estimator not in ESTIMATORS:
        return kl_in
    return ESTIMATORS[advantage_estimator].kl_in


def group_estimators() -> tuple[str, ...]:
    """The estimators with a group baseline (they need ``num_samples_per_prompt >= 2``)."""
    return tuple(name for name, estimator in ESTIMATORS.items() if estimator.group)


# ---------------------------------------------------------------------------------------------------- the estimators


@register_estimator("gae", value_model=True)
def gae(batch: EstimatorBatch, settings: EstimatorSettings) -> Estimate:
    """GAE with the value model (TRL's PPO): advantages at ``lam`` (VAPO's length-adaptive lambda with
    ``length_adaptive_lam_alpha``), whitened over the counted tokens, 0 elsewhere; the value targets at ``critic_lam``
    (VAPO's decoupled GAE; default ``lam``); with tools, over the policy's tokens only."""
    lam = settings.lam
    critic_lam = lam if settings.critic_lam is None else settings.critic_lam
    if settings.length_adaptive_lam_alpha is not None:
        lam = length_adaptive_lam(batch.mask.sum(1), settings.length_adaptive_lam_alpha)

    def run(lam_):
        if batch.over_steps:
            return gae_over_steps(batch.rewards, batch.values, batch.value_mask, settings.gamma, lam_)
        return gae_advantages(batch.rewards, batch.values, settings.gamma, lam_)

    advantages, returns = run(lam)
    if torch.is_tensor(lam) or critic_lam != lam:  # decoupled GAE: the targets at their own lambda
        returns = run(critic_lam)[1]
    advantages = masked_whiten(advantages, batch.mask)
    return Estimate(torch.masked_fill(advantages, ~batch.mask, 0), returns)


def _per_turn(batch: EstimatorBatch, settings: EstimatorSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Each turn's return-to-go from the per-token rewards (``gamma`` per turn) and which turns each episode
    reached, both ``(batch, turns)``."""
    n_turns = max(int(batch.turns.max()), 1)
    rewards = turn_sums(batch.rewards * batch.mask.to(batch.rewards.dtype), batch.turns, n_turns)
    return turn_returns(rewards, settings.gamma), reached_turns(batch.turns, n_turns)


def _turn_estimate(per_turn: torch.Tensor, batch: EstimatorBatch) -> Estimate:
    advantages = on_tokens(per_turn, batch.turns) * batch.mask.to(per_turn.dtype)
    return Estimate(advantages, advantages)


@register_estimator("rloo", group=True, turn_credit=True)
def rloo(batch: EstimatorBatch, settings: EstimatorSettings) -> Estimate:
    """RLOO (:func:`.advantages.rloo_advantages`) on each sequence's reward sum, on every counted token; per turn
    (:func:`.turn_credit.loo_turn_advantages`) on each turn's return-to-go. Not whitened."""
    if batch.turns is not None:
        returns, reached = _per_turn(batch, settings)
        return _turn_estimate(loo_turn_advantages(returns, reached, settings.group_size), batch)
    per_sequence = rloo_advantages(batch.rewards.sum(1), settings.group_size)
    advantages = sequence_advantages_to_tokens(per_sequence, batch.mask)
    return Estimate(advantages, advantages, per_sequence)


@register_estimator("grpo", group=True, kl_in="loss", turn_credit=True)
def grpo(batch: EstimatorBatch, settings: EstimatorSettings) -> Estimate:
    """GRPO / Dr. GRPO (:func:`.advantages.grpo_advantages`) on each sequence's reward sum, on every counted token;
    per turn (:func:`.turn_credit.group_turn_advantages`) on each turn's return-to-go."""
    if batch.turns is not None:
        returns, reached = _per_turn(batch, settings)
        return _turn_estimate(group_turn_advantages(returns, reached, settings.group_size, settings.grpo_scale_by_std,
                                                    GRPO_STD_EPS), batch)
    per_sequence = grpo_advantages(batch.rewards.sum(1), settings.group_size, scale_by_std=settings.grpo_scale_by_std)
    advantages = sequence_advantages_to_tokens(per_sequence, batch.mask)
    return Estimate(advantages, advantages, per_sequence)


@register_estimator("reinforce_pp", turn_credit=True)
def reinforce_pp(batch: EstimatorBatch, settings: EstimatorSettings) -> Estimate:
    """REINFORCE++ (:func:`.advantages.reinforce_pp_advantages`): the per-token returns-to-go, gamma 1 (per turn:
    ``gamma`` once per turn, :func:`.turn_credit.turn_discounted_returns`), whitened over every process's tokens.
    REINFORCE++-baseline is the same on rewards whose environment part the critic centred on its group."""
    if batch.turns is None:
        returns = returns_to_go(batch.rewards, batch.mask)
    else:
        returns = turn_discounted_returns(batch.rewards, batch.mask, batch.turns, settings.gamma)
    advantages = whiten_over_batch(returns, batch.mask, batch.reduce_sum)
    return Estimate(advantages, advantages)


register_estimator("reinforce_pp_baseline", group=True, turn_credit=True, centres_rewards=True)(reinforce_pp)


AdvantageEstimator = Literal[tuple(ESTIMATORS)]  # type: ignore[valid-type]
"""The values of ``PPOConfig.advantage_estimator``: the registered estimators, in registration order."""
