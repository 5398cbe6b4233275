"""Configuration of :class:`trl_ext.PPOTrainer`."""

from dataclasses import dataclass, field
from typing import Literal

from ..errors import UserInputError
from ..runtime.engines import DEEPSPEED, FSDP, EngineOnCPUArgsMixin, launched_engine
from ..runtime.nonfinite import NonFinitePolicyArgs
from .base import ParentPPOConfig
from .kl_controllers import KL_CONTROLLERS
from .losses import VALUE_CLIP_MODES

PTX_MODES = ("joint", "separate")


@dataclass
class PPOConfig(EngineOnCPUArgsMixin, NonFinitePolicyArgs, ParentPPOConfig):
    r"""Configuration for [`trl_ext.PPOTrainer`]: every field of TRL 1.12's `experimental.ppo.PPOConfig` (TRL's class
    on TRL 1.10-1.12, trl-ext's copy from 1.13 on, see :mod:`trl_ext.ppo.base`), plus the extensions below (all of
    them default to TRL's behaviour).

    Parameters:
        value_clip (`str`, *optional*, defaults to `"max"`):
            How the value loss uses the clipped prediction `V_clip = clip(V, V_old - cliprange_value,
            V_old + cliprange_value)`: `"max"` = `0.5 * mean(max((V-R)^2, (V_clip-R)^2))` (TRL, DeepSpeed-Chat),
            `"mean"` = `0.5 * mean(((V-R)^2 + (V_clip-R)^2) / 2)`, `"none"` = `0.5 * mean((V-R)^2)`.
        kl_controller (`str`, *optional*, defaults to `"fixed"`):
            How the KL coefficient evolves, starting from `kl_coef`: `"fixed"` (TRL), `"adaptive"` (Ziegler et al.
            2019: `beta *= 1 + clip(KL/kl_target - 1, -0.2, 0.2) * batch_size / kl_horizon`) or `"doubling"`
            (Schulman et al. 2017, sec. 4: halve if `KL < kl_target/1.5`, double if `KL > 1.5*kl_target`). The KL is
            the update's logged `objective/kl`. A controller object passed to the trainer overrides this.
        kl_target (`float`, *optional*, defaults to `6.0`):
            Target KL (summed over the response, as logged in `objective/kl`) of the adaptive and doubling
            controllers.
        kl_horizon (`int`, *optional*, defaults to `10000`):
            Horizon, in episodes, of the adaptive controller.
        ptx_coef (`float`, *optional*, defaults to `0.0`):
            Weight `gamma` of the pretraining LM loss (PPO-ptx, InstructGPT eq. 2). `0` disables it; `> 0` needs
            the trainer's `ptx_dataset`.
        ptx_mode (`str`, *optional*, defaults to `"joint"`):
            `"joint"`: each PPO micro-batch loss becomes `pg + vf_coef * vf + ptx_coef * lm_loss(ptx micro-batch)`
            (one backward). `"separate"` (DeepSpeed-Chat): after each PPO optimizer step, one more backward of
            `ptx_coef * lm_loss` on a ptx micro-batch and its own optimizer step.
        ptx_batch_size (`int`, *optional*):
            Per-device number of ptx sequences per micro-batch. Defaults to `per_device_train_batch_size`.
        ptx_max_length (`int`, *optional*, defaults to `512`):
            Length, in tokens, that ptx texts are truncated to when tokenized.
        reward_clip (`float`, *optional*):
            Clip each reward-model score (after `missing_eos_penalty`) to `[-reward_clip, reward_clip]` before the
            KL penalty is added (DeepSpeed-Chat `clip_reward_value`, trlx `cliprange_reward`). The fraction clipped
            is logged as `objective/scores_clipfrac`. `None` (default) = no clipping. NaN/inf scores are an error
            either way.
        sync_with_dataloader (`bool`, *optional*, defaults to `True`):
            accelerate's setting of that name, which TRL's PPO keeps: with `gradient_accumulation_steps > 1`, an update
            during which the most recently opened accelerate DataLoader is at its last batch (the prompt DataLoader at
            the end of each epoch, or the sample-generation DataLoader when it has one batch) steps the optimizer on
            every micro-batch instead of accumulating. `False` accumulates over `gradient_accumulation_steps`
            micro-batches always, as HF Trainer does; it changes numbers against TRL only in those updates.
            Resuming is exact either way (the DataLoader state is saved in checkpoints).

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

    value_clip: Literal["max", "mean", "none"] = field(
        default="max",
        metadata={"help": "Value loss clipping: 'max' (TRL), 'mean' of clipped and unclipped errors, or 'none'."},
    )
    kl_controller: Literal["fixed", "adaptive", "doubling"] = field(
        default="fixed",
        metadata={"help": "KL coefficient control: 'fixed' (TRL), 'adaptive' (Ziegler 2019), 'doubling' (PPO paper)."},
    )
    kl_target: float = field(
        default=6.0, metadata={"help": "Target KL of the adaptive and doubling KL controllers."}
    )
    kl_horizon: int = field(
        default=10000, metadata={"help": "Horizon (episodes) of the adaptive KL controller."}
    )
    ptx_coef: float = field(
        default=0.0,
        metadata={"help": "Weight of the pretraining LM loss (PPO-ptx); 0 disables it, > 0 needs a ptx_dataset."},
    )
    ptx_mode: Literal["joint", "separate"] = field(
        default="joint",
        metadata={"help": "'joint': ptx loss added to each PPO micro-batch loss; 'separate': its own optimizer step."},
    )
    ptx_batch_size: int | None = field(
        default=None,
        metadata={"help": "Per-device ptx micro-batch size; defaults to per_device_train_batch_size."},
    )
    ptx_max_length: int = field(
        default=512, metadata={"help": "Maximum length in tokens of a ptx sequence (longer texts are truncated)."}
    )

    reward_clip: float | None = field(
        default=None,
        metadata={"help": "Clip reward-model scores to [-reward_clip, reward_clip]; None = no clipping."},
    )

    sync_with_dataloader: bool = field(
        default=True,
        metadata={
            "help": "TRL/accelerate default (True): no gradient accumulation in updates where the last opened "
            "DataLoader is at its end. False: always accumulate gradient_accumulation_steps micro-batches."
        },
    )

    def __post_init__(self):
        # engine limits first: before accelerate's state is set up for that engine
        if launched_engine() == FSDP:
            raise UserInputError(
                "PPO does not run under FSDP: TRL's PPO generates with the policy inside the sharded model without "
                "gathering its FSDP2 shards (RuntimeError: aten.embedding.default got mixed torch.Tensor and DTensor); "
                "launch PPO with a DeepSpeed config (recipes/accelerate/zero2.yaml or zero3.yaml) or DDP"
            )
        if self.ptx_mode == "separate" and self.ptx_coef > 0 and launched_engine() == DEEPSPEED:
            raise UserInputError(
                "ptx_mode: 'separate' is not supported under DeepSpeed: ZeRO steps every parameter of the policy and "
                "value model together, so the separate ptx step would also move the value model (Adam momentum on "
                "zero gradients); use ptx_mode 'joint'"
            )
        super().__post_init__()
        if self.value_clip not in VALUE_CLIP_MODES:
            raise UserInputError(
                f"value_clip: unknown value {self.value_clip!r}; use one of {', '.join(VALUE_CLIP_MODES)}"
            )
        if self.kl_controller not in KL_CONTROLLERS:
            raise UserInputError(
                f"kl_controller: unknown value {self.kl_controller!r}; use one of {', '.join(KL_CONTROLLERS)}"
            )
        if self.ptx_mode not in PTX_MODES:
            raise UserInputError(f"ptx_mode: unknown value {self.ptx_mode!r}; use one of {', '.join(PTX_MODES)}")
        for name in ("kl_target", "kl_horizon", "ptx_max_length"):
            if not getattr(self, name) > 0:
                raise UserInputError(f"{name}: must be positive, got {getattr(self, name)!r}")
        if self.reward_clip is not None and not self.reward_clip > 0:
            raise UserInputError(f"reward_clip: must be positive (or None for no clipping), got {self.reward_clip!r}")
        if self.ptx_batch_size is not None and not self.ptx_batch_size > 0:
            raise UserInputError(f"ptx_batch_size: must be positive, got {self.ptx_batch_size!r}")
        for name in ("kl_coef", "vf_coef", "ptx_coef", "cliprange", "cliprange_value"):
            if getattr(self, name) < 0:
                raise UserInputError(f"{name}: must not be negative, got {getattr(self, name)!r}")
