"""The PPO epochs of :meth:`trl_ext.PPOTrainer.optimize`: one optimizer step per mini-batch, always, its
micro-batches' gradients accumulated (:func:`run_ppo_epochs`, :class:`MiniBatchPlan`, :class:`GradientClip`), each
loss term of a micro-batch weighted by its share of the mini-batch under ``train_micro_batch_size``, so that the update
does not depend on the micro-batch (:func:`micro_batch_weights`). How it works: docs/ppo-internals.md#the-ppo-epochs,
docs/ppo-internals.md#micro-batches-of-the-ppo-epochs."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import torch

from ..errors import UserInputError
from .objective.objectives import ObjectiveConfig, global_token_normalizer, loss_mask, mini_batch_token_normalizer
from .rollout import UpdateStats

__all__ = ["GradientClip", "MicroBatchWeights", "MiniBatchPlan", "UpdateSteps", "micro_batch_weights",
           "objective_for_micro_batches", "run_ppo_epochs"]


@dataclass
class MicroBatchWeights:
    """Per micro-batch of one mini-batch: the weight of the policy terms (policy loss, KL and entropy terms), of the
    value loss and of the joint ptx loss, and the ``token_normalizer`` under a token-level aggregation."""

    policy: list
    value: list
    ptx: float
    token_normalizer: torch.Tensor | None


def micro_batch_weights(rollout, inds, spans, cfg, accelerator=None) -> MicroBatchWeights:
    """The loss weights of ``train_micro_batch_size`` (docs/ppo-internals.md#micro-batches-of-the-ppo-epochs) for the
    mini-batch ``inds`` cut into ``spans`` (``(start, end)`` positions in ``inds``); ``cfg``: the objective (its
    ``loss_aggregation``)."""
    total = len(inds)
    value_tokens = (~rollout.padding_mask_p1[inds]).sum(dim=1).float()
    value_total = value_tokens.sum().clamp(min=1)
    value = [value_tokens[lo:hi].sum() / value_total for lo, hi in spans]
    if cfg.loss_aggregation in ("token_mean", "global_token_mean"):
        mask = loss_mask(rollout.padding_mask[inds], rollout.contain_eos_token[inds], cfg)
        return MicroBatchWeights([1.0] * len(spans), value, 1 / len(spans),
                                 global_token_normalizer(mask, 1, accelerator))
    return MicroBatchWeights([(hi - lo) / total for lo, hi in spans], value, 1 / len(spans), None)


def objective_for_micro_batches(objective, args):
    """The trainer's objective (:class:`~trl_ext.ppo.objective.objectives.ObjectiveConfig`) under ``args``: with
    ``train_micro_batch_size`` set, ``token_mean`` normalises by the mini-batch's token count (``global_token_mean``, as
    :func:`micro_batch_weights`); otherwise unchanged."""
    if args.train_micro_batch_size is not None and objective.loss_aggregation == "token_mean":
        return replace(objective, loss_aggregation="global_token_mean")
    return objective


@dataclass(frozen=True)
class MiniBatchPlan:
    """The config the epochs read: ``epochs`` passes over ``batch_size`` sequences in mini-batches of ``size``, each
    cut at ``spans`` (``(start, end)`` in the mini-batch); ``weighted``: ``train_micro_batch_size``'s loss weights,
    else TRL's per-micro-batch losses."""

    epochs: int
    batch_size: int
    size: int
    spans: tuple[tuple[int, int], ...]
    weighted: bool
    objective: ObjectiveConfig
    vf_coef: float
    ptx_coef: float

    @classmethod
    def from_args(cls, args, objective: ObjectiveConfig, micro: int | None = None) -> "MiniBatchPlan":
        """``micro``: the resolved ``train_micro_batch_size`` (None: micro-batches of
        ``per_device_train_batch_size``, unweighted)."""
        size = args.local_mini_batch_size
        step = micro if micro is not None else args.per_device_train_batch_size
        return cls(args.num_ppo_epochs, args.local_batch_size, size,
                   tuple((lo, min(lo + step, size)) for lo in range(0, size, step)), micro is not None,
                   objective, args.vf_coef, args.ptx_coef)

    @classmethod
    def for_run(cls, args, objective: ObjectiveConfig, accelerator, policy, prompt_length: int, *, shared: bool,
                value_model: bool, reward_model: bool) -> "MiniBatchPlan":
        """:meth:`from_args` with ``train_micro_batch_size`` resolved (``auto``: measured from the unwrapped
        ``policy``, the longest prompt and the models the run holds, :mod:`trl_ext.ppo.memory.micro_batch`)."""
        micro = None
        if args.train_micro_batch_size is not None:
            from .memory.micro_batch import resolve_train_micro_batch

            micro = resolve_train_micro_batch(args, accelerator, policy, prompt_length, shared=shared,
                                              value_model=value_model, reward_model=reward_model)
        return cls.from_args(args, objective, micro)

    @property
    def micro(self) -> int | None:
        """The resolved ``train_micro_batch_size`` (None: unset, micro-batches of ``per_device_train_batch_size``)."""
        return self.spans[0][1] - self.spans[0][0] if self.weighted else None

    @property
    def mini_batches(self) -> int:
        return self.batch_size // self.size

    def weights(self, rollout, inds, accelerator) -> MicroBatchWeights:
        """The loss weights of mini-batch ``inds`` (:class:`MicroBatchWeights`)."""
        if self.weighted:
            return micro_batch_weights(rollout, inds, self.spans, self.objective, accelerator)
        n = len(self.spans)  # unset: each micro-batch's own loss, 1/n of the mini-batch's gradient
        return MicroBatchWeights([1.0] * n, [1.0] * n, 1.0,
                                 mini_batch_token_normalizer(self.objective, rollout, inds, n, accelerator))

    def loss_factor(self, scale: int) -> float:
        """What every loss is multiplied by before ``accelerator.backward`` (which divides by ``scale``, the
        accelerator's ``gradient_accumulation_steps``): ``scale`` with weighted terms, else ``scale / n``."""
        return float(scale) if self.weighted else scale / len(self.spans)

    def weighted_loss(self, out, weights: MicroBatchWeights, j: int) -> torch.Tensor:
        """Micro-batch ``j``'s loss with each term at its weight (``out.loss`` = policy terms + ``vf_coef`` * value
        loss (+ ``ptx_coef`` * ptx loss))."""
        w = weights.policy[j]
        if w == weights.value[j] and (out.ptx_loss is None or w == weights.ptx):
            return out.loss if w == 1.0 else out.loss * w
        loss = out.loss * w + self.vf_coef * out.value.loss * (weights.value[j] - w)
        if out.ptx_loss is not None:
            loss = loss + self.ptx_coef * out.ptx_loss * (weights.ptx - w)
        return loss


