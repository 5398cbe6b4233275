"""Configuration of :class:`trl_ext.SFTTrainer`: TRL's ``SFTConfig`` plus the non-finite policy."""

from dataclasses import dataclass

from trl import SFTConfig as _TRLSFTConfig

from ..runtime.nonfinite import NonFinitePolicyArgs

__all__ = ["SFTConfig"]


@dataclass
class SFTConfig(NonFinitePolicyArgs, _TRLSFTConfig):
    r"""Configuration for [`trl_ext.SFTTrainer`]: every field of TRL's `SFTConfig` with TRL's defaults, plus:

    Parameters:
        > Parameters that control NaN/inf losses and gradients (:mod:`trl_ext.runtime.nonfinite`)

        nonfinite_policy (`str`, *optional*, defaults to `"stop"`):
            `"stop"`: a NaN/inf loss or gradient stops training with a one-line error (CLI exit code 3), after saving
            the state before that step. `"skip"`: that optimizer step and its scheduler step are not taken, the skip
            is logged (`nonfinite/skipped_steps`, `nonfinite/consecutive_skips`), and training goes on. No step is
            ever taken on a non-finite loss or gradient. Under `fp16: true` the loss scaler's own overflow skips
            are logged as `nonfinite/scaler_skipped_steps` and are not failures.
        max_consecutive_nonfinite_skips (`int`, *optional*, defaults to `10`):
            With `"skip"`: the number of consecutive skipped steps after which the next non-finite one stops
            training with the error.
    """
