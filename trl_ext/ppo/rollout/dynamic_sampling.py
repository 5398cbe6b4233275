"""Dynamic sampling (DAPO, Yu et al. 2025, sec. 3.2): an update trains only on groups whose scores differ, sampling
more prompts until its batch is full. How it works: docs/ppo-internals.md#dynamic-sampling."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ...rewards.metrics import all_equal_groups
from .sequences import INVALID_LOGPROB

__all__ = ["DynamicSampling", "concat_rollouts", "informative_groups", "select_rows"]

_RIGHT_PAD = {"responses": "pad", "postprocessed_responses": "pad", "logprobs": INVALID_LOGPROB,
              "ref_logprobs": INVALID_LOGPROB, "values": 0.0, "padding_mask": True, "padding_mask_p1": True}
"""What fills a `(batch, T)` field's new positions when responses of different lengths are joined."""
_PER_ROUND = {"names": lambda values: values[0],
              "timeouts": lambda values: [sum(c) for c in zip(*values)],
              "errors": lambda values: [sum(c) for c in zip(*values)],
              "logged_metrics": lambda values: {k: [x for v in values for x in v.get(k, [])] for k in values[0]}}
"""Fields of a nested dataclass (the reward functions' `RewardScores`) that hold one value per round, not per episode
(names of the rewards, counts of timeouts and errors, values logged by `log_metric`): how rounds combine."""


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """``(batch / k,)`` bool: True for the groups (k consecutive rows) whose scores are not all equal."""
    return ~all_equal_groups(scores, group_size)


