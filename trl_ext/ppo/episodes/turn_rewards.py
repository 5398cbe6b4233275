"""Per-turn rewards of environments in :class:`trl_ext.PPOTrainer`: trl-ext's addition to TRL's environment contract.

An environment may define ``get_turn_reward()`` (sync or ``async def``) besides TRL's ``reset`` and ``get_reward``.
The turn loop (:mod:`trl_ext.ppo.episodes.multi_turn`) calls it once after each round of the episode's tool calls (all
of a turn's calls ran) and keeps what it returns, a float or None (no reward for that turn), with the position of
that turn's last token: the turn whose tool calls produced it. Turns whose calls never ran (the last turn when
``max_tool_calling_iterations`` rounds ran out) and the final answer get none; ``get_reward()`` scores the end as
before.

:class:`TurnRewards` puts them into the update's rewards at ``compute_rewards`` (step 4 of the trainer):

* GAE with a value model: a per-token reward on that token, added like the KL penalty and the final score, so GAE's
  deltas and returns see it at the step it rewards (``r_t`` of :mod:`trl_ext.ppo.objective.action_gae`).
* Critic-free estimators (RLOO, GRPO, REINFORCE++): sequence-level; the episode's sum is added to the sequence's score
  before the estimator (:class:`trl_ext.ppo.objective.critic.CriticFree`).

``objective/scores`` keeps its meaning (the final rewards); the per-turn rewards are logged as
``episodes/turn_reward_mean``: the sum of an episode's per-turn rewards, averaged over the update's episodes (0 for an
episode without any), and, with several environment classes that define the method,
``episodes/turn_reward/<Class>/mean`` over that class's episodes. A run whose environments have no
``get_turn_reward`` builds no :class:`TurnRewards` and computes exactly what it computes under TRL's contract; one
whose turn rewards are all None adds nothing to the rewards either.
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
    ``get_turn_reward`` (:meth:`build`; None otherwise) and called at ``compute_rewards`` (:meth:`add`) and
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

    def add(self, rollout, rewards: torch.Tensor) -> torch.Tensor:
        """``rewards`` ``(batch, T)`` with the episodes' per-turn rewards added at their tokens; sets
        ``rollout.turn_rewards`` (None, and ``rewards`` returned as it is, when the update has none)."""
        environments = self.toolbox.environments or []
        self.source_index = torch.tensor(
            [self.sources.index(type(e)) if type(e) in self.sources else -1 for e in environments],
            dtype=torch.float32, device=rewards.device)
        episodes = rollout.episodes.episodes if rollout.episodes is not None else []
        rollout.turn_rewards = turn_reward_tensor(episodes, rewards.shape[1], rewards)
        return rewards if rollout.turn_rewards is None else rewards + rollout.turn_rewards

    def metrics(self, rollout) -> dict:
        """``episodes/turn_reward_mean`` and, with several classes, ``episodes/turn_reward/<Class>/mean``, over the
        episodes of every process."""
        n = rollout.responses.shape[0]
        sums = (rollout.turn_rewards.sum(1).float() if rollout.turn_rewards is not None
                else torch.zeros(n, device=rollout.responses.device))
        sources = self.source_index if self.source_index is not None and len(self.source_index) == n else \
            torch.full((n,), -1.0, device=sums.device)
        gathered = self.gather(torch.stack([sums, sources.to(sums.device)], 1))
        metrics = {"episodes/turn_reward_mean": gathered[:, 0].mean().item()}
        if len(self.sources) > 1:
            for k, source in enumerate(self.sources):
                mine = gathered[gathered[:, 1] == k, 0]
                if mine.numel():
                    metrics[f"episodes/turn_reward/{source.__name__}/mean"] = mine.mean().item()
        return metrics
