"""Containers passed between the steps of :class:`trl_ext.PPOTrainer`'s update."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..objective.losses import PolicyLoss, ValueLoss


@dataclass
class Rollout:
    """One update's batch of episodes on this process; steps fill it in turn. All tensors are ``(batch, ...)``.

    ``generate_rollouts`` sets ``queries``, ``context_length``, ``query_responses``, ``responses``, ``logprobs``;
    ``score_rollouts`` sets ``postprocessed_responses``, ``ref_logprobs``, ``values``, ``scores``,
    ``sequence_lengths``, ``contain_eos_token``, ``padding_mask`` (True after the last response token) and
    ``padding_mask_p1`` (same, one token later, for values); ``compute_rewards`` sets ``kl``, ``turn_rewards`` and
    ``rewards``; ``compute_advantages`` sets ``advantages`` and ``returns``; ``clip_scores`` clips ``scores`` and sets
    ``scores_clipfrac`` when ``reward_clip`` is on. Per-step values (the update's KL coefficient, a mini-batch's
    token normaliser) are not kept here: the steps pass them as arguments.
    """

    queries: torch.Tensor
    context_length: int
    query_responses: torch.Tensor
    responses: torch.Tensor
    logprobs: torch.Tensor
    postprocessed_responses: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    scores: torch.Tensor | None = None
    sequence_lengths: torch.Tensor | None = None
    contain_eos_token: torch.Tensor | None = None
    padding_mask: torch.Tensor | None = None
    padding_mask_p1: torch.Tensor | None = None
    kl: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    scores_clipfrac: torch.Tensor | None = None
    """Fraction of this process's scores clipped by `reward_clip` (set by ``clip_scores``; None when it is off)."""
    estimator_stats: dict = field(default_factory=dict)
    """Critic-free estimators' per-process quantities for the metrics
    (:class:`trl_ext.ppo.objective.critic.CriticFree`)."""
    sampling: dict | None = None
    """`dynamic_sampling`'s metrics of this update (:mod:`trl_ext.ppo.rollout.dynamic_sampling`), reduced over processes."""
    reward_scores: object | None = None
    """With ``reward_funcs``: every reward of every completion (:class:`trl_ext.rewards.scoring.RewardScores`)."""
    episodes: object | None = None
    """With ``tools``: the multi-turn episodes (:class:`trl_ext.ppo.episodes.multi_turn.EpisodeBatch`)."""
    turn_rewards: torch.Tensor | None = None
    """With environments that give per-turn rewards: ``(batch, T)``, each at the last token of the turn it scores
    (set by ``compute_rewards``, :mod:`trl_ext.ppo.episodes.turn_rewards`); None when the update has none."""

    @property
    def observation_mask(self) -> torch.Tensor | None:
        """With ``tools``: True at the observation tokens (tool results; already folded into ``padding_mask`` and
        ``padding_mask_p1`` by ``score_rollouts``); None when no episode called a tool."""
        return None if self.episodes is None else self.episodes.observation_mask


@dataclass
class MicroBatchOutput:
    """What ``compute_micro_batch_loss`` returns: the loss to backpropagate and the terms the stats need."""

    loss: torch.Tensor
    policy: PolicyLoss
    value: ValueLoss
    logits: torch.Tensor
    """Temperature-scaled response logits (for the entropy statistic)."""
    ptx_loss: torch.Tensor | None = None
    kl_loss: torch.Tensor | None = None
    """The KL loss term before its coefficient (``kl_in="loss"`` only)."""
    entropy: torch.Tensor | None = None
    """Per-position entropy computed for the loss (``entropy_coef > 0``); the statistic then reuses it."""
    entropy_loss: torch.Tensor | None = None
    """The aggregated entropy bonus term before its coefficient (``entropy_coef > 0``)."""


@dataclass
class UpdateStats:
    """Per-micro-batch statistics of one update, indexed ``[ppo_epoch, mini_batch, micro_batch]`` as in TRL."""

    shape: tuple[int, int, int]
    device: torch.device
    approxkl: torch.Tensor = field(init=False)
    pg_clipfrac: torch.Tensor = field(init=False)
    pg_loss: torch.Tensor = field(init=False)
    vf_loss: torch.Tensor = field(init=False)
    vf_clipfrac: torch.Tensor = field(init=False)
    entropy: torch.Tensor = field(init=False)
    ratio: torch.Tensor = field(init=False)
    ptx_losses: list = field(default_factory=list)
    """Every ptx LM loss computed in the update (joint: one per micro-batch; separate: one per optimizer step)."""
    kl_losses: list = field(default_factory=list)
    """Every KL loss term of the update (``kl_in="loss"``: one per micro-batch)."""
    objective: dict = field(default_factory=dict)
    """Objective statistics by metric name, one value per micro-batch (:mod:`trl_ext.ppo.objective.objectives`)."""
    optimizer_steps: int = 0
    """Optimizer steps taken (one per mini-batch unless the NaN/inf guard skipped it; ptx steps not counted)."""

    @property
    def stepped(self) -> bool:
        """Whether any of the update's optimizer steps was taken (the LR scheduler steps only then)."""
        return self.optimizer_steps > 0

    def __post_init__(self):
        for name in ("approxkl", "pg_clipfrac", "pg_loss", "vf_loss", "vf_clipfrac", "entropy", "ratio"):
            setattr(self, name, torch.zeros(self.shape, device=self.device))

    @torch.no_grad()
    def record(self, index: tuple[int, int, int], out: MicroBatchOutput) -> None:
        """Store one micro-batch's statistics (TRL's formulas; entropy from the temperature-scaled logits)."""
        if out.entropy is not None:  # computed for the loss with the same formula
            entropy = out.entropy.detach()
        else:
            logits = out.logits
            prob_dist = torch.nn.functional.softmax(logits, dim=-1)
            entropy = torch.logsumexp(logits, dim=-1) - torch.sum(prob_dist * logits, dim=-1)
        self.approxkl[index] = out.policy.approxkl
        self.pg_clipfrac[index] = out.policy.clipfrac
        self.pg_loss[index] = out.policy.loss
        self.vf_loss[index] = out.value.loss
        self.vf_clipfrac[index] = out.value.clipfrac
        self.entropy[index] = entropy.mean()
        self.ratio[index] = out.policy.ratio.mean()
        if out.ptx_loss is not None:
            self.ptx_losses.append(out.ptx_loss.detach())
        if out.kl_loss is not None:
            self.kl_losses.append(out.kl_loss.detach())
        extra = dict(out.policy.stats or {})
        if out.entropy_loss is not None:
            extra["loss/entropy_avg"] = out.entropy_loss
        for name, value in extra.items():
            self.objective.setdefault(name, []).append(value.detach())
