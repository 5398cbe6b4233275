"""Per-turn credit without a value model (``turn_credit: turn``), as pure functions on ``(batch, T)`` token tensors and
``(batch, turns)`` turn tensors. A turn is a run of the policy's own tokens (:func:`turn_index`); an episode's turn
``t`` has the return-to-go ``G_t = sum_{s >= t} gamma^(s - t) R_s``, ``R_s`` the rewards on turn ``s``'s tokens
(:func:`turn_returns`), and its baseline comes from the same turn of the group's other episodes: leave-one-out
(:func:`loo_turn_advantages`), normalised (:func:`group_turn_advantages`) or centred
(:func:`centred_turn_returns`). A turn that some episodes of the group never reached is compared with those that
did; a turn no other episode of its group reached has nothing to compare with and gets 0.
How the estimators use them: docs/critic-free.md, "Per-turn credit".
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["centred_turn_returns", "centred_turn_rewards", "group_turn_advantages", "loo_turn_advantages",
           "loo_turn_baseline", "on_tokens", "reached_turns", "turn_discounted_returns", "turn_ends", "turn_index",
           "turn_returns", "turn_starts", "turn_sums"]


def turn_index(steps: torch.Tensor) -> torch.Tensor:
    """``(batch, T)``: 1, 2, ... on the tokens of each row's first, second, ... run of ``steps`` (a turn of the
    policy's tokens), 0 elsewhere."""
    starts = steps & ~F.pad(steps, (1, 0), value=False)[:, :-1]
    return torch.cumsum(starts.long(), 1) * steps


def turn_starts(turns: torch.Tensor) -> torch.Tensor:
    """``(batch, T)`` bool: True on each turn's first token."""
    return (turns > 0) & (F.pad(turns, (1, 0))[:, :-1] != turns)


def turn_ends(turns: torch.Tensor) -> torch.Tensor:
    """``(batch, T)`` bool: True on each turn's last token."""
    return (turns > 0) & (F.pad(turns, (0, 1))[:, 1:] != turns)


def turn_sums(values: torch.Tensor, turns: torch.Tensor, n_turns: int) -> torch.Tensor:
    """``(batch, n_turns)``: the sum of ``values`` over each turn's tokens (``turns`` from :func:`turn_index`; tokens
    of turn 0, outside every turn, left out)."""
    out = torch.zeros(values.shape[0], n_turns + 1, dtype=values.dtype, device=values.device)
    return out.scatter_add_(1, turns, values * (turns > 0).to(values.dtype))[:, 1:]


def reached_turns(turns: torch.Tensor, n_turns: int) -> torch.Tensor:
    """``(batch, n_turns)`` bool: True for the turns the row's episode played."""
    return torch.arange(1, n_turns + 1, device=turns.device) <= turns.max(1, keepdim=True).values


def turn_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """The turns' returns-to-go ``G_t = R_t + gamma * G_{t+1}`` from per-turn rewards ``R`` ``(batch, turns)`` (0
    after an episode's last turn, so ``G`` is 0 there too)."""
    returns, later = torch.zeros_like(rewards), torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        later = rewards[:, t] + gamma * later
        returns[:, t] = later
    return returns


