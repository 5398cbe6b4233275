"""Graceful interruption: SIGTERM or Ctrl-C (SIGINT) stops training at the next safe point with a checkpoint. How it
works: docs/internals.md#interruption."""

from __future__ import annotations

import signal
import threading
import warnings
from contextlib import contextmanager

import torch
from transformers import TrainerCallback

WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """Training stopped on a signal after saving a checkpoint.

    Attributes:
        signal_name: ``"SIGINT"`` or ``"SIGTERM"``.
        checkpoint: path of the checkpoint written at the stop (resume from it).
        step: the trainer's ``global_step`` at the stop.
        exit_code: 128 + the signal number (130 for SIGINT, 143 for SIGTERM).
    """

    def __init__(self, signum: int, checkpoint: str | None, step: int):
        self.signum = int(signum)
        self.signal_name = signal.Signals(signum).name
        self.checkpoint = checkpoint
        self.step = step
        self.exit_code = 128 + self.signum
        where = f"checkpoint saved to {checkpoint}" if checkpoint else "no checkpoint could be saved"
        super().__init__(
            f"training interrupted by {self.signal_name} at step {step}; {where}; "
            "resume with resume_from_checkpoint=true (CLI: --resume_from_checkpoint true)"
        )


class SignalWatcher:
    """Records SIGINT/SIGTERM instead of acting on them, between :meth:`install` and :meth:`uninstall`.

    Only the main thread can install signal handlers; elsewhere :meth:`install` warns and does nothing (signals keep
    their usual effect). ``signum`` is the first signal received (or None).
    """

    def __init__(self, signals=WATCHED_SIGNALS):
        self.signals = tuple(signals)
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def received(self) -> bool:
        return self.signum is not None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            warnings.warn("trl-ext: not in the main thread; SIGINT/SIGTERM will not save a checkpoint", stacklevel=2)
            return
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
            return
        # second signal: behave as if we were not here
        previous = self._previous.get(signum, signal.SIG_DFL)
        self.uninstall()
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            signal.raise_signal(signum)  # its default action, now: ends the process before this returns


class InterruptionCallback(TrainerCallback):
    """At each step end, if any process received a watched signal: save a checkpoint and stop training.

    ``accelerator`` (optional) makes the decision collective: the signal numbers are gathered and the largest wins, so
    every rank stops after the same step (one tiny all-gather per step, only when there are several processes).
    ``signum`` holds the agreed signal after the stop was requested.
    """

    def __init__(self, watcher: SignalWatcher, accelerator=None):
        self.watcher = watcher
        self.accelerator = accelerator
        self.signum: int | None = None

    def pending_signal(self) -> int | None:
        """The signal this or any other process received (None if none), agreed on by every process."""
        local = self.watcher.signum or 0
        accelerator = self.accelerator
        if accelerator is not None and accelerator.num_processes > 1:
            flag = torch.tensor([local], device=accelerator.device, dtype=torch.long)
            local = int(accelerator.gather(flag).max().item())
        return local or None

    def on_step_end(self, args, state, control, **kwargs):
        if self.signum is None:
            signum = self.pending_signal()
            if signum:
                self.signum = signum
        if self.signum is not None:
            control.should_save = True
            control.should_training_stop = True
        return control


@contextmanager
def watch_signals(trainer):
    """Within this context, SIGINT/SIGTERM make ``trainer`` save and stop at the next step end.

    Yields the :class:`InterruptionCallback` (its ``signum`` says whether the stop happened). The callback is added
    to the trainer for the duration and removed afterwards; the previous signal handlers are restored.
    """
    watcher = SignalWatcher()
    callback = InterruptionCallback(watcher, getattr(trainer, "accelerator", None))
    trainer.add_callback(callback)
    watcher.install()
    try:
        yield callback
    finally:
        watcher.uninstall()
        trainer.remove_callback(callback)
        if watcher.received and callback.signum is None:
            warnings.warn(
                f"trl-ext: {signal.Signals(watcher.signum).name} arrived after the last step; training had finished",
                stacklevel=3,
            )


def raise_if_interrupted(trainer, callback: InterruptionCallback) -> None:
    """Raise :class:`TrainingInterrupted` if ``callback`` stopped ``trainer`` (after its checkpoint was saved)."""
    if callback.signum is not None:
        raise TrainingInterrupted(callback.signum, getattr(trainer, "last_checkpoint", None), trainer.state.global_step)


class InterruptibleTrainMixin:
    """Mixin for HF ``Trainer`` subclasses (SFT, reward, DPO): ``train()`` saves and raises on SIGINT/SIGTERM.

    ``train(resume_from_checkpoint=True)`` resumes from the latest *complete* checkpoint (see
    :func:`trl_ext.runtime.checkpoints.resolve_checkpoint`). Combine with :class:`trl_ext.runtime.checkpoints.AtomicCheckpointMixin`.
    """

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        from .checkpoints import resolve_checkpoint

        checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        with watch_signals(self) as callback:
            output = super().train(checkpoint, *args, **kwargs)
        raise_if_interrupted(self, callback)
        return output
