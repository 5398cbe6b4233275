"""The PPO epochs of :meth:`trl_ext.PPOTrainer.optimize`: one optimizer step per mini-batch, always.

Each update runs ``num_ppo_epochs`` passes over the rollout, each in a fresh ``np.random.permutation`` (the numpy RNG
order of TRL's PPO), cut into ``num_mini_batches`` mini-batches of ``local_mini_batch_size`` sequences. Each
mini-batch is one optimizer step: its micro-batches run forward/backward with their gradients accumulated
(``no_sync`` under DDP on all but the last), then the trainer's ``optimizer_step`` checks the step's losses and
gradients, clips the gradients to ``max_grad_norm`` (:class:`GradientClip`) and steps. So an update takes
``num_ppo_epochs * num_mini_batches`` optimizer steps whatever ``gradient_accumulation_steps``,
``train_micro_batch_size``, the number of processes or the engine.

The micro-batches (:class:`MiniBatchPlan`): of ``train_micro_batch_size`` sequences when it is set, each loss term
weighted by its share of the mini-batch (:func:`trl_ext.ppo.micro_batches.micro_batch_weights`); unset, of
``per_device_train_batch_size``, each micro-batch's loss as TRL computes it (its own means) and the mini-batch's
gradient the mean over its ``n`` micro-batches. Every loss goes to ``accelerator.backward`` times
``gradient_accumulation_steps`` (which accelerate, or DeepSpeed's engine, divides it by): unset, a micro-batch's loss
times ``gradient_accumulation_steps / n``, which is 1 (TRL's arithmetic, bit for bit) when a mini-batch holds
``gradient_accumulation_steps`` micro-batches, i.e. with one mini-batch per update.

TRL's PPO steps through ``accelerator.accumulate`` instead, every ``gradient_accumulation_steps`` micro-batches
whatever the mini-batch boundaries, and on every micro-batch of an update in which accelerate's most recent
DataLoader is at its last batch (``sync_with_dataloader``). Its counts agree with this loop's when
``gradient_accumulation_steps`` is 1, or with one mini-batch per update outside those epoch-end updates
(``docs/ppo.md`` lists where they differ). Under DeepSpeed the engine is told where each mini-batch ends
(``set_gradient_accumulation_boundary``) instead of counting ``gradient_accumulation_steps`` micro-steps itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import UserInputError
from .micro_batches import MicroBatchWeights, micro_batch_weights, resolve_train_micro_batch
from .objective.objectives import mini_batch_token_normalizer
from .rollout import UpdateStats

__all__ = ["GradientClip", "MiniBatchPlan", "run_ppo_epochs"]


@dataclass(frozen=True)
class MiniBatchPlan:
    """How one mini-batch of ``size`` sequences is cut: ``spans`` (``(start, end)`` positions in the mini-batch) and
    whether the micro-batches are ``train_micro_batch_size``'s (``weighted``: loss terms by their share) or
    ``per_device_train_batch_size``'s (TRL's per-micro-batch losses)."""

    size: int
    spans: tuple[tuple[int, int], ...]
    weighted: bool

    @classmethod
    def for_trainer(cls, trainer) -> "MiniBatchPlan":
        args = trainer.args
        weighted = args.train_micro_batch_size is not None
        micro = resolve_train_micro_batch(trainer) if weighted else args.per_device_train_batch_size
        size = args.local_mini_batch_size
        return cls(size, tuple((lo, min(lo + micro, size)) for lo in range(0, size, micro)), weighted)

    def weights(self, trainer, rollout, inds) -> MicroBatchWeights:
        """The loss weights of mini-batch ``inds`` (:class:`~trl_ext.ppo.micro_batches.MicroBatchWeights`)."""
        accelerator, objective = trainer.accelerator, trainer.objective
        if self.weighted:
            return micro_batch_weights(rollout, inds, self.spans, objective, accelerator)
        n = len(self.spans)  # unset: each micro-batch's own loss, 1/n of the mini-batch's gradient
        return MicroBatchWeights([1.0] * n, [1.0] * n, 1.0,
                                 mini_batch_token_normalizer(objective, rollout, inds, n, accelerator))

    def loss_factor(self, scale: int) -> float:
        """What every loss is multiplied by before ``accelerator.backward`` (which divides by ``scale``, the
        accelerator's ``gradient_accumulation_steps``): ``scale`` with weighted terms, else ``scale / n``."""
        return float(scale) if self.weighted else scale / len(self.spans)


def weighted_loss(out, weights: MicroBatchWeights, j: int, args) -> torch.Tensor:
    """Micro-batch ``j``'s loss with each term at its weight (``out.loss`` = policy terms + ``vf_coef`` * value loss
    (+ ``ptx_coef`` * ptx loss))."""
    w = weights.policy[j]
    if w == weights.value[j] and (out.ptx_loss is None or w == weights.ptx):
        return out.loss if w == 1.0 else out.loss * w
    loss = out.loss * w + args.vf_coef * out.value.loss * (weights.value[j] - w)
    if out.ptx_loss is not None:
        loss = loss + args.ptx_coef * out.ptx_loss * (weights.ptx - w)
    return loss


def run_ppo_epochs(trainer, rollout) -> UpdateStats:
    """The PPO epochs of one update (module docstring); the per-micro-batch statistics, indexed ``[PPO epoch,
    mini-batch, micro-batch]``."""
    args, accelerator = trainer.args, trainer.accelerator
    plan = MiniBatchPlan.for_trainer(trainer)
    stats = UpdateStats((args.num_ppo_epochs, args.num_mini_batches, len(plan.spans)), accelerator.device)
    factor = plan.loss_factor(accelerator.gradient_accumulation_steps)
    kl_coef = float(trainer.kl_ctl.value)  # the update's (the controller moves after it)
    try:
        for epoch in range(args.num_ppo_epochs):
            b_inds = np.random.permutation(args.local_batch_size)
            for mini, start in enumerate(range(0, args.local_batch_size, plan.size)):
                inds = b_inds[start:start + plan.size]
                weights = plan.weights(trainer, rollout, inds)
                for j, (lo, hi) in enumerate(plan.spans):
                    out = micro_batch_backward(trainer, rollout, inds[lo:hi], weights, j, kl_coef, factor,
                                               last=j == len(plan.spans) - 1,
                                               where=f" (PPO epoch {epoch + 1}, mini-batch {mini + 1}, "
                                                     f"micro-batch {j + 1})")
                    stats.record((epoch, mini, j), out)
                    del out
                step_mini_batch(trainer, stats)
    finally:
        accelerator.gradient_state._set_sync_gradients(True)
    return stats


def micro_batch_backward(trainer, rollout, inds, weights, j, kl_coef, factor, *, last, where):
    """Forward and backward of one micro-batch: gradients kept local (``no_sync``) unless it is the mini-batch's
    ``last``, which also tells DeepSpeed's engine that the accumulation ends here. Returns the micro-batch's
    :class:`~trl_ext.ppo.rollout.MicroBatchOutput`."""
    accelerator, model, args = trainer.accelerator, trainer.model, trainer.args
    accelerator.gradient_state._set_sync_gradients(last)  # accelerate's optimizer steps (and DeepSpeed's) only then
    if trainer.is_deepspeed_enabled:
        model.set_gradient_accumulation_boundary(last)
    with contextlib.nullcontext() if last else accelerator.no_sync(model):
        joint_ptx = trainer.ptx is not None and trainer.ptx.mode == "joint" and not trainer.policy_held
        ptx_batch = trainer.next_ptx_batch() if joint_ptx else None
        out = trainer.compute_micro_batch_loss(model, rollout, inds, ptx_batch, kl_coef=kl_coef,
                                               token_normalizer=weights.token_normalizer)
        loss = weighted_loss(out, weights, j, args)
        trainer.step_guard.observe(loss, "loss/total", where=where)
        accelerator.backward(loss if factor == 1.0 else loss * factor)
    return out


def step_mini_batch(trainer, stats: UpdateStats) -> None:
    """The mini-batch's optimizer step (``trainer.optimizer_step``: checked, clipped), then, with
    ``ptx_mode="separate"``, the separate ptx step (none while ``critic_warmup`` holds the policy)."""
    if trainer.optimizer_step():
        trainer._optimizer_stepped = True
    trainer.optimizer.zero_grad()
    if trainer.ptx is not None and trainer.ptx.mode == "separate" and not trainer.policy_held:
        stats.ptx_losses.append(trainer.ptx_step())


class GradientClip:
    """``max_grad_norm``: before every optimizer step, the gradients of every trained parameter (policy and value
    model together) are scaled so that their global L2 norm is at most ``max_norm`` (``accelerator.clip_grad_norm_``,
    HF Trainer's clip); 0 turns it off (no norm is computed). Under DeepSpeed the engine clips (its
    ``gradient_clipping``, set from ``max_grad_norm`` by :func:`trl_ext.ppo.config_rules.check_launch`) and its global
    norm is read back.

    One norm over policy and value: they are one module with one optimizer (TRL's ``PolicyAndValueWrapper``; on a
    shared base the value model is an adapter of the policy's model), DeepSpeed's engine can only clip that one norm,
    and it is HF Trainer's meaning of the key. ``metrics()`` is the pre-clip norm averaged over the update's steps.
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

    def __call__(self) -> None:
        """Clip the gradients about to be stepped with, and keep their pre-clip norm (no host synchronisation)."""
        if self.max_norm <= 0:
            return
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = self.accelerator.clip_grad_norm_(params, self.max_norm)
        if norm is not None:  # a tensor; DeepSpeed's engine may give a float
            self.norms.append(norm.detach().float() if torch.is_tensor(norm) else torch.tensor(float(norm)))

    def metrics(self) -> dict:
        """``policy/grad_norm``: the mean pre-clip norm of this update's optimizer steps (none when off or no step);
        resets for the next update."""
        norms, self.norms = self.norms, []
        if not norms:
            return {}
        return {"policy/grad_norm": torch.stack([n.cpu() for n in norms]).mean().item()}
