"""Critic-free PPO: what :class:`trl_ext.PPOTrainer`'s steps call when `advantage_estimator` is not `gae`.

* :class:`NoValueModel`: stands in for the value model (`value_model=None`): no parameters, no forward work, so the
  parent's `PolicyAndValueWrapper` (one `accelerator.prepare`, one optimizer) holds the policy alone.
* :func:`group_prompts`: the prompt DataLoader rebuilt to give `local_batch_size / k` prompts per update, and
  :func:`repeat_prompts` repeating each prompt `k` times (the k samples of a prompt are consecutive rows of the
  rollout: groups stay together through scoring and advantages; `optimize` then shuffles episodes freely).
* :class:`CriticFree`, the feature's one object in the trainer (built once from the config): the estimators of
  :mod:`trl_ext.ppo.objective.advantages` on a scored rollout, the zero value loss, and :func:`critic_free_metrics` (group
  and estimator metrics; the value-model ones, `loss/value_avg` and `val/*`, go).

The batch arithmetic is the parent's: `local_batch_size = per_device_train_batch_size * gradient_accumulation_steps`
episodes per process and update (`batch_size` = that times the processes), sampled from `local_batch_size / k`
prompts, `k` samples each.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch.utils.data import DataLoader

from ...errors import UserInputError
from ...rewards.metrics import all_equal_groups
from .advantages import (
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_advantages_to_tokens,
)
from .losses import ValueLoss
from .masked_stats import masked_mean

__all__ = ["CriticFree", "NoValueModel", "check_value_model", "critic_free_metrics", "group_prompts",
           "repeat_prompts"]


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


def group_prompts(trainer) -> None:
    """With `k = num_samples_per_prompt > 1`, rebuild the prompt DataLoader to give `local_batch_size / k` prompts.

    Seeded as the parent seeds its own (`args.seed` right before `accelerator.prepare`, then the process's
    `local_seed`), so the shuffle is the same on every process and the torch RNG ends where the parent left it.
    """
    args = trainer.args
    k = args.num_samples_per_prompt
    if k == 1:
        return
    trainer.local_dataloader_batch_size = args.local_batch_size // k
    dataloader = DataLoader(trainer.train_dataset, batch_size=trainer.local_dataloader_batch_size, shuffle=True,
                            collate_fn=trainer.data_collator, drop_last=True)
    torch.manual_seed(args.seed)
    trainer.dataloader = trainer.accelerator.prepare(dataloader)
    torch.manual_seed(trainer.local_seed)


def repeat_prompts(batch: dict, k: int) -> dict:
    """Each prompt of a collated batch `k` times in a row (`[p0, p0, p1, p1, ...]` for `k = 2`), its tensors and its
    list columns (the dataset columns reward functions get) alike."""
    if k == 1:
        return batch

    def repeat(value):
        if torch.is_tensor(value):
            return value.repeat_interleave(k, dim=0)
        if isinstance(value, list):
            return [item for item in value for _ in range(k)]
        return value

    return {key: repeat(value) for key, value in batch.items()}


def _sum_over_processes(accelerator):
    if accelerator.num_processes == 1:
        return None
    return lambda tensor: accelerator.reduce(tensor, reduction="sum")


class CriticFree:
    """A critic-free ``advantage_estimator`` (every one but ``gae``) in one trainer, built once from its config; the
    trainer's steps call :meth:`advantages` (``compute_advantages``), :meth:`value_loss` (the loss step) and
    :meth:`metrics` (``update_metrics``).

    Args:
        args: the trainer's config (``advantage_estimator``, ``num_samples_per_prompt``, ``kl_in``,
            ``grpo_scale_by_std``).
        accelerator: REINFORCE++ whitens over every process's tokens; metrics are means over processes.
    """

    def __init__(self, args, accelerator):
        self.estimator, self.group_size = args.advantage_estimator, args.num_samples_per_prompt
        self.kl_in_reward, self.scale_by_std = args.kl_in == "reward", args.grpo_scale_by_std
        self.accelerator = accelerator

    def advantages(self, rollout, kl_coef: float) -> None:
        """Set `rollout.advantages` `(batch, T)` (0 on padding) from the scores, KL and masks of a scored rollout.

        `rloo`/`grpo`: one advantage per sequence from its group's rewards, `score - kl_coef * sum_t KL_t` with
        `kl_in="reward"` or the score alone with `kl_in="loss"`, on every response token, not whitened.
        `reinforce_pp[_baseline]`: per-token returns-to-go whitened over the global batch (every process's tokens).
        `rollout.returns` is the advantages (no value target). Quantities for the metrics go to
        `rollout.estimator_stats`. ``kl_coef``: this update's KL coefficient.
        """
        k, estimator = self.group_size, self.estimator
        mask = ~rollout.padding_mask
        kl_coef = kl_coef if self.kl_in_reward else 0.0
        if estimator in ("rloo", "grpo"):
            rewards = rollout.scores - kl_coef * (rollout.kl * mask).sum(1)
            if estimator == "rloo":
                per_sequence = rloo_advantages(rewards, k)
            else:
                per_sequence = grpo_advantages(rewards, k, scale_by_std=self.scale_by_std)
            advantages = sequence_advantages_to_tokens(per_sequence, mask)
            rollout.estimator_stats["sequence_advantages"] = per_sequence
        else:
            group_size = k if estimator == "reinforce_pp_baseline" else None
            advantages = reinforce_pp_advantages(rollout.scores, rollout.kl, kl_coef, mask, group_size,
                                                 _sum_over_processes(self.accelerator))
        rollout.advantages = advantages
        rollout.returns = advantages

    @staticmethod
    def value_loss(device) -> ValueLoss:
        """The value-loss terms of a critic-free micro-batch: zeros (the loss is the policy's alone)."""
        zero = torch.zeros((), device=device)
        return ValueLoss(zero, zero)

    def metrics(self, metrics: dict, rollout, stats) -> None:
        """Replace the value-model metrics in `metrics` with the critic-free ones (:func:`critic_free_metrics`)."""
        critic_free_metrics(metrics, rollout, stats, self.group_size, self.accelerator.gather_for_metrics)


def critic_free_metrics(metrics: dict, rollout, stats, k: int, gather) -> None:
    """Replace the value-model metrics in `metrics` with the critic-free ones (means over processes):

    * `objective/group_scores_std`: mean over groups of the std of the scores within a group (k > 1);
    * `objective/frac_groups_equal_scores`: fraction of groups whose scores are all equal (their group advantage is
      0: a wasted rollout; k > 1);
    * `objective/advantages_abs`: mean |advantage| over the response tokens (`rloo`/`grpo`: per sequence);
    * `loss/kl_avg`: the k3 KL loss term before `kl_coef` (`kl_in="loss"`);
    * `policy/ratio_avg`, `policy/ratio_var`, `objective/num_eos_tokens`: TRL's `val/ratio`, `val/ratio_var`,
      `val/num_eos_tokens` renamed, so that a critic-free run logs no `val/*` key.
    """
    for key in ("loss/value_avg", "val/clipfrac_avg"):
        metrics.pop(key, None)
    metrics["policy/ratio_avg"] = metrics.pop("val/ratio")
    metrics["policy/ratio_var"] = metrics.pop("val/ratio_var")
    metrics["objective/num_eos_tokens"] = metrics.pop("val/num_eos_tokens")
    if k > 1:
        grouped = rollout.scores.view(-1, k)
        metrics["objective/group_scores_std"] = gather(grouped.std(1).mean()).mean().item()
        all_equal = all_equal_groups(rollout.scores, k).float().mean()
        metrics["objective/frac_groups_equal_scores"] = gather(all_equal).mean().item()
    if "sequence_advantages" in rollout.estimator_stats:
        abs_advantages = rollout.estimator_stats["sequence_advantages"].abs().mean()
    else:
        abs_advantages = masked_mean(rollout.advantages.abs(), ~rollout.padding_mask)
    metrics["objective/advantages_abs"] = gather(abs_advantages).mean().item()
    if stats.kl_losses:
        metrics["loss/kl_avg"] = gather(torch.stack(stats.kl_losses).mean()).mean().item()