def select_rows(value, rows: torch.Tensor, batch: int):
    """``value`` restricted to ``rows`` when it has one entry per episode (tensor or list), recursing into dicts."""
    if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == batch:
        return value[rows.to(value.device)]
    if isinstance(value, list) and len(value) == batch:
        return [value[i] for i in rows.tolist()]
    if isinstance(value, dict):
        return {key: select_rows(item, rows, batch) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.replace(value, **{f.name: select_rows(getattr(value, f.name), rows, batch)
                                             for f in dataclasses.fields(value) if f.name not in _PER_ROUND})
    return value


def _join(name, values, batch_sizes, context_pads, width, pad_token_id):
    first = values[0]
    if first is None:
        return None
    if isinstance(first, dict):
        return {key: _join(key, [v[key] for v in values], batch_sizes, context_pads, width, pad_token_id)
                for key in first}
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return dataclasses.replace(first, **{
            f.name: _PER_ROUND[f.name]([getattr(v, f.name) for v in values]) if f.name in _PER_ROUND
            else _join(f.name, [getattr(v, f.name) for v in values], batch_sizes, context_pads, width, pad_token_id)
            for f in dataclasses.fields(first)})
    if isinstance(first, list) and all(len(v) == n for v, n in zip(values, batch_sizes)):
        return [item for v in values for item in v]
    if not torch.is_tensor(first):
        return first
    if first.dim() == 0:  # a per-process statistic (e.g. scores_clipfrac): weighted by each round's size
        return sum(v * n for v, n in zip(values, batch_sizes)) / sum(batch_sizes)
    if not all(v.shape[0] == n for v, n in zip(values, batch_sizes)):
        return first
    if name in ("queries", "query_responses"):  # left-pad the prompt part to the longest context
        values = [F.pad(v, (pad, 0), value=pad_token_id) for v, pad in zip(values, context_pads)]
        if name == "query_responses":
            longest = max(v.shape[1] for v in values)
            values = [F.pad(v, (0, longest - v.shape[1]), value=pad_token_id) for v in values]
    elif name in _RIGHT_PAD and first.dim() == 2:
        fill = pad_token_id if _RIGHT_PAD[name] == "pad" else _RIGHT_PAD[name]
        values = [F.pad(v, (0, width - v.shape[1]), value=fill) for v in values]
    return torch.cat(values, 0)


def concat_rollouts(rollouts: list, pad_token_id: int):
    """One rollout of the episodes of several (scored) rollouts, in order. Per-episode fields are concatenated;
    queries are left-padded with ``pad_token_id`` to the longest context, responses and their per-token fields
    right-padded to the longest response (pad token, ``INVALID_LOGPROB`` log-probs, value 0, padding masks True);
    a per-process scalar statistic becomes the mean over all episodes."""
    if len(rollouts) == 1:
        return rollouts[0]
    context = max(r.context_length for r in rollouts)
    width = max(r.responses.shape[1] for r in rollouts)
    sizes = [r.responses.shape[0] for r in rollouts]
    pads = [context - r.context_length for r in rollouts]
    joined = {f.name: _join(f.name, [getattr(r, f.name) for r in rollouts], sizes, pads, width, pad_token_id)
              for f in dataclasses.fields(rollouts[0]) if f.name != "context_length"}
    return dataclasses.replace(rollouts[0], context_length=context, **joined)


def _subset(rollout, rows: torch.Tensor):
    batch = rollout.responses.shape[0]
    return dataclasses.replace(rollout, **{f.name: select_rows(getattr(rollout, f.name), rows, batch)
                                           for f in dataclasses.fields(rollout) if f.name != "context_length"})


def _group_rows(groups: torch.Tensor, k: int) -> torch.Tensor:
    return (groups.unsqueeze(1) * k + torch.arange(k, device=groups.device)).reshape(-1)


class DynamicSampling:
    """DAPO's dynamic sampling of one trainer (see the module docstring), built once from its config when
    ``dynamic_sampling`` is on; the trainer's step ``resample_groups`` calls :meth:`resample` after the first round
    is scored.

    Args:
        group_size: ``num_samples_per_prompt``.
        groups_wanted: the groups of one process's update (``local_batch_size / num_samples_per_prompt``).
        max_rounds: ``max_sampling_rounds``.
        accelerator: the trainer's accelerator (the rounds and the metrics are agreed over processes).
        pad_token_id: the tokenizer's pad id (rounds of different prompt lengths are joined with it).
    """

    def __init__(self, group_size: int, groups_wanted: int, max_rounds: int, accelerator, pad_token_id: int):
        self.group_size, self.groups_wanted, self.max_rounds = group_size, groups_wanted, max_rounds
        self.accelerator = accelerator
        self.pad_token_id = pad_token_id

    @classmethod
    def from_args(cls, args, accelerator, pad_token_id: int) -> "DynamicSampling":
        """From a :class:`~trl_ext.PPOConfig`'s ``num_samples_per_prompt``, ``local_batch_size`` and
        ``max_sampling_rounds``."""
        k = args.num_samples_per_prompt
        return cls(k, args.local_batch_size // k, args.max_sampling_rounds, accelerator, pad_token_id)

    def resample(self, rollout, sample_round):
        """The update's rollout: ``rollout`` (the first round, scored and clipped) and as many more rounds as it
        takes; ``sample_round(where)`` draws, generates and scores the next prompt batch through the trainer's own
        steps and returns ``(rollout, scored, _)``; a round whose scores are not finite is dropped whole under
        ``nonfinite_policy: skip``."""
        accelerator, k, wanted = self.accelerator, self.group_size, self.groups_wanted
        kept, dropped, generated, rounds = [], [], [rollout.responses.shape[0]], 1

        def split(part):
            informative = informative_groups(part.scores, k)
            groups = torch.arange(informative.shape[0], device=informative.device)
            if informative.any():
                kept.append(_subset(part, _group_rows(groups[informative], k)))
            if (~informative).any():
                dropped.append(_subset(part, _group_rows(groups[~informative], k)))

        def count(parts):
            return sum(p.responses.shape[0] for p in parts) // k

        split(rollout)
        while rounds < self.max_rounds:
            short = torch.tensor(float(wanted - min(count(kept), wanted)), device=accelerator.device)
            if accelerator.gather(short.reshape(1)).max().item() == 0:
                break
            rounds += 1
            part, scored, _ = sample_round(f" (sampling round {rounds})")
            generated.append(part.responses.shape[0])
            if scored:
                split(part)
        refill = max(0, wanted - count(kept))
        joined = concat_rollouts(kept + dropped, self.pad_token_id)
        out = _subset(joined, torch.arange(wanted * k, device=joined.responses.device))
        totals = accelerator.gather(torch.tensor([[float(count(dropped) - refill), float(refill),
                                                   float(sum(generated))]], device=accelerator.device)).sum(0)
        out.sampling = {"sampling/rounds": rounds, "sampling/groups_dropped": totals[0].item(),
                        "sampling/groups_refilled": totals[1].item(), "sampling/completions": totals[2].item()}
        return out
