"""Step 7 of :class:`trl_ext.PPOTrainer`'s update: the update's metrics (TRL's names and formulas, plus the
extensions'), computed by one part, :class:`UpdateMetrics`, from the update's rollout and statistics; it changes
nothing (the list of steps: docs/ppo.md, "One update, step by step")."""

from __future__ import annotations

import torch

from .objective.objectives import objective_metrics
from .rollout import Rollout, UpdateStats

__all__ = ["UpdateMetrics"]


class UpdateMetrics:
    """The metrics of one update (`docs/metrics.md`), built once from what they read: the accelerator (gathering),
    the EOS token, the objective's keys and the parts that add metrics (the critic always; the others None when
    off). What changes per update comes with the call (:meth:`compute`)."""

    def __init__(self, *, accelerator, eos_token_id: int, objective, critic, grad_clip, step_guard,
                 critic_warmup=None, reward_scoring=None, turn_rewards=None, decode_graphs=None):
        self.accelerator, self.eos_token_id, self.objective = accelerator, eos_token_id, objective
        self.critic, self.grad_clip, self.step_guard = critic, grad_clip, step_guard
        self.critic_warmup, self.reward_scoring = critic_warmup, reward_scoring
        self.turn_rewards, self.decode_graphs = turn_rewards, decode_graphs

    def compute(self, rollout: Rollout, stats: UpdateStats, kl_coef: float, timings: dict, *, episode: int,
                seconds: float, lr: float) -> dict:
        """TRL's metrics of one update (same names and formulas), plus `objective/kl_coef`, `loss/ptx_avg`,
        `time/*` (``timings``) and the extensions'. ``episode``: episodes so far; ``seconds``: since training
        started; ``lr``: the scheduler's last rate."""
        gather = self.accelerator.gather_for_metrics
        padding_mask = rollout.padding_mask
        mean_kl = rollout.kl.sum(1).mean()
        # Mask padding positions, filled with INVALID_LOGPROB, else they'd drag the entropy negative
        mean_entropy = ((-rollout.logprobs) * (~padding_mask).float()).sum(1).mean()
        mean_non_score_reward = (-kl_coef * rollout.kl).sum(1).mean()  # the KL penalty (kl_in "loss": as a reward)
        rlhf_reward = mean_non_score_reward + rollout.scores.mean()
        metrics = {}
        metrics["eps"] = int(episode / seconds)
        metrics["objective/kl"] = gather(mean_kl).mean().item()
        metrics["objective/entropy"] = gather(mean_entropy).mean().item()
        metrics["objective/non_score_reward"] = gather(mean_non_score_reward).mean().item()
        metrics["objective/rlhf_reward"] = gather(rlhf_reward).mean().item()
        metrics["objective/scores"] = gather(rollout.scores.mean()).mean().item()
        metrics["policy/approxkl_avg"] = gather(stats.approxkl).mean().item()
        metrics["policy/clipfrac_avg"] = gather(stats.pg_clipfrac).mean().item()
        metrics["loss/policy_avg"] = gather(stats.pg_loss).mean().item()
        metrics["loss/value_avg"] = gather(stats.vf_loss).mean().item()
        metrics["val/clipfrac_avg"] = gather(stats.vf_clipfrac).mean().item()
        metrics["policy/entropy_avg"] = gather(stats.entropy).mean().item()
        metrics["val/ratio"] = gather(stats.ratio).mean().item()
        ratios = gather(stats.ratio)  # one value (one epoch, minibatch, micro-batch): no spread, 0 (TRL: NaN + warning)
        metrics["val/ratio_var"] = ratios.var().item() if ratios.numel() > 1 else 0.0
        metrics["val/num_eos_tokens"] = (rollout.responses == self.eos_token_id).sum().item()
        metrics["objective/kl_coef"] = kl_coef
        if rollout.scores_clipfrac is not None:
            metrics["objective/scores_clipfrac"] = gather(rollout.scores_clipfrac).mean().item()
        if stats.ptx_losses:
            metrics["loss/ptx_avg"] = gather(torch.stack(stats.ptx_losses).mean()).mean().item()
        metrics.update(objective_metrics(rollout, stats, self.objective, self.accelerator))
        metrics = self.critic.metrics(metrics, rollout, stats)  # critic-free: the value-model metrics replaced
        if self.critic_warmup is not None:  # critic_warmup: critic/warmup, 1 while the policy is held
            metrics.update(self.critic_warmup.metrics())
        if self.reward_scoring is not None:  # reward_funcs: rewards/*, reward, completions/*
            metrics.update(self.reward_scoring.metrics(rollout))
        if rollout.episodes is not None:  # tools: tools/*, episodes/* (trl_ext.ppo.episodes.multi_turn)
            metrics.update(rollout.episodes.metrics(gather))
        if self.turn_rewards is not None:  # environments' per-turn rewards: episodes/turn_reward_mean
            metrics.update(self.turn_rewards.metrics(rollout))
        metrics.update(timings)
        if self.decode_graphs is not None:  # rollout_cuda_graphs: rollout/cuda_graph_replays, eager_decode_steps
            metrics.update(self.decode_graphs.metrics())
        metrics.update(self.grad_clip.metrics())  # policy/grad_norm: with max_grad_norm > 0
        metrics.update(self.step_guard.metrics())  # nonfinite/*: only under `skip` or fp16's loss scaler
        metrics["lr"] = lr
        metrics["episode"] = episode
        return metrics
