"""SFT trainer: TRL's `SFTTrainer` with trl-ext's atomic checkpoints, interruption handling and NaN-loss guard."""

from trl import SFTTrainer as _TRLSFTTrainer

from ..models.dtypes import KeepLoadedDtypesMixin
from ..runtime.checkpoints import AtomicCheckpointMixin
from ..runtime.interruption import InterruptibleTrainMixin
from ..runtime.nonfinite import NonFiniteLossGuardMixin
from .config import SFTConfig

__all__ = ["SFTConfig", "SFTTrainer"]


class SFTTrainer(
    InterruptibleTrainMixin, NonFiniteLossGuardMixin, AtomicCheckpointMixin, KeepLoadedDtypesMixin, _TRLSFTTrainer
):
    """[`trl.SFTTrainer`] with the run safety of trl-ext's other trainers; the numbers are TRL's.

    Takes TRL's arguments, datasets (`text`, `messages`, `prompt`/`completion`, tokenized `input_ids`) and config
    (`trl.SFTConfig`, or `trl_ext.SFTConfig`: TRL's plus `nonfinite_policy`) unchanged, and changes no loss, metric or
    data step: with the same seed it logs exactly what `trl.SFTTrainer` logs (tested). What it adds
    (:mod:`trl_ext.runtime.checkpoints`, :mod:`trl_ext.runtime.interruption`, :mod:`trl_ext.runtime.nonfinite`):
    checkpoints are written atomically; `train(resume_from_checkpoint=True)` takes the latest complete one;
    SIGINT/SIGTERM save a checkpoint at the end of the current optimizer step and raise
    :class:`trl_ext.runtime.interruption.TrainingInterrupted`; a NaN/inf loss or gradient raises
    :class:`trl_ext.runtime.nonfinite.NonFiniteError` after saving the state before the step, or with
    `nonfinite_policy="skip"` skips that step (:mod:`trl_ext.runtime.nonfinite`).

    Parameter dtypes stay as loaded (:class:`trl_ext.models.dtypes.KeepLoadedDtypesMixin`): TRL casts the trainable
    parameters of a quantized model to bfloat16, trl-ext keeps them float32; with `fp16` every trainable parameter
    is float32.
    """