@dataclass(frozen=True)
class UpdateSteps:
    """What the epochs call (the trainer passes its bound methods, so a subclass's overrides take effect)."""

    loss: Callable
    """``(model, rollout, inds, ptx_batch, *, kl_coef, token_normalizer) -> MicroBatchOutput``."""
    step: Callable[[], bool]
    """The mini-batch's optimizer step (checked, clipped); True when it was taken."""
    zero_grad: Callable[[], None]
    observe: Callable
    """``(loss, quantity, *, where)``: the NaN/inf guard's record of each micro-batch's loss."""
    ptx_batch: Callable[[], dict] | None = None
    """Joint ptx: the ptx batch of each micro-batch."""
    ptx_step: Callable[[], torch.Tensor] | None = None
    """Separate ptx: a ptx step after each mini-batch's step; returns its LM loss."""


def run_ppo_epochs(rollout, plan: MiniBatchPlan, steps: UpdateSteps, accelerator, model, *, kl_coef: float,
                   deepspeed: bool = False) -> UpdateStats:
    """The PPO epochs of one update (module docstring). ``accelerator``: its ``backward``, ``no_sync``,
    ``gradient_state``, ``gradient_accumulation_steps`` and ``device``; ``deepspeed``: ``model`` is DeepSpeed's engine.
    Returns the per-micro-batch statistics, indexed ``[PPO epoch, mini-batch, micro-batch]``, and the number of
    optimizer steps taken (``optimizer_steps``)."""
    stats = UpdateStats((plan.epochs, plan.mini_batches, len(plan.spans)), accelerator.device)
    factor = plan.loss_factor(accelerator.gradient_accumulation_steps)
    try:
        for epoch in range(plan.epochs):
            b_inds = np.random.permutation(plan.batch_size)
            for mini, start in enumerate(range(0, plan.batch_size, plan.size)):
                inds = b_inds[start:start + plan.size]
                weights = plan.weights(rollout, inds, accelerator)
                for j, (lo, hi) in enumerate(plan.spans):
                    last = j == len(plan.spans) - 1  # gradients stay local (no_sync) until the mini-batch's last
                    accelerator.gradient_state._set_sync_gradients(last)  # accelerate's optimizer steps only then
                    if deepspeed:
                        model.set_gradient_accumulation_boundary(last)
                    with contextlib.nullcontext() if last else accelerator.no_sync(model):
                        ptx_batch = steps.ptx_batch() if steps.ptx_batch is not None else None
                        out = steps.loss(model, rollout, inds[lo:hi], ptx_batch, kl_coef=kl_coef,
                                         token_normalizer=weights.token_normalizer)
                        loss = plan.weighted_loss(out, weights, j)
                        steps.observe(loss, "loss/total",
                                      where=f" (PPO epoch {epoch + 1}, mini-batch {mini + 1}, micro-batch {j + 1})")
                        accelerator.backward(loss if factor == 1.0 else loss * factor)
                    stats.record((epoch, mini, j), out)
                    del out, loss
                stats.optimizer_steps += bool(steps.step())
                steps.zero_grad()
                if steps.ptx_step is not None:
                    stats.ptx_losses.append(steps.ptx_step())
    finally:
        accelerator.gradient_state._set_sync_gradients(True)
    return stats