def _grouped(per_turn: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(batch, turns)`` -> ``(batch / k, k, turns)``: the k samples of a prompt are consecutive rows."""
    if per_turn.shape[0] % group_size:
        raise ValueError(f"{per_turn.shape[0]} rows do not split into groups of {group_size}")
    return per_turn.view(-1, group_size, per_turn.shape[1])


def loo_turn_baseline(returns: torch.Tensor, reached: torch.Tensor, group_size: int
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The leave-one-out baseline of each turn, ``b_{i,t} = mean_{j != i} G_{j,t}`` over the group's other episodes
    ``j`` that reached turn ``t``, and where it exists (episode ``i`` reached turn ``t`` and another did too); both
    ``(batch, turns)``, the baseline 0 where it does not exist."""
    m = reached.to(returns.dtype)
    g, mg = _grouped(returns * m, group_size), _grouped(m, group_size)
    others = mg.sum(1, keepdim=True) - mg
    exists = (mg > 0) & (others > 0)
    baseline = torch.where(exists, (g.sum(1, keepdim=True) - g) / others.clamp(min=1), 0.0)
    return baseline.reshape(returns.shape), exists.reshape(returns.shape)


def loo_turn_advantages(returns: torch.Tensor, reached: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO per turn (Ahmadian et al. 2024, eq. 5, on each turn's return-to-go): ``A_{i,t} = G_{i,t} - b_{i,t}``
    (:func:`loo_turn_baseline`); 0 where no other episode of the group reached turn ``t``, and on turns episode ``i``
    did not reach. ``returns``, ``reached``: ``(batch, turns)``."""
    baseline, exists = loo_turn_baseline(returns, reached, group_size)
    return torch.where(exists, returns - baseline, 0.0)


def group_turn_advantages(returns: torch.Tensor, reached: torch.Tensor, group_size: int, scale_by_std: bool,
                          eps: float) -> torch.Tensor:
    """GRPO per turn (Shao et al. 2024, sec. 4.1.2, on each turn's return-to-go): ``A_{i,t} = (G_{i,t} - mean_t) /
    (std_t + eps)`` with the mean and the unbiased std of turn ``t`` over the group's episodes that reached it (Dr.
    GRPO without the division: ``scale_by_std=False``); 0 where fewer than 2 did, and on turns not reached."""
    m = _grouped(reached.to(returns.dtype), group_size)
    g = _grouped(returns, group_size) * m
    count = m.sum(1, keepdim=True)
    mean = g.sum(1, keepdim=True) / count.clamp(min=1)
    centred = (g - mean) * m
    if scale_by_std:
        std = ((centred**2).sum(1, keepdim=True) / (count - 1).clamp(min=1)).sqrt()
        centred = centred / (std + eps)
    return torch.where((m > 0) & (count > 1), centred, 0.0).reshape(returns.shape)


def centred_turn_returns(returns: torch.Tensor, reached: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE++-baseline per turn: ``G_{i,t} - mean_t``, the mean of turn ``t``'s return-to-go over the group's
    episodes that reached it (``i`` included, as REINFORCE++-baseline's group mean); 0 on turns not reached."""
    m = _grouped(reached.to(returns.dtype), group_size)
    g = _grouped(returns, group_size) * m
    mean = g.sum(1, keepdim=True) / m.sum(1, keepdim=True).clamp(min=1)
    return ((g - mean) * m).reshape(returns.shape)


def on_tokens(per_turn: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """``(batch, T)``: each token gets its turn's value of ``per_turn`` ``(batch, turns)``; 0 outside every turn."""
    padded = F.pad(per_turn, (1, 0))
    return torch.gather(padded, 1, turns)


def turn_discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, turns: torch.Tensor, gamma: float
                            ) -> torch.Tensor:
    """REINFORCE++'s per-token returns-to-go over the counted tokens, discounted once per turn:
    ``G_tau = r_tau + d_tau * G_{tau + 1}``, ``d`` = ``gamma`` on a turn's last token (the next counted token is the
    next turn's first) and 1 elsewhere, so that a turn's first token gets ``R_t + gamma * G_{t+1}``; 0 where ``mask``
    is False. gamma 1: the undiscounted returns-to-go."""
    maskf = mask.to(rewards.dtype)
    discount = torch.where(mask & turn_ends(turns), gamma, 1.0).to(rewards.dtype)
    returns, later = torch.zeros_like(rewards), torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        later = rewards[:, t] * maskf[:, t] + discount[:, t] * later
        returns[:, t] = later
    return returns * maskf


def centred_turn_rewards(rewards: torch.Tensor, turns: torch.Tensor, gamma: float, group_size: int) -> torch.Tensor:
    """REINFORCE++-baseline's environment rewards per turn: ``(batch, T)``, on each turn's last token
    ``D_t = C_t - gamma * C_{t+1}``, ``C`` the turns' returns-to-go of ``rewards`` (the environment's: score and
    per-turn rewards, on counted tokens) minus their group's mean (:func:`centred_turn_returns`), so that the
    returns-to-go of ``D`` at a turn are ``C`` there; one turn: the score minus its group's mean."""
    n_turns = max(int(turns.max()), 1)
    centred = centred_turn_returns(turn_returns(turn_sums(rewards, turns, n_turns), gamma),
                                   reached_turns(turns, n_turns), group_size)
    per_turn = centred - gamma * F.pad(centred[:, 1:], (0, 1))
    return torch.where(turn_ends(turns), on_tokens(per_turn, turns), 0.0)
