"""Guards against bad numbers: no optimizer step is ever taken on a NaN/inf loss or gradient. How it works:
docs/internals.md#nan-and-inf."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from ..errors import UserInputError

NonFinitePolicy = Literal["stop", "skip"]
NONFINITE_POLICIES = get_args(NonFinitePolicy)


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


def nonfinite_counts(tensor: torch.Tensor) -> torch.Tensor:
    """``[#NaN, #inf, #entries]`` of ``tensor`` as a device tensor (no host synchronisation)."""
    tensor = tensor.detach()
    return torch.stack([torch.isnan(tensor).sum(), torch.isinf(tensor).sum(),
                        torch.tensor(tensor.numel(), device=tensor.device)])


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


def check_policy(policy: str) -> None:
    """Raise a one-line :class:`UserInputError` unless ``policy`` is one of :data:`NONFINITE_POLICIES`."""
    if policy not in NONFINITE_POLICIES:
        raise UserInputError(f"nonfinite_policy: invalid choice {policy!r} (valid: one of "
                             f"{', '.join(NONFINITE_POLICIES)})")


@dataclass
class NonFinitePolicyArgs:
    """Config fields of the non-finite policy, mixed into every trl-ext config (SFT, reward, DPO, PPO).

    Parameters:
        nonfinite_policy (`str`, *optional*, defaults to `"stop"`):
            What a NaN/inf loss or gradient does. `"stop"`: training stops with a one-line error naming the step
            and the quantity (the CLI exits with code 3), after saving the state before that step. `"skip"`: that
            optimizer step and its scheduler step are not taken (the batch is dropped), the skip is counted and
            logged as `nonfinite/skipped_steps`, and training goes on; it stops with the same error only after
            `max_consecutive_nonfinite_skips` consecutive skipped steps. For PPO an update whose reward-model
            scores are NaN/inf is skipped whole. Either way, no step is ever taken on a non-finite loss or gradient.
            Under `skip` the counters `nonfinite/skipped_steps` and `nonfinite/consecutive_skips` are logged; under
            `fp16: true` the loss scaler's own overflow skips are logged as `nonfinite/scaler_skipped_steps` and
            are not failures.
        max_consecutive_nonfinite_skips (`int`, *optional*, defaults to `10`):
            With `nonfinite_policy="skip"`: how many optimizer steps in a row may be skipped before training stops
            (the next non-finite one stops it). The loss scaler's own skips under `fp16: true` do not count.
    """

    nonfinite_policy: NonFinitePolicy = field(
        default="stop",
        metadata={"help": "What a NaN/inf loss or gradient does: 'stop' (error, exit code 3) or 'skip' (no optimizer "
                          "or scheduler step for that batch, counted in nonfinite/skipped_steps)."},
    )
    max_consecutive_nonfinite_skips: int = field(
        default=10,
        metadata={"help": "With nonfinite_policy 'skip': consecutive skipped steps allowed before training stops."},
    )

    def __post_init__(self):
        # each field's choices and range: trl_ext.field_rules.check_fields, first thing in every trl-ext config
        from .engines import DEEPSPEED, launched_engine

        if self.nonfinite_policy == "skip" and launched_engine() == DEEPSPEED:
            raise UserInputError("nonfinite_policy: 'skip' is not available under DeepSpeed (its engine steps inside "
                                 "the backward pass, before the loss can be checked); use 'stop' (DeepSpeed's own "
                                 "fp16 loss scaler still skips overflowing steps)")
        super().__post_init__()


@dataclass
class Finding:
    """The first non-finite quantity of a step: its name, counts, unit and where (for :class:`NonFiniteError`)."""

    quantity: str
    counts: NonFiniteCounts
    unit: str
    where: str = ""


def gradients_of(optimizer) -> list[torch.Tensor]:
    """The gradients the optimizer would apply (``param.grad`` of every parameter of every group that has one); of a
    sharded (FSDP2 ``DTensor``) gradient, this process's shard (the counts are summed over processes)."""
    grads = (p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None)
    return [g.to_local() if hasattr(g, "to_local") else g for g in grads]


class StepGuard:
    """Checks one optimizer step's micro-batch losses and gradients with one host synchronisation, and applies the
    non-finite policy (see the module docstring).

    ``observe(loss, where)`` after each micro-batch (device side only); ``inspect(optimizer, accelerator)`` right
    before the optimizer step returns None (all finite) or the first :class:`Finding`; then ``apply(finding,
    on_stop)`` applies the policy and counts. Counters: ``skipped_steps`` (total), ``consecutive_skips``,
    ``scaler_skipped_steps`` (the fp16 loss scaler's own skips, counted by :func:`guarded_optimizer_step`).

    ``at_once=(accelerator, on_stop)`` checks each observed tensor at once instead (one synchronisation per call;
    ``on_stop(finding)`` raises): for DeepSpeed, whose engine steps inside the backward pass.

    Gradients are checked through their per-parameter norms (``torch._foreach_norm``, float32 accumulation, as
    ``torch.nn.utils.clip_grad_norm_`` computes them): a gradient with a NaN/inf entry has a NaN/inf norm. They are
    not checked while a loss scaler is active (it checks them itself) or when they are not held in ``param.grad``
    (DeepSpeed).
    """

    def __init__(self, policy: str = "stop", max_consecutive_skips: int = 10, at_once=None):
        check_policy(policy)
        self.policy = policy
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped_steps = 0
        self.consecutive_skips = 0
        self.scaler_skipped_steps = 0
        self.uses_scaler = False
        self.at_once = at_once
        self._observed: list[tuple[torch.Tensor, str, str, str]] = []

    def observe(self, tensor: torch.Tensor, quantity: str = "loss", unit: str = "processes", where: str = "") -> None:
        """Record ``tensor``'s NaN/inf counts for the coming optimizer step (no host synchronisation)."""
        self._observed.append((nonfinite_counts(tensor), quantity, unit, where))
        if self.at_once is not None:
            accelerator, on_stop = self.at_once
            finding = self.inspect(accelerator=accelerator)
            if finding is not None:
                on_stop(finding)

    def inspect(self, optimizer=None, accelerator=None, check_gradients: bool = True) -> Finding | None:
        """The first non-finite observed quantity (then the gradients) since the last call, over all processes;
        None if all are finite. One host synchronisation; a collective under several processes (call it on all)."""
        observed, self._observed = self._observed, []
        rows = [counts for counts, *_ in observed]
        grads = gradients_of(optimizer) if (optimizer is not None and check_gradients) else []
        if grads:
            norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).to(rows[0].device if rows
                                                                                         else grads[0].device)
            rows.append(nonfinite_counts(norms))
        if not rows:
            return None
        table = torch.stack(rows)
        if accelerator is not None and accelerator.num_processes > 1:
            table = accelerator.reduce(table.to(accelerator.device), reduction="sum")
        for i, (nan, inf, total) in enumerate(table.tolist()):  # the one host synchronisation
            if nan or inf:
                if i < len(observed):
                    _, quantity, unit, where = observed[i]
                    return Finding(quantity, NonFiniteCounts(nan, inf, total), unit, where)
                return Finding("grad_norm", NonFiniteCounts(nan, inf, total), "parameters")
        return None

    def decide(self, finding: Finding | None) -> bool:
        """Count ``finding``; True: take the step (nothing non-finite), False: skip it."""
        if finding is None:
            self.consecutive_skips = 0
            return True
        self.skipped_steps += 1
        self.consecutive_skips += 1
        return False

    def apply(self, finding: Finding | None, on_stop) -> bool:
        """The policy for ``finding``: ``on_stop(finding)`` (which raises) if it ends training, else whether to take
        the step (:meth:`decide`)."""
        if self.must_stop(finding):
            on_stop(finding)
        return self.decide(finding)

    def must_stop(self, finding: Finding | None) -> bool:
        """Whether ``finding`` ends training: always under ``stop``; under ``skip`` once the step would be the
        ``max_consecutive_skips + 1``-th skipped step in a row."""
        if finding is None:
            return False
        return self.policy == "stop" or self.consecutive_skips >= self.max_consecutive_skips

    def stop_note(self) -> str:
        """What the error adds under ``skip``: how many steps in a row were skipped before this one."""
        if self.policy != "skip":
            return ""
        return f" (after {self.consecutive_skips} consecutive skipped steps, max_consecutive_nonfinite_skips)"

    def metrics(self) -> dict:
        """``nonfinite/*`` metrics (cumulative counts), when the policy is ``skip`` or a loss scaler is active."""
        out = {}
        if self.policy == "skip":
            out["nonfinite/skipped_steps"] = self.skipped_steps
            out["nonfinite/consecutive_skips"] = self.consecutive_skips
        if self.uses_scaler:
            out["nonfinite/scaler_skipped_steps"] = self.scaler_skipped_steps
        return out


