"""Per-turn rewards: trl-ext's addition to TRL's environment contract. An environment's optional
``get_turn_reward()`` is called after each round of its tool calls (:mod:`trl_ext.ppo.episodes.multi_turn`); each
float lands on the last token of the turn it scores. The critic decides what to do with them
(:mod:`trl_ext.ppo.objective.critic`: GAE sees each at its token, critic-free estimators their sum at the end).
Logged as ``episodes/turn_reward_mean`` (and ``episodes/turn_reward/<Class>/mean`` with several classes), and with
the final scores as ``episodes/reward_mean``, what an episode earned (the train summary's headline).
"""

from __future__ import annotations

import torch

__all__ = ["TurnRewards", "turn_reward_tensor"]


def turn_reward_tensor(episodes, width: int, like: torch.Tensor) -> torch.Tensor | None:
    """``(batch, width)`` rewards: each episode's per-turn rewards (:attr:`Episode.turn_rewards`) at their positions,
    0 elsewhere, in ``like``'s dtype and device; None when no episode has one."""
    rows, positions, values = [], [], []
    for i, episode in enumerate(episodes):
        for position, reward in episode.turn_rewards:
            rows.append(i)
            positions.append(position)
            values.append(reward)
    if not rows:
        return None
    out = torch.zeros((len(episodes), width), dtype=like.dtype, device=like.device)
    index = (torch.tensor(rows, device=like.device), torch.tensor(positions, device=like.device))
    return out.index_put_(index, torch.tensor(values, dtype=like.dtype, device=like.device), accumulate=True)


class TurnRewards:
    """The run's per-turn rewards (module docstring), built once by the trainer when an environment class defines
    ``get_turn_reward`` (:meth:`build`; None otherwise) and called at ``compute_rewards`` (:meth:`tensor`) and
    ``update_metrics`` (:meth:`metrics`).

    Args:
        toolbox: the run's :class:`~trl_ext.ppo.episodes.toolbox.Toolbox` (its environments of the update say which
            class each episode played).
        gather: gathers a tensor from every process (``accelerator.gather_for_metrics``).
    """

    def __init__(self, toolbox, gather):
        self.toolbox = toolbox
        self.sources = list(toolbox.turn_reward_types)
        self.gather = gather
        self.source_index: torch.Tensor | None = None
        """The update's episodes' environment classes: their index in :attr:`sources` (-1: none of them)."""

    @classmethod
    def build(cls, toolbox, accelerator) -> "TurnRewards | None":
        """The feature for a run with ``toolbox``; None without environments that define ``get_turn_reward``."""
        if toolbox is None or not toolbox.turn_reward_types:
            return None
        return cls(toolbox, accelerator.gather_for_metrics)

    def tensor(self, rollout, like: torch.Tensor) -> torch.Tensor | None:
        """The update's per-turn rewards ``(batch, T)`` at their tokens, in ``like``'s width, dtype and device; None
        when no episode has one."""
        environments = self.toolbox.environments or []
        self.source_index = torch.tensor(
            [self.sources.index(type(e)) if type(e) in self.sources else -1 for e in environments],
            dtype=torch.float32, device=like.device)
        episodes = rollout.episodes.episodes if rollout.episodes is not None else []
        return turn_reward_tensor(episodes, like.shape[1], like)

    def metrics(self, rollout) -> dict:
        """``episodes/turn_reward_mean``, ``episodes/reward_mean`` (the final score plus the per-turn rewards) and,
        with several classes, ``episodes/turn_reward/<Class>/mean``, over the episodes of every process."""
        n = rollout.responses.shape[0]
        sums = (rollout.turn_rewards.sum(1).float() if rollout.turn_rewards is not None
                else torch.zeros(n, device=rollout.responses.device))
        sources = self.source_index if self.source_index is not None and len(self.source_index) == n else \
            torch.full((n,), -1.0, device=sums.device)
        gathered = self.gather(torch.stack([sums, sources.to(sums.device), rollout.scores.float() + sums], 1))
        metrics = {"episodes/turn_reward_mean": gathered[:, 0].mean().item(),
                   "episodes/reward_mean": gathered[:, 2].mean().item()}
        if len(self.sources) > 1:
            for k, source in enumerate(self.sources):
                mine = gathered[gathered[:, 1] == k, 0]
                if mine.numel():
                    metrics[f"episodes/turn_reward/{source.__name__}/mean"] = mine.mean().item()
        return metrics
