"""Configuration of :class:`trl_ext.SFTTrainer`: TRL's ``SFTConfig`` plus the non-finite policy."""

from dataclasses import dataclass

from trl import SFTConfig as _TRLSFTConfig

from ..field_rules import check_fields, check_steps
from ..runtime.nonfinite import NonFinitePolicyArgs

__all__ = ["SFTConfig"]


@dataclass
class SFTConfig(NonFinitePolicyArgs, _TRLSFTConfig):
    r"""Configuration for [`trl_ext.SFTTrainer`]: every field of TRL's `SFTConfig` with TRL's defaults, plus:

    Parameters:
        nonfinite_policy (`str`, *optional*, defaults to `"stop"`):
            NaN/inf loss or gradient: `"stop"` or `"skip"` the step (in full: :mod:`trl_ext.runtime.nonfinite`).
        max_consecutive_nonfinite_skips (`int`, *optional*, defaults to `10`):
            With `"skip"`: consecutive skipped steps allowed before training stops.
    """

    def __post_init__(self):
        check_fields(self)  # each field's range and choices (trl_ext.field_rules)
        check_steps(self)
        super().__post_init__()
