"""Guards against bad numbers: stop training with a clear error instead of training on NaN/inf."""

from __future__ import annotations

import torch


class NonFiniteCounts:
    """How many entries of a tensor are NaN, +-inf, and in all (summed over processes when gathered)."""

    def __init__(self, nan: int, inf: int, total: int):
        self.nan, self.inf, self.total = int(nan), int(inf), int(total)

    @property
    def ok(self) -> bool:
        return self.nan == 0 and self.inf == 0

    def describe(self, unit: str) -> str:
        parts = []
        if self.nan:
            parts.append(f"NaN ({self.nan} of {self.total} {unit})")
        if self.inf:
            parts.append(f"inf ({self.inf} of {self.total} {unit})")
        return " and ".join(parts)


class NonFiniteError(FloatingPointError):
    """A quantity that training depends on contains NaN or inf.

    The message names the update, the quantity (TRL-style metric name) and how many entries are bad, e.g.
    ``update 3: objective/scores contains NaN (2 of 4 rollouts)``, then where the last good state is.

    Attributes:
        update: the (1-based) PPO update (or optimizer step, for the reward and DPO trainers) in which it happened.
        quantity: the name of the quantity (``objective/scores``, ``loss/total``, ``loss/ptx``).
        checkpoint: the checkpoint to resume from once the cause is fixed, or None if there is none.
        saved: True if ``checkpoint`` was written just now and holds the state before the failing update; False
            if the update had already stepped the optimizer (``checkpoint`` is then the latest earlier one).
    """

    def __init__(self, update: int, quantity: str, counts: NonFiniteCounts, unit: str, checkpoint: str | None,
                 saved: bool = False, where: str = "", step_kind: str = "update"):
        self.update = update
        self.quantity = quantity
        self.counts = counts
        self.checkpoint = checkpoint
        self.saved = saved
        if saved:
            tail = f"the state before this {step_kind} is saved in {checkpoint}"
        elif checkpoint:
            tail = f"weights had already changed in this {step_kind}; latest complete checkpoint: {checkpoint}"
        else:
            tail = f"weights had already changed in this {step_kind} and there is no complete checkpoint"
        super().__init__(f"{step_kind} {update}: {quantity} contains {counts.describe(unit)}{where}; {tail}")


def count_nonfinite(tensor: torch.Tensor, accelerator=None) -> NonFiniteCounts:
    """Count NaN and infinite entries of ``tensor``; with ``accelerator`` and several processes, over all of them.

    Every process must call it at the same point (it is a collective then), so that all processes agree and stop
    together instead of one process leaving the others waiting in the next collective.
    """
    tensor = tensor.detach()
    counts = torch.tensor(
        [torch.isnan(tensor).sum().item(), torch.isinf(tensor).sum().item(), tensor.numel()], dtype=torch.long
    )
    if accelerator is not None and accelerator.num_processes > 1:
        counts = accelerator.reduce(counts.to(accelerator.device), reduction="sum").cpu()
    return NonFiniteCounts(*counts.tolist())


class NonFiniteLossGuardMixin:
    """Mixin for HF ``Trainer`` subclasses (SFT, reward, DPO): a NaN/inf training loss stops training with
    :class:`NonFiniteError` (``step N: loss contains NaN (...)``) instead of being trained on (HF's
    ``logging_nan_inf_filter`` only hides such losses from the logs).

    The loss is checked after each micro-batch's backward and before the optimizer step, so the weights and the
    optimizer are still those before the failing step: they are saved as ``checkpoint-N`` (N = completed steps;
    resuming replays the failing step's batches) before the error is raised. Needs
    :class:`trl_ext.runtime.checkpoints.AtomicCheckpointMixin` (for ``last_checkpoint``).
    """

    def training_step(self, model, inputs, *args, **kwargs):
        loss = super().training_step(model, inputs, *args, **kwargs)
        counts = count_nonfinite(loss, self.accelerator)
        if not counts.ok:
            self._save_checkpoint(self.model, trial=None)
            raise NonFiniteError(self.state.global_step + 1, "loss", counts, "processes", self.last_checkpoint,
                                 saved=True, step_kind="step")
        return loss
