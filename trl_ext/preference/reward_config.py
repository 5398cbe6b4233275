"""Configuration of :class:`trl_ext.RewardTrainer`."""

from dataclasses import dataclass

from trl import RewardConfig as _TRLRewardConfig

from ..field_rules import check_fields, check_steps, help_from_docstring
from ..runtime.engines import EngineOnCPUArgsMixin
from ..runtime.nonfinite import NonFinitePolicyArgs


@help_from_docstring
@dataclass
class RewardConfig(EngineOnCPUArgsMixin, NonFinitePolicyArgs, _TRLRewardConfig):
    r"""Configuration for [`trl_ext.RewardTrainer`]: every field of TRL's `RewardConfig`, plus the extensions
    below (all of them default to TRL's behaviour).

    Parameters:
        > Parameters that control the loss

        label_smoothing (`float`, *optional*, defaults to `0.0`):
            Probability that a preference label is wrong. Each pair contributes
            `-(1 - eps) * logsigmoid(d) - eps * logsigmoid(-d)` with `d = r_better - r_worse - margin` (the cDPO
            smoothing applied to the reward difference). Must lie in `[0.0, 0.5)`; `0.0` is TRL's loss.

        > Parameters that control reward centering

        center_rewards_after_training (`bool`, *optional*, defaults to `False`):
            After training, compute the mean reward on a reference dataset (the `center_rewards_dataset` argument of
            the trainer; by default the chosen responses, or the best response of each ranked list, of the train
            dataset) and subtract it from the score head's bias, so that the saved model gives mean-zero rewards on
            that set (InstructGPT, Ouyang et al. 2022, section C.2). The offset is logged as `reward/center_offset`.
            A score head without a bias (Llama, Qwen, Mistral, ...) is given one; the saved model then loads with
            `trust_remote_code=True` (see the README).

        > Parameters that control NaN/inf losses and gradients

        nonfinite_policy (`str`, *optional*, defaults to `"stop"`):
            NaN/inf loss or gradient: `"stop"` or `"skip"` the step (in full: :mod:`trl_ext.runtime.nonfinite`).
        max_consecutive_nonfinite_skips (`int`, *optional*, defaults to `10`):
            With `"skip"`: consecutive skipped steps allowed before training stops.
    """

    label_smoothing: float = 0.0  # its range, [0, 0.5): trl_ext.field_rules.RANGES
    center_rewards_after_training: bool = False

    def __post_init__(self):
        check_fields(self)  # each field's range and choices (trl_ext.field_rules)
        check_steps(self)
        super().__post_init__()