def guarded_optimizer_step(guard: StepGuard, optimizer, accelerator, on_stop, closure=None, before_step=None) -> bool:
    """One optimizer step under ``guard``; returns False if the guard skipped it, True if it went to the optimizer
    (under ``fp16`` the loss scaler may still skip it: counted in ``guard.scaler_skipped_steps``, as TRL's loop
    counts such a step as taken).

    ``optimizer`` is accelerate's ``AcceleratedOptimizer`` (its ``step`` only steps at the end of a gradient
    accumulation cycle, and under ``fp16`` goes through the loss scaler). Off the accumulation boundary nothing is
    checked. On it: ``guard.inspect`` (one synchronisation); a finding calls ``on_stop(finding)`` (which raises
    :class:`NonFiniteError`) when the policy says stop, else the step is skipped: no ``optimizer.step``, and
    accelerate's ``step_was_skipped`` reads True, so that HF ``Trainer`` does not step the LR scheduler either (as
    after a loss-scaler skip). The caller zeroes the gradients, as after every step.

    ``before_step()`` (gradient clipping) runs on a step that is taken, after the check and right before
    ``optimizer.step``: it sees finite gradients (or, under ``fp16``, unscales them itself and leaves the overflow
    check to the loss scaler).
    """
    if not accelerator.sync_gradients:
        optimizer.step(closure) if closure is not None else optimizer.step()
        return False
    scaler = getattr(optimizer, "scaler", None)
    guard.uses_scaler = scaler is not None
    if not guard.apply(guard.inspect(optimizer, accelerator, check_gradients=scaler is None), on_stop):
        if scaler is not None:  # forget this step's `unscale_` (HF's gradient clipping ran it), keep the scale
            scaler.update(scaler.get_scale())
        optimizer._is_overflow = True  # accelerate's `step_was_skipped`: HF Trainer then leaves the scheduler alone
        return False
    if before_step is not None:
        before_step()
    optimizer.step(closure) if closure is not None else optimizer.step()
    if scaler is None:
        if hasattr(optimizer, "_is_overflow"):
            optimizer._is_overflow = False
        return True
    if getattr(optimizer, "step_was_skipped", False):
        guard.scaler_skipped_steps += 1
    return True


