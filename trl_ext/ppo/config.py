"""Configuration of :class:`trl_ext.PPOTrainer`."""

from dataclasses import dataclass, field
from typing import Literal, Optional, get_args

from ..config_rules import check_fields
from ..rewards.config import RewardFunctionArgs
from ..runtime.engines import EngineOnCPUArgsMixin
from ..runtime.nonfinite import NonFinitePolicyArgs
from .objective.advantages import AdvantageEstimator
from .base import ParentPPOConfig
from .config_rules import check_combinations, check_evaluation, check_launch
from .episodes.config import ToolArgs
from .evaluation import EvaluationArgs
from .grpo_compat.model_ids import ModelInitArgs
from .grpo_compat.prompt_dataset import PromptArgs
from .micro_batches import micro_batch_value
from .objective.kl_controllers import KLControllerName
from .objective.losses import ValueClip
from .objective.objectives import KLEstimator, LossAggregation, PolicyLossName, RatioLevel
from .rollout.chunk import rollout_chunk_value
from .rollout.engine import RolloutEngineName
from .rollout.sampling import SamplingArgs

PTXMode = Literal["joint", "separate"]
KLIn = Literal["reward", "loss"]
PTX_MODES, KL_IN = get_args(PTXMode), get_args(KLIn)


@dataclass
class PPOConfig(EngineOnCPUArgsMixin, ToolArgs, RewardFunctionArgs, ModelInitArgs, PromptArgs, SamplingArgs,
                NonFinitePolicyArgs, EvaluationArgs, ParentPPOConfig):
    """Configuration of :class:`trl_ext.PPOTrainer`: TRL 1.12's PPO keys (:mod:`trl_ext.ppo.base`) plus the ones
    below, each defaulting to TRL's behaviour; their meanings, defaults and rules: docs/ppo.md, "Every key"."""

    local_rollout_forward_batch_size: rollout_chunk_value = field(default=64, metadata={
        "help": 'Per-device sequences per generation call and scoring forward pass, or "auto" (fits max_memory_gib).'})
    max_memory_gib: Optional[float] = field(default=None, metadata={
        "help": "Memory target of one device's whole process, in GiB, for the \"auto\" batch sizes."})
    train_micro_batch_size: micro_batch_value = field(default=None, metadata={
        "help": 'Sequences per forward/backward of the PPO epochs (an integer or "auto"); the update does not '
                "depend on it."})
    rollout_engine: RolloutEngineName = field(default="generate", metadata={
        "help": "How the rollout samples: generate, continuous_batching or auto."})
    rollout_cuda_graphs: bool = field(default=False, metadata={
        "help": "With the generate engine: a static KV cache, its decoding steps replayed as a CUDA graph."})

    value_clip: ValueClip = field(default="max", metadata={
        "help": "How the value loss uses the clipped prediction: max (TRL), mean or none."})
    kl_controller: KLControllerName = field(default="fixed", metadata={
        "help": "How the KL coefficient evolves from kl_coef: fixed (TRL), adaptive or doubling."})
    kl_target: float = field(default=6.0, metadata={
        "help": "Target KL (summed over the response) of the adaptive and doubling controllers."})
    kl_horizon: int = field(default=10000, metadata={"help": "Horizon, in episodes, of the adaptive controller."})
    ptx_coef: float = field(default=0.0, metadata={
        "help": "Weight of the pretraining LM loss (PPO-ptx); > 0 needs the trainer's ptx_dataset."})
    ptx_mode: PTXMode = field(default="joint", metadata={
        "help": "joint: the ptx loss joins each PPO micro-batch loss; separate: its own optimizer step."})
    ptx_batch_size: Optional[int] = field(default=None, metadata={
        "help": "Per-device ptx sequences per micro-batch (default: per_device_train_batch_size)."})
    ptx_max_length: int = field(default=512, metadata={"help": "Length, in tokens, ptx texts are truncated to."})

    reward_clip: Optional[float] = field(default=None, metadata={
        "help": "Clip each reward-model score to [-reward_clip, reward_clip] before the KL penalty."})

    advantage_estimator: AdvantageEstimator = field(default="gae", metadata={
        "help": "gae (TRL, with a value model) or a critic-free rloo, grpo, reinforce_pp, reinforce_pp_baseline."})
    num_samples_per_prompt: int = field(default=1, metadata={
        "help": "Samples of each prompt per update; must divide the per-process batch."})
    kl_in: Optional[KLIn] = field(default=None, metadata={
        "help": "Where the KL to the reference goes: reward (PPO) or loss (GRPO's default)."})
    grpo_scale_by_std: bool = field(default=True, metadata={"help": "grpo only: divide by the group's std."})
    critic_warmup: int = field(default=0, metadata={
        "help": "Updates at the start in which only the value model trains."})
    critic_learning_rate: Optional[float] = field(default=None, metadata={
        "help": "The value model's learning rate (default: learning_rate)."})
    critic_lam: Optional[float] = field(default=None, metadata={
        "help": "GAE lambda of the value model's targets (VAPO's decoupled GAE; default: lam)."})
    length_adaptive_lam_alpha: Optional[float] = field(default=None, metadata={
        "help": "VAPO's length-adaptive lambda of the policy's advantages, lam = 1 - 1 / (alpha * length)."})

    loss_aggregation: LossAggregation = field(default="token_mean", metadata={
        "help": "How per-token losses become a micro-batch loss (TRL GRPO's loss_type)."})
    cliprange_low: Optional[float] = field(default=None, metadata={
        "help": "Lower clip of the ratio, 1 - cliprange_low (default: cliprange)."})
    cliprange_high: Optional[float] = field(default=None, metadata={
        "help": "Upper clip of the ratio, 1 + cliprange_high (DAPO's clip-higher; default: cliprange)."})
    dual_clip: Optional[float] = field(default=None, metadata={
        "help": "Dual clip c > 1: for negative advantages the loss is at most -c * A."})
    delta: Optional[float] = field(default=None, metadata={
        "help": "Two-sided clip (INTELLECT-2): the unclipped ratio capped at delta."})
    ratio_level: RatioLevel = field(default="token", metadata={
        "help": "One ratio per token (PPO) or per sequence (GSPO)."})
    policy_loss: PolicyLossName = field(default="clipped", metadata={
        "help": "clipped (the PPO surrogate) or cispo (a clipped importance weight)."})
    entropy_coef: float = field(default=0.0, metadata={"help": "Weight of the entropy bonus in the loss."})
    kl_estimator: Optional[KLEstimator] = field(default=None, metadata={
        "help": "KL estimator of the reward penalty and the loss term: k1, k2, k3 or low_var_kl."})
    use_bias_correction_kl: bool = field(default=False, metadata={
        "help": "With kl_in=loss: each token's KL term times the ratio pi/pi_old."})
    mask_truncated_completions: bool = field(default=False, metadata={
        "help": "Completions without the stop token leave the policy loss (DAPO)."})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "Drop groups of equal scores and sample more prompts (DAPO)."})
    max_sampling_rounds: int = field(default=3, metadata={
        "help": "With dynamic_sampling: the most generation rounds per update."})

    @classmethod
    def from_grpo_config(cls, grpo_config, **overrides) -> "PPOConfig":
        """The `PPOConfig` of TRL `GRPOConfig` `grpo_config` (`advantage_estimator` "grpo"), `overrides` on top; keys
        it cannot honour are named in one warning or refused. Table: `docs/coming-from-grpo.md`; code:
        :func:`trl_ext.ppo.grpo_compat.from_grpo.ppo_kwargs_from_grpo`."""
        from .grpo_compat.from_grpo import ppo_kwargs_from_grpo

        return cls(**ppo_kwargs_from_grpo(grpo_config, overrides))

    @property
    def critic_free(self) -> bool:
        """True when the advantage estimator needs no value model (every one but `gae`)."""
        return self.advantage_estimator != "gae"

    @property
    def has_value_model(self) -> bool:
        """True when the run loads, trains and saves a value model (`advantage_estimator` "gae"): what the recipe
        loader, the planner and the trainer's critic (:mod:`trl_ext.ppo.objective.critic`) ask."""
        return not self.critic_free

    def __post_init__(self):
        check_fields(self)  # each field's range and choices (trl_ext.config_rules)
        check_launch(self)  # engine limits: before accelerate's state is set up for that engine
        check_evaluation(self)  # eval keys: before HF's checks of them (ValueErrors)
        super().__post_init__()
        self.local_rollout_forward_batch_size = rollout_chunk_value(self.local_rollout_forward_batch_size)
        self.train_micro_batch_size = micro_batch_value(self.train_micro_batch_size)
        check_combinations(self)  # how the settings combine (trl_ext.ppo.config_rules)


def ppo_config_from(args):
    """The trainer's `args`: a `PPOConfig` as it is; a TRL `GRPOConfig` through :meth:`PPOConfig.from_grpo_config`
    (so that a GRPOTrainer script runs with only the trainer's name changed)."""
    from trl import GRPOConfig

    if isinstance(args, GRPOConfig) and not isinstance(args, PPOConfig):
        return PPOConfig.from_grpo_config(args)
    return args
