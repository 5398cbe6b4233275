"""Configuration of :class:`trl_ext.DPOConfig`."""

from dataclasses import dataclass

from trl import DPOConfig as _TRLDPOConfig

from ..field_rules import check_fields, check_steps, help_from_docstring
from ..errors import UserInputError
from ..runtime.engines import EngineOnCPUArgsMixin
from ..runtime.nonfinite import NonFinitePolicyArgs

#: Loss types for which `label_smoothing` means something: cDPO for `sigmoid` (trl-ext), TRL's own meaning for
#: the others.
LABEL_SMOOTHING_LOSS_TYPES = ("sigmoid", "robust", "exo_pair", "aot", "aot_unpaired")


@help_from_docstring
@dataclass
class DPOConfig(EngineOnCPUArgsMixin, NonFinitePolicyArgs, _TRLDPOConfig):
    r"""Configuration for [`trl_ext.DPOTrainer`]: every field of TRL's `DPOConfig`; one field changes meaning.

    Parameters:
        label_smoothing (`float`, *optional*, defaults to `0.0`):
            Probability that a preference label is wrong. With the default `loss_type="sigmoid"` it turns DPO into
            conservative DPO (cDPO): `-(1 - eps) * logsigmoid(beta * d) - eps * logsigmoid(-beta * d)` (TRL ignores
            it there). For `robust`, `exo_pair`, `aot` and `aot_unpaired` it keeps TRL's meaning and numbers. Must
            lie in `[0.0, 0.5)`; a non-zero value with only loss types that do not use it is an error. `sigmoid`
            cannot be combined with another label-smoothing loss type while `label_smoothing > 0` (they would need
            different meanings of the one value).

        nonfinite_policy (`str`, *optional*, defaults to `"stop"`):
            NaN/inf loss or gradient: `"stop"` or `"skip"` the step (in full: :mod:`trl_ext.runtime.nonfinite`).
        max_consecutive_nonfinite_skips (`int`, *optional*, defaults to `10`):
            With `"skip"`: consecutive skipped steps allowed before training stops.
    """

    label_smoothing: float = 0.0  # its range, [0, 0.5): trl_ext.field_rules.RANGES

    def __post_init__(self):
        check_fields(self)  # each field's range and choices (trl_ext.field_rules)
        check_steps(self)
        super().__post_init__()
        eps = self.label_smoothing
        if eps > 0.0:
            users = [t for t in self.loss_type if t in LABEL_SMOOTHING_LOSS_TYPES]
            if not users:
                raise UserInputError(
                    f"label_smoothing={eps} has no effect with loss_type={self.loss_type}: only "
                    f"{list(LABEL_SMOOTHING_LOSS_TYPES)} use it; set label_smoothing=0.0 or change loss_type"
                )
            if "sigmoid" in users and len(users) > 1:
                raise UserInputError(
                    f"label_smoothing={eps} with loss_type={self.loss_type}: `sigmoid` (cDPO) cannot be combined with "
                    f"{[t for t in users if t != 'sigmoid']} under one label_smoothing value; use one of them"
                )
            if "sigmoid" in users and self.use_liger_kernel:
                raise UserInputError(
                    "label_smoothing > 0 with loss_type 'sigmoid' (cDPO) is not supported with use_liger_kernel=True; "
                    "set use_liger_kernel=False"
                )
