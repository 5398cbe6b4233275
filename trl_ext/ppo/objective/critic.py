"""The run's critic, chosen once from the config by :func:`build_critic`: :class:`ValueCritic` (a value model) or
:class:`CriticFree` (RLOO, GRPO, REINFORCE++), both a :class:`Critic`. Each builds the update's per-token reward from
explicit inputs (scores, KL, per-turn rewards, the update's ``kl_coef``) and its advantages from that reward with the
run's estimator (:mod:`.estimators`, the registry); the trainer's ``compute_rewards`` and ``compute_advantages``
delegate here. Also: the value model's stand-in when there is none.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from ...errors import UserInputError
from ...models.scalar_heads import scalar_model_outputs
from ...rewards.metrics import all_equal_groups, episode_scores
from .advantages import group_mean_baseline, last_counted, token_rewards
from .critic_health import critic_health, credit_gain
from .estimators import EstimatorBatch, EstimatorSettings, get_estimator
from .losses import ValueLoss, value_loss
from .masked_stats import masked_mean, masked_whiten
from .turn_credit import centred_turn_rewards, turn_index

__all__ = ["Critic", "CriticFree", "NoValueModel", "ValueCritic", "build_critic", "check_value_model",
           "critic_free_metrics"]


class _NoBackbone(nn.Module):
    def forward(self, **kwargs):
        return SimpleNamespace(hidden_states=[None])


class NoValueModel(nn.Module):
    """The value model of a critic-free run: no parameters; the wrapper's value forward returns `None` at no cost."""

    base_model_prefix = "backbone"

    def __init__(self):
        super().__init__()
        self.backbone = _NoBackbone()

    def score(self, hidden_states):
        return None


def check_value_model(args, value_model):
    """The value model the parent trainer gets: `value_model` for `gae`, a :class:`NoValueModel` when critic-free.

    Raises:
        UserInputError: a value model with a critic-free estimator (it would never train), or none with `gae`.
    """
    if not args.critic_free:
        if value_model is None:
            raise UserInputError(
                "value_model: None, but advantage_estimator 'gae' needs a value model; pass one or choose a "
                "critic-free advantage_estimator (rloo, grpo, reinforce_pp, reinforce_pp_baseline)"
            )
        return value_model
    if value_model is not None:
        raise UserInputError(
            f"value_model: advantage_estimator {args.advantage_estimator!r} uses no value model; pass value_model=None "
            "(recipes: drop the value_* keys)"
        )
    return NoValueModel()


def _sum_over_processes(accelerator):
    if accelerator is None or accelerator.num_processes == 1:
        return None
    return lambda tensor: accelerator.reduce(tensor, reduction="sum")


@runtime_checkable
class Critic(Protocol):
    """What the trainer asks of its critic, with a value model or without (:func:`build_critic`)."""

    has_value_model: bool
    """Whether the run loads, trains and saves a value model (a critic-free one holds :class:`NoValueModel`)."""

    def values(self, value_model, query_response: torch.Tensor, pad_token_id: int,
               context_length: int) -> torch.Tensor:
        """Per-response-token values ``(batch, response_length)``."""

    def rewards(self, rollout, kl_coef: float) -> torch.Tensor:
        """The update's per-token rewards ``(batch, T)`` at this update's ``kl_coef``."""

    def advantages(self, rollout) -> None:
        """Set ``rollout.advantages`` and ``rollout.returns`` from ``rollout.rewards``."""

    def value_loss(self, vpred_temp: torch.Tensor, rollout, micro_batch_inds, device) -> ValueLoss:
        """One micro-batch's value-loss terms (zeros without a value model)."""

    def metrics(self, metrics: dict, rollout, stats) -> dict:
        """``metrics`` with the critic's added (or TRL's value-model metrics replaced): a new dict."""


MAX_HEALTH_TURNS = 16


def build_critic(args, accelerator, multi_turn: bool = False) -> Critic:
    """The run's critic, built once from its config: :class:`ValueCritic` for an estimator with a value model
    (``gae``), else :class:`CriticFree`."""
    if not get_estimator(args.advantage_estimator).value_model:
        return CriticFree(args, accelerator)
    turns = None
    if multi_turn:  # the health per turn: every round of tool calls and the answer, the first MAX_HEALTH_TURNS
        rounds = args.max_tool_calling_iterations
        turns = MAX_HEALTH_TURNS if rounds is None else min(rounds + 1, MAX_HEALTH_TURNS)
    return ValueCritic(args, accelerator, turns=turns)


