"""The metrics of a reward-function run, in TRL GRPO's names (``GRPOTrainer._generate_and_score_completions``). How
it works: docs/internals-recipes.md#reward-metrics."""

from __future__ import annotations

import torch
from ..trl_internals import nanstd  # unbiased, over the non-NaN entries; NaN with fewer than two

__all__ = ["all_equal_groups", "episode_scores", "nanstd", "reward_metrics"]


def episode_scores(scores: torch.Tensor, turn_rewards: torch.Tensor | None) -> torch.Tensor:
    """``(batch,)``: each episode's final score plus its environment's per-turn rewards (``turn_rewards``
    ``(batch, T)``, None without), what an episode earned; the scores alone without per-turn rewards."""
    return scores if turn_rewards is None else scores + turn_rewards.sum(1)


def all_equal_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(batch / k,)`` bool: True for the groups (``k`` consecutive rows) whose scores are all equal, which a group
    baseline turns into zero advantages (``frac_reward_zero_std``; dynamic sampling drops them)."""
    grouped = scores.view(-1, group_size)
    return (grouped == grouped[:, :1]).all(1)


def reward_metrics(scores, sequence_lengths: torch.Tensor, contain_stop: torch.Tensor, k: int, gather,
                   with_workers: bool = False, turn_rewards: torch.Tensor | None = None) -> dict:
    """The metrics above, ``gather`` being ``accelerator.gather_for_metrics`` (every process calls this).

    Args:
        scores: the update's :class:`~trl_ext.rewards.scoring.RewardScores` on this process.
        sequence_lengths: ``(batch,)`` index of each response's last token (the trainer's).
        contain_stop: ``(batch,)`` True where the response has its stop token.
        k: samples per prompt (consecutive rows).
        with_workers: the functions ran in worker processes (log the timeout and error counts).
        turn_rewards: ``(batch, T)`` the environments' per-turn rewards (None without): ``reward``, ``reward_std``
            and ``frac_reward_zero_std`` count them with the final score (:func:`episode_scores`).
    """
    device = sequence_lengths.device
    per_reward = gather(scores.per_reward.to(device))
    counts = gather(torch.tensor([scores.timeouts, scores.errors], device=device).unsqueeze(0)).sum(0)
    metrics = {}
    for i, name in enumerate(scores.names):
        metrics[f"rewards/{name}/mean"] = torch.nanmean(per_reward[:, i]).item()
        metrics[f"rewards/{name}/std"] = nanstd(per_reward[:, i]).item()
        if with_workers:
            metrics[f"rewards/{name}/timeouts"] = int(counts[0, i])
            metrics[f"rewards/{name}/errors"] = int(counts[1, i])
    score = gather(episode_scores(scores.score.float(), turn_rewards))
    unscorable = gather(scores.unscorable)
    scorable = torch.where(unscorable, torch.full_like(score, float("nan")), score)
    metrics["reward"] = torch.nanmean(scorable).item()
    metrics["reward_std"] = nanstd(scorable).item()
    metrics["rewards/unscorable"] = int(unscorable.sum())
    if k > 1:
        metrics["frac_reward_zero_std"] = all_equal_groups(score, k).float().mean().item()
    lengths = gather(sequence_lengths + 1).float()
    metrics["completions/mean_length"] = lengths.mean().item()
    metrics["completions/min_length"] = lengths.min().item()
    metrics["completions/max_length"] = lengths.max().item()
    metrics["completions/clipped_ratio"] = (~gather(contain_stop)).float().mean().item()
    for name, values in scores.logged_metrics.items():  # log_metric(name, value): this process's mean, as TRL
        metrics[name] = sum(values) / len(values)
    return metrics