class NonFiniteLossGuardMixin:
    """Mixin for HF ``Trainer`` subclasses (SFT, reward, DPO): the non-finite policy of :mod:`this module
    <trl_ext.runtime.nonfinite>`, checked once per optimizer step.

    Each micro-batch's loss is recorded (no synchronisation) after its backward; the optimizer step (accelerate's
    optimizer, whose ``step`` this mixin wraps when training starts) first checks the recorded losses and the
    gradients. Under ``stop`` a NaN/inf one raises :class:`NonFiniteError` (``step N: loss contains NaN (...)``),
    after saving the weights and optimizer before the step as ``checkpoint-N`` (N = completed steps; resuming replays
    the failing step's batches; HF's ``logging_nan_inf_filter`` only hides such losses from the logs). Under
    ``skip`` the step and its scheduler step are not taken and the skip is logged (``nonfinite/skipped_steps``);
    ``global_step`` still advances, as after a loss-scaler skip. Needs
    :class:`trl_ext.runtime.checkpoints.AtomicCheckpointMixin` (for ``last_checkpoint``). Configs without the
    policy fields (plain TRL configs) get ``stop``. DeepSpeed steps inside its backward, so there the loss is
    checked after each micro-batch as before and only ``stop`` is available.
    """

    @property
    def step_guard(self) -> StepGuard:
        guard = self.__dict__.get("_step_guard")
        if guard is None:
            guard = StepGuard(getattr(self.args, "nonfinite_policy", "stop"),
                              getattr(self.args, "max_consecutive_nonfinite_skips", 10))
            self.__dict__["_step_guard"] = guard
        return guard

    def training_step(self, model, inputs, *args, **kwargs):
        loss = super().training_step(model, inputs, *args, **kwargs)
        guard = self.step_guard
        if getattr(self, "is_deepspeed_enabled", False):  # the engine steps in the backward: check each loss
            guard.at_once = (self.accelerator, self._stop_on_nonfinite)
        else:
            self._wrap_optimizer_step()
        guard.observe(loss)
        return loss

    def _wrap_optimizer_step(self) -> None:
        optimizer = self.optimizer
        if getattr(optimizer, "_trl_ext_guarded", False):
            return
        original = optimizer.step

        @functools.wraps(original)  # keeps torch's LR-scheduler marker (`_wrapped_by_lr_sched`)
        def step(closure=None):
            guarded_optimizer_step(self.step_guard, _Unwrapped(optimizer, original), self.accelerator,
                                   self._stop_on_nonfinite, closure)

        optimizer.step = step
        optimizer._trl_ext_guarded = True

    def _stop_on_nonfinite(self, finding: Finding) -> None:
        self._save_checkpoint(self.model, trial=None)
        raise NonFiniteError(self.state.global_step + 1, finding.quantity, finding.counts, finding.unit,
                             self.last_checkpoint, saved=True, where=finding.where + self.step_guard.stop_note(),
                             step_kind="step")

    def log(self, logs: dict, *args, **kwargs):
        if "loss" in logs:  # training logs: the nonfinite/* counters (only under `skip` or with a loss scaler)
            logs = {**logs, **self.step_guard.metrics()}
        return super().log(logs, *args, **kwargs)


class _Unwrapped:
    """``optimizer`` seen through its original ``step`` (the instance attribute is the guarded one)."""

    def __init__(self, optimizer, step):
        self.__dict__.update(_optimizer=optimizer, step=step)

    def __getattr__(self, name):
        return getattr(self.__dict__["_optimizer"], name)

    def __setattr__(self, name, value):
        setattr(self.__dict__["_optimizer"], name, value)