class ValueCritic:
    """An estimator with a value model (GAE: TRL's PPO), with the value model's own lambda (``critic_lam``), VAPO's
    length-adaptive lambda for the policy, and the critic's health in the metrics."""

    has_value_model = True

    def __init__(self, args, accelerator=None, turns: int | None = None):
        self.estimator, self.settings = get_estimator(args.advantage_estimator), EstimatorSettings.from_args(args)
        self.whiten_rewards = args.whiten_rewards
        self.cliprange_value, self.value_clip = args.cliprange_value, args.value_clip
        self.turns = turns  # a multi-turn run: the most turns of an episode (the health metrics per turn)
        self.reduce_sum = _sum_over_processes(accelerator)

    @staticmethod
    def values(value_model, query_response: torch.Tensor, pad_token_id: int, context_length: int) -> torch.Tensor:
        """Per-response-token values `(batch, response_length)` from the value model's head (plain or PEFT)."""
        full_value, _, _ = scalar_model_outputs(value_model, query_response, pad_token_id, context_length)
        return full_value[:, context_length - 1 : -1].squeeze(-1)

    def rewards(self, rollout, kl_coef: float) -> torch.Tensor:
        """TRL's per-token reward: ``-kl_coef * KL_t``, the score one past the last response token (where GAE
        bootstraps; on the last token when the response fills the width), each per-turn reward on its turn's last
        token; then ``whiten_rewards``."""
        lengths_p1 = rollout.sequence_lengths + 1
        score_index = torch.where(lengths_p1 < rollout.kl.size(1), lengths_p1, rollout.sequence_lengths)
        rewards = token_rewards(rollout.kl, kl_coef, rollout.scores, score_index, rollout.turn_rewards)
        if self.whiten_rewards:
            rewards = masked_whiten(rewards, mask=~rollout.padding_mask_p1, shift_mean=False)
            rewards = torch.masked_fill(rewards, rollout.padding_mask_p1, 0)
        return rewards

    def advantages(self, rollout) -> None:
        """`rollout.advantages` and `rollout.returns`, the value targets, from the estimator (GAE: at `lam`,
        whitened over the response tokens, 0 on padding; the targets at `critic_lam`; with tools over the policy's
        tokens only, :mod:`trl_ext.ppo.objective.action_gae`)."""
        batch = EstimatorBatch(rollout.rewards, ~rollout.padding_mask, values=rollout.values,
                               value_mask=~rollout.padding_mask_p1, over_steps=rollout.observation_mask is not None,
                               reduce_sum=self.reduce_sum)
        estimate = self.estimator.fn(batch, self.settings)
        rollout.advantages, rollout.returns = estimate.advantages, estimate.returns

    def value_loss(self, vpred_temp: torch.Tensor, rollout, micro_batch_inds, device) -> ValueLoss:
        """The value loss of one micro-batch (`value_clip` mode, `cliprange_value`) from the value head's output
        `vpred_temp` `(micro_batch, sequence, 1)` over the whole query+response."""
        padding_mask_p1 = rollout.padding_mask_p1[micro_batch_inds]
        context_length = rollout.context_length
        vpred = torch.masked_fill(vpred_temp[:, context_length - 1 : -1].squeeze(-1), padding_mask_p1, 0)
        return value_loss(vpred, rollout.values[micro_batch_inds], rollout.returns[micro_batch_inds],
                          ~padding_mask_p1, self.cliprange_value, self.value_clip)

    def metrics(self, metrics: dict, rollout, stats) -> dict:
        """TRL's value-model metrics, plus the critic's health (:func:`~.critic_health.critic_health`) and what the
        value model adds to per-turn credit (:func:`~.critic_health.credit_gain`)."""
        return {**metrics, **critic_health(rollout, self.reduce_sum, self.turns),
                **credit_gain(rollout, self.settings.gamma, self.settings.group_size, self.reduce_sum, self.turns)}


