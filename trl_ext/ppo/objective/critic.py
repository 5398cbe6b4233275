"""What a PPO run does with a critic and without one: one object, chosen once from the config by
:func:`build_critic`, that :class:`trl_ext.PPOTrainer`'s steps, checkpoints and memory budgets ask.

* :class:`ValueCritic` (``advantage_estimator="gae"``): values from the value model's head, the clipped value loss,
  GAE advantages whitened over the response tokens, the value model saved in and restored from checkpoints, a value
  model in the memory budget.
* :class:`CriticFree` (every other estimator): no value forward (zero values), a zero value loss, the estimators of
  :mod:`trl_ext.ppo.objective.advantages` on a scored rollout, no value model saved, no value model in the budget, and
  :func:`critic_free_metrics` (group and estimator metrics; the value-model ones, `loss/value_avg` and `val/*`, go).
* :class:`NoValueModel`: stands in for the value model (`value_model=None`): no parameters, no forward work, so the
  parent's `PolicyAndValueWrapper` (one `accelerator.prepare`, one optimizer) holds the policy alone;
  :func:`check_value_model` chooses between it and the caller's value model.
* :func:`group_prompts`: the prompt DataLoader rebuilt to give `local_batch_size / k` prompts per update, and
  :func:`repeat_prompts` repeating each prompt `k` times (the k samples of a prompt are consecutive rows of the
  rollout: groups stay together through scoring and advantages; `optimize` then shuffles episodes freely).

Both critics answer the same calls: ``has_value_model``, ``values``, ``advantages``, ``value_loss``,
``save_value_model``, ``load_value_model`` and ``metrics``; a new estimator changes :class:`CriticFree` (or adds a
critic here and a case to :func:`build_critic`), nothing in the trainer.

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
from ...models.scalar_heads import scalar_model_outputs
from ...rewards.metrics import all_equal_groups
from ...runtime.checkpoints import load_weights_in_place
from .action_gae import gae_over_steps
from .advantages import (
    gae_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_advantages_to_tokens,
)
from .losses import ValueLoss, value_loss
from .masked_stats import masked_mean, masked_whiten

__all__ = ["CriticFree", "NoValueModel", "ValueCritic", "build_critic", "check_value_model", "critic_free_metrics",
           "group_prompts", "repeat_prompts"]


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


def build_critic(args, accelerator):
    """The run's critic, built once from its config: :class:`CriticFree` for a critic-free ``advantage_estimator``
    (every one but ``gae``), else :class:`ValueCritic`."""
    return CriticFree(args, accelerator) if args.critic_free else ValueCritic(args)


class ValueCritic:
    """GAE with a value model (``advantage_estimator="gae"``, TRL's PPO): the trainer's steps call :meth:`values`
    (``compute_values``), :meth:`advantages` (``compute_advantages``), :meth:`value_loss` (the loss step),
    :meth:`metrics` (``update_metrics``); checkpoints :meth:`save_value_model` and :meth:`load_value_model`.

    Args:
        args: the trainer's config (``gamma``, ``lam``, ``cliprange_value``, ``value_clip``), read at each call.
    """

    has_value_model = True
    """The run holds a value model: it is trained, saved, and counted in the memory budgets."""

    def __init__(self, args):
        self.args = args

    @staticmethod
    def values(value_model, query_response: torch.Tensor, pad_token_id: int, context_length: int) -> torch.Tensor:
        """Per-response-token values `(batch, response_length)` from the value model's head (plain or PEFT)."""
        full_value, _, _ = scalar_model_outputs(value_model, query_response, pad_token_id, context_length)
        return full_value[:, context_length - 1 : -1].squeeze(-1)

    def advantages(self, rollout, kl_coef: float) -> None:
        """Set `rollout.advantages` (GAE, whitened over the response tokens, 0 on padding) and `rollout.returns`
        from the rewards and values of a rollout; with tools, GAE over the policy's tokens only
        (:mod:`trl_ext.ppo.objective.action_gae`). ``kl_coef`` is in the rewards already: unused here."""
        args = self.args
        if rollout.observation_mask is not None:  # tools: GAE over the action tokens
            advantages, returns = gae_over_steps(rollout.rewards, rollout.values, ~rollout.padding_mask_p1,
                                                 args.gamma, args.lam)
        else:
            advantages, returns = gae_advantages(rollout.rewards, rollout.values, args.gamma, args.lam)
        advantages = masked_whiten(advantages, ~rollout.padding_mask)
        rollout.advantages = torch.masked_fill(advantages, rollout.padding_mask, 0)
        rollout.returns = returns

    def value_loss(self, vpred_temp: torch.Tensor, rollout, micro_batch_inds, device) -> ValueLoss:
        """The value loss of one micro-batch (`value_clip` mode, `cliprange_value`) from the value head's output
        `vpred_temp` `(micro_batch, sequence, 1)` over the whole query+response."""
        padding_mask_p1 = rollout.padding_mask_p1[micro_batch_inds]
        context_length = rollout.context_length
        vpred = torch.masked_fill(vpred_temp[:, context_length - 1 : -1].squeeze(-1), padding_mask_p1, 0)
        return value_loss(vpred, rollout.values[micro_batch_inds], rollout.returns[micro_batch_inds],
                          ~padding_mask_p1, self.args.cliprange_value, self.args.value_clip)

    @staticmethod
    def save_value_model(value_model, directory: str) -> None:
        """Write the value model (full weights, or its adapter and score head) to a checkpoint's `directory`."""
        value_model.save_pretrained(directory)

    @staticmethod
    def load_value_model(value_model, directory: str) -> None:
        """Restore the value model's weights from a checkpoint's `directory`, in place (the optimizer stays valid)."""
        load_weights_in_place(value_model, directory)

    def metrics(self, metrics: dict, rollout, stats) -> None:
        """TRL's value-model metrics stay as they are."""


class CriticFree:
    """A critic-free ``advantage_estimator`` (every one but ``gae``) in one trainer, built once from its config; it
    answers the calls of :class:`ValueCritic`: :meth:`values` (zeros, no forward), :meth:`advantages` (the
    estimator), :meth:`value_loss` (zero), :meth:`metrics` (:func:`critic_free_metrics`); no value model is saved,
    loaded or budgeted.

    Args:
        args: the trainer's config (``advantage_estimator``, ``num_samples_per_prompt``, ``kl_in``,
            ``grpo_scale_by_std``).
        accelerator: REINFORCE++ whitens over every process's tokens; metrics are means over processes.
    """

    has_value_model = False
    """No value model: its stand-in (:class:`NoValueModel`) is neither trained, saved nor counted in a budget."""

    def __init__(self, args, accelerator):
        self.estimator, self.group_size = args.advantage_estimator, args.num_samples_per_prompt
        self.kl_in_reward, self.scale_by_std = args.kl_in == "reward", args.grpo_scale_by_std
        self.accelerator = accelerator

    @staticmethod
    def values(value_model, query_response: torch.Tensor, pad_token_id: int, context_length: int) -> torch.Tensor:
        """Zeros `(batch, response_length)`: no value forward."""
        return torch.zeros(query_response[:, context_length:].shape, device=query_response.device)

    def advantages(self, rollout, kl_coef: float) -> None:
        """Set `rollout.advantages` `(batch, T)` (0 on padding) from the scores, KL and masks of a scored rollout.

        `rloo`/`grpo`: one advantage per sequence from its group's rewards, `score - kl_coef * sum_t KL_t` with
        `kl_in="reward"` or the score alone with `kl_in="loss"`, on every response token, not whitened.
        `reinforce_pp[_baseline]`: per-token returns-to-go whitened over the global batch (every process's tokens).
        With environments' per-turn rewards (`rollout.turn_rewards`), each episode's sum of them is added to its
        score first (sequence-level, as the estimators score).
        `rollout.returns` is the advantages (no value target). Quantities for the metrics go to
        `rollout.estimator_stats`. ``kl_coef``: this update's KL coefficient.
        """
        k, estimator = self.group_size, self.estimator
        mask = ~rollout.padding_mask
        kl_coef = kl_coef if self.kl_in_reward else 0.0
        scores = rollout.scores
        if rollout.turn_rewards is not None:  # environments' per-turn rewards: sequence-level, their sum
            scores = scores + rollout.turn_rewards.sum(1)
        if estimator in ("rloo", "grpo"):
            rewards = scores - kl_coef * (rollout.kl * mask).sum(1)
            if estimator == "rloo":
                per_sequence = rloo_advantages(rewards, k)
            else:
                per_sequence = grpo_advantages(rewards, k, scale_by_std=self.scale_by_std)
            advantages = sequence_advantages_to_tokens(per_sequence, mask)
            rollout.estimator_stats["sequence_advantages"] = per_sequence
        else:
            group_size = k if estimator == "reinforce_pp_baseline" else None
            advantages = reinforce_pp_advantages(scores, rollout.kl, kl_coef, mask, group_size,
                                                 _sum_over_processes(self.accelerator))
        rollout.advantages = advantages
        rollout.returns = advantages

    @staticmethod
    def value_loss(vpred_temp, rollout, micro_batch_inds, device) -> ValueLoss:
        """The value-loss terms of a critic-free micro-batch: zeros on `device` (the loss is the policy's alone)."""
        zero = torch.zeros((), device=device)
        return ValueLoss(zero, zero)

    @staticmethod
    def save_value_model(value_model, directory: str) -> None:
        """Nothing to save: the stand-in has no weights."""

    @staticmethod
    def load_value_model(value_model, directory: str) -> None:
        """Nothing to restore: the stand-in has no weights."""

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