class GradientClip:
    """``max_grad_norm``: before every optimizer step, the gradients of every trained parameter (policy and value
    model together) are scaled so that their global L2 norm is at most ``max_norm`` (``accelerator.clip_grad_norm_``,
    HF Trainer's clip); 0 turns it off (no norm is computed). Under DeepSpeed the engine clips (its
    ``gradient_clipping``, set from ``max_grad_norm`` while the parent prepares it by
    :func:`trl_ext.runtime.engines.deepspeed_gradient_clipping`; a launch that fixes another value is refused by
    :func:`trl_ext.ppo.combination_rules.check_launch`) and its global norm is read back.

    One norm over policy and value: they are one module with one optimizer (TRL's ``PolicyAndValueWrapper``; on a
    shared base the value model is an adapter of the policy's model), DeepSpeed's engine can only clip that one norm,
    and it is HF Trainer's meaning of the key. ``metrics()`` is the pre-clip norm averaged over the update's steps
(``begin()`` starts an update).
    """

    def __init__(self, max_norm: float, accelerator, model):
        self.max_norm = float(max_norm or 0.0)
        self.accelerator = accelerator
        self.model = model
        self.norms: list[torch.Tensor] = []
        engine_clip = getattr(model, "gradient_clipping", None)  # a DeepSpeed engine's (0: off)
        if callable(engine_clip) and float(engine_clip() or 0.0) != self.max_norm:
            raise UserInputError(f"max_grad_norm: {max_norm} but DeepSpeed's engine clips at {engine_clip()}; set "
                                 "gradient_clipping in the DeepSpeed config to max_grad_norm")

    def begin(self) -> None:
        """A new update: forget the norms of the last one."""
        self.norms = []

    def __call__(self) -> None:
        """Clip the gradients about to be stepped with, and keep their pre-clip norm (no host synchronisation)."""
        if self.max_norm <= 0:
            return
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = self.accelerator.clip_grad_norm_(params, self.max_norm)
        if norm is not None:  # a tensor; DeepSpeed's engine may give a float
            self.norms.append(norm.detach().float() if torch.is_tensor(norm) else torch.tensor(float(norm)))

    def metrics(self) -> dict:
        """``policy/grad_norm``: the mean pre-clip norm of this update's optimizer steps (none when off or no step;
        :meth:`begin` starts an update)."""
        if not self.norms:
            return {}
        return {"policy/grad_norm": torch.stack([n.cpu() for n in self.norms]).mean().item()}