class CriticFree:
    """A critic-free estimator (every registered one without a value model) in one trainer, built once from its
    config: no value model is trained, saved, loaded or budgeted; :meth:`values` are zeros (no forward) and
    :meth:`value_loss` zero; :meth:`metrics` are :func:`critic_free_metrics`.

    Args:
        args: the trainer's config (``advantage_estimator``, ``num_samples_per_prompt``, ``kl_in``,
            ``grpo_scale_by_std``, ``turn_credit``, ``gamma``).
        accelerator: REINFORCE++ whitens over every process's tokens; metrics are means over processes.
    """

    has_value_model = False

    def __init__(self, args, accelerator):
        self.estimator, self.settings = get_estimator(args.advantage_estimator), EstimatorSettings.from_args(args)
        self.group_size, self.kl_in_reward = args.num_samples_per_prompt, args.kl_in == "reward"
        self.per_turn = self.settings.turn_credit == "turn"
        self.accelerator = accelerator

    @staticmethod
    def values(value_model, query_response: torch.Tensor, pad_token_id: int, context_length: int) -> torch.Tensor:
        """Zeros `(batch, response_length)`: no value forward."""
        return torch.zeros(query_response[:, context_length:].shape, device=query_response.device)

    def rewards(self, rollout, kl_coef: float) -> torch.Tensor:
        """The estimators' per-token reward: ``-kl_coef * KL_t`` on the counted tokens (no KL with
        ``kl_in="loss"``), and the environment's rewards. ``turn_credit: episode``: on the last counted token
        (:func:`last_counted`: with tools the last token of the last turn) the score plus the episode's per-turn
        rewards (the estimators score sequences), minus its group's mean first for REINFORCE++-baseline.
        ``turn``: the score there and each per-turn reward on its turn's last token; REINFORCE++-baseline's
        centred per turn (:func:`~.turn_credit.centred_turn_rewards`)."""
        mask = ~rollout.padding_mask
        last = last_counted(mask)
        kl_coef = kl_coef if self.kl_in_reward else 0.0
        if not self.per_turn:
            scores = episode_scores(rollout.scores, rollout.turn_rewards)
            if self.estimator.centres_rewards:
                scores = group_mean_baseline(scores, self.group_size)
            return token_rewards(rollout.kl, kl_coef, scores, last, mask=mask)
        if not self.estimator.centres_rewards:
            return token_rewards(rollout.kl, kl_coef, rollout.scores, last, rollout.turn_rewards, mask=mask)
        environment = token_rewards(torch.zeros_like(rollout.kl), 0.0, rollout.scores, last, rollout.turn_rewards)
        centred = centred_turn_rewards(environment, turn_index(mask), self.settings.gamma, self.group_size)
        return token_rewards(rollout.kl, kl_coef, torch.zeros_like(rollout.scores), last, centred, mask=mask)

    def advantages(self, rollout) -> None:
        """`rollout.advantages` `(batch, T)` (0 on padding) from `rollout.rewards` by the estimator
        (:mod:`.estimators`; ``turn_credit: turn``: per turn); `rollout.returns` is the advantages (no value
        target); one advantage per sequence (`rloo`/`grpo` per episode) goes to `estimator_stats`."""
        mask = ~rollout.padding_mask
        batch = EstimatorBatch(rollout.rewards, mask, turns=turn_index(mask) if self.per_turn else None,
                               reduce_sum=_sum_over_processes(self.accelerator))
        estimate = self.estimator.fn(batch, self.settings)
        if estimate.sequence_advantages is not None:
            rollout.estimator_stats["sequence_advantages"] = estimate.sequence_advantages
        rollout.advantages, rollout.returns = estimate.advantages, estimate.returns

    @staticmethod
    def value_loss(vpred_temp, rollout, micro_batch_inds, device) -> ValueLoss:
        """The value-loss terms of a critic-free micro-batch: zeros on `device` (the loss is the policy's alone)."""
        zero = torch.zeros((), device=device)
        return ValueLoss(zero, zero)

    def metrics(self, metrics: dict, rollout, stats) -> dict:
        """`metrics` with the value-model metrics replaced by the critic-free ones (:func:`critic_free_metrics`)."""
        return critic_free_metrics(metrics, rollout, stats, self.group_size, self.accelerator.gather_for_metrics)


def critic_free_metrics(metrics: dict, rollout, stats, k: int, gather) -> dict:
    """A copy of `metrics` with the value-model metrics replaced by the critic-free ones (means over processes):

    * `objective/group_scores_std`: mean over groups of the std of the scores within a group (k > 1), a score
      being the final one plus the episode's per-turn rewards (:func:`~trl_ext.rewards.metrics.episode_scores`);
    * `objective/frac_groups_equal_scores`: fraction of groups whose scores are all equal (their episode-level
      group advantage is 0: a wasted rollout; k > 1);
    * `objective/advantages_abs`: mean |advantage| over the response tokens (`rloo`/`grpo` per episode: per
      sequence);
    * `loss/kl_avg`: the k3 KL loss term before `kl_coef` (`kl_in="loss"`);
    * `policy/ratio_avg`, `policy/ratio_var`, `objective/num_eos_tokens`: TRL's `val/ratio`, `val/ratio_var`,
      `val/num_eos_tokens` renamed, so that a critic-free run logs no `val/*` key.
    """
    metrics = dict(metrics)
    for key in ("loss/value_avg", "val/clipfrac_avg"):
        metrics.pop(key, None)
    metrics["policy/ratio_avg"] = metrics.pop("val/ratio")
    metrics["policy/ratio_var"] = metrics.pop("val/ratio_var")
    metrics["objective/num_eos_tokens"] = metrics.pop("val/num_eos_tokens")
    if k > 1:  # an episode's per-turn rewards count with its final score
        scores = episode_scores(rollout.scores, rollout.turn_rewards)
        grouped = scores.view(-1, k)
        metrics["objective/group_scores_std"] = gather(grouped.std(1).mean()).mean().item()
        all_equal = all_equal_groups(scores, k).float().mean()
        metrics["objective/frac_groups_equal_scores"] = gather(all_equal).mean().item()
    if "sequence_advantages" in rollout.estimator_stats:
        abs_advantages = rollout.estimator_stats["sequence_advantages"].abs().mean()
    else:
        abs_advantages = masked_mean(rollout.advantages.abs(), ~rollout.padding_mask)
    metrics["objective/advantages_abs"] = gather(abs_advantages).mean().item()
    if stats.kl_losses:
        metrics["loss/kl_avg"] = gather(torch.stack(stats.kl_losses).mean()).mean().item()
    return metrics
