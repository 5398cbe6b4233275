"""DPO trainer: TRL's `DPOTrainer` with extensions."""

from trl import DPOTrainer as _TRLDPOTrainer

from ..models.dtypes import KeepLoadedDtypesMixin
from ..runtime.checkpoints import AtomicCheckpointMixin
from ..runtime.interruption import InterruptibleTrainMixin
from ..runtime.nonfinite import NonFiniteLossGuardMixin
from .losses import robust_label_smoothing_for_cdpo


class DPOTrainer(
    InterruptibleTrainMixin, NonFiniteLossGuardMixin, AtomicCheckpointMixin, KeepLoadedDtypesMixin, _TRLDPOTrainer
):
    """[`trl.DPOTrainer`] with trl-ext's extensions.

    `label_smoothing > 0` with the default `sigmoid` loss trains conservative DPO (cDPO, see
    :func:`trl_ext.preference.losses.cdpo_loss`); TRL 1.12 silently ignores the value there. Every other loss type
    runs TRL's code unchanged. cDPO runs through TRL's own loss code: cDPO with `eps` is exactly TRL's `robust`
    loss with flip rate `-eps / (1 - 2 eps)` (derivation in
    :func:`trl_ext.preference.losses.robust_label_smoothing_for_cdpo`), so the trainer swaps the loss type and the
    value after TRL's initialisation and keeps all of TRL's logging, reference handling and metrics.

    Reliability (:mod:`trl_ext.runtime.checkpoints`, :mod:`trl_ext.runtime.interruption`): checkpoints are written atomically;
    `train(resume_from_checkpoint=True)` takes the latest complete one; SIGINT/SIGTERM save a checkpoint at the end
    of the current optimizer step and raise :class:`trl_ext.runtime.interruption.TrainingInterrupted`; a NaN/inf loss
    or gradient raises :class:`trl_ext.runtime.nonfinite.NonFiniteError` after saving the state before the step, or
    with `nonfinite_policy="skip"` skips that step (:mod:`trl_ext.runtime.nonfinite`).

    Parameter dtypes stay as loaded (:class:`trl_ext.models.dtypes.KeepLoadedDtypesMixin`): TRL casts the trainable
    parameters of a quantized model to bfloat16, trl-ext keeps them float32; with `fp16` every trainable parameter
    is float32.
    """

    def __init__(self, model=None, *args, **kwargs):
        super().__init__(model, *args, **kwargs)
        if self.args.label_smoothing > 0.0 and "sigmoid" in self.loss_types:
            # DPOConfig guarantees that no other loss type reads label_smoothing in this case.
            self.loss_types = ["robust" if t == "sigmoid" else t for t in self.loss_types]
            self.label_smoothing = robust_label_smoothing_for_cdpo(self.args.label_smoothing)
