"""Configuration of :class:`trl_ext.PPOTrainer`."""

from dataclasses import dataclass
from typing import Literal, Optional, get_args

from ..field_rules import check_fields, help_from_docstring
from ..rewards.config import RewardFunctionArgs
from ..runtime.engines import EngineOnCPUArgsMixin
from ..runtime.nonfinite import NonFinitePolicyArgs
from .base import ParentPPOConfig
from .combination_rules import check_combinations, check_evaluation, check_launch
from .episodes.config import ToolArgs
from .evaluation import EvaluationArgs
from .grpo_compat.model_ids import ModelInitArgs
from .grpo_compat.prompt_dataset import PromptArgs
from .memory.micro_batch import micro_batch_value
from .objective.estimators import AdvantageEstimator, TurnCredit, default_kl_in, get_estimator
from .objective.kl_controllers import KLControllerName
from .objective.losses import ValueClip
from .objective.objectives import KLEstimator, LossAggregation, PolicyLossName, RatioLevel
from .memory.chunk import rollout_chunk_value
from .rollout.engine import RolloutEngineName
from .rollout.sampling import SamplingArgs

PTXMode = Literal["joint", "separate"]
KLIn = Literal["reward", "loss"]
PTX_MODES, KL_IN = get_args(PTXMode), get_args(KLIn)


@help_from_docstring
@dataclass
class PPOConfig(EngineOnCPUArgsMixin, ToolArgs, RewardFunctionArgs, ModelInitArgs, PromptArgs, SamplingArgs,
                NonFinitePolicyArgs, EvaluationArgs, ParentPPOConfig):
    """:class:`trl_ext.PPOTrainer`'s configuration: TRL 1.12's PPO keys (:mod:`trl_ext.ppo.base`) plus these, which
    default to TRL's behaviour. A line here is its key's command-line help; meanings, rules: docs/ppo.md, "Every key".

    - ``local_rollout_forward_batch_size``: sequences per generation and scoring chunk, or "auto".
    - ``max_memory_gib``: memory target of one device's process, in GiB, for the "auto" sizes.
    - ``train_micro_batch_size``: sequences per forward/backward of the PPO epochs, or "auto".
    - ``rollout_engine``: how the rollout samples: generate, continuous_batching or auto.
    - ``rollout_cuda_graphs``: with the generate engine, replay each decoding step as a CUDA graph.
    - ``value_clip``: how the value loss uses the clipped prediction: max (TRL), mean or none.
    - ``kl_controller``: how the KL coefficient evolves from kl_coef: fixed (TRL), adaptive or doubling.
    - ``kl_target``: target KL (summed over the response) of the adaptive and doubling controllers.
    - ``kl_horizon``: horizon, in episodes, of the adaptive controller.
    - ``ptx_coef``: weight of the pretraining LM loss (PPO-ptx); > 0 needs the trainer's ptx_dataset.
    - ``ptx_mode``: joint (the ptx loss joins each PPO micro-batch loss) or separate (its own step).
    - ``ptx_batch_size``: ptx sequences per micro-batch and device (default: per_device_train_batch_size).
    - ``ptx_max_length``: length, in tokens, ptx texts are truncated to.
    - ``reward_clip``: clip each reward-model score to [-reward_clip, reward_clip] before the KL penalty.
    - ``advantage_estimator``: gae (TRL) or critic-free rloo, grpo, reinforce_pp, reinforce_pp_baseline.
    - ``num_samples_per_prompt``: samples of each prompt per update; must divide the per-process batch.
    - ``kl_in``: where the KL to the reference goes: reward (PPO) or loss (GRPO's default).
    - ``grpo_scale_by_std``: grpo only: divide by the group's std.
    - ``turn_credit``: critic-free, with tools: each turn's return-to-go against the group's same turn (turn).
    - ``critic_warmup``: updates at the start in which only the value model trains.
    - ``critic_learning_rate``: the value model's learning rate (default: learning_rate).
    - ``critic_lam``: GAE lambda of the value model's targets (VAPO's decoupled GAE; default: lam).
    - ``length_adaptive_lam_alpha``: VAPO's length-adaptive lambda, lam = 1 - 1 / (alpha * length).
    - ``loss_aggregation``: how per-token losses become a micro-batch loss (TRL GRPO's loss_type).
    - ``cliprange_low``: lower clip of the ratio, 1 - cliprange_low (default: cliprange).
    - ``cliprange_high``: upper clip of the ratio, 1 + cliprange_high (DAPO's clip-higher; default: cliprange).
    - ``dual_clip``: dual clip c > 1: for negative advantages the loss is at most -c * A.
    - ``delta``: two-sided clip (INTELLECT-2): the unclipped ratio capped at delta.
    - ``ratio_level``: one ratio per token (PPO) or per sequence (GSPO).
    - ``policy_loss``: clipped (the PPO surrogate) or cispo (a clipped importance weight).
    - ``entropy_coef``: weight of the entropy bonus in the loss.
    - ``kl_estimator``: KL estimator of the reward penalty and the loss term: k1, k2, k3 or low_var_kl.
    - ``use_bias_correction_kl``: with kl_in=loss, each token's KL term times the ratio pi/pi_old.
    - ``mask_truncated_completions``: completions without the stop token leave the policy loss (DAPO).
    - ``dynamic_sampling``: drop groups of equal scores and sample more prompts (DAPO).
    - ``max_sampling_rounds``: with dynamic_sampling, the most generation rounds per update.
    """

    local_rollout_forward_batch_size: rollout_chunk_value = 64
    max_memory_gib: Optional[float] = None
    train_micro_batch_size: micro_batch_value = None
    rollout_engine: RolloutEngineName = "generate"
    rollout_cuda_graphs: bool = False

    value_clip: ValueClip = "max"
    kl_controller: KLControllerName = "fixed"
    kl_target: float = 6.0
    kl_horizon: int = 10000
    ptx_coef: float = 0.0
    ptx_mode: PTXMode = "joint"
    ptx_batch_size: Optional[int] = None
    ptx_max_length: int = 512

    reward_clip: Optional[float] = None

    advantage_estimator: AdvantageEstimator = "gae"
    num_samples_per_prompt: int = 1
    kl_in: Optional[KLIn] = None
    grpo_scale_by_std: bool = True
    turn_credit: TurnCredit = "episode"
    critic_warmup: int = 0
    critic_learning_rate: Optional[float] = None
    critic_lam: Optional[float] = None
    length_adaptive_lam_alpha: Optional[float] = None

    loss_aggregation: LossAggregation = "token_mean"
    cliprange_low: Optional[float] = None
    cliprange_high: Optional[float] = None
    dual_clip: Optional[float] = None
    delta: Optional[float] = None
    ratio_level: RatioLevel = "token"
    policy_loss: PolicyLossName = "clipped"
    entropy_coef: float = 0.0
    kl_estimator: Optional[KLEstimator] = None
    use_bias_correction_kl: bool = False
    mask_truncated_completions: bool = False
    dynamic_sampling: bool = False
    max_sampling_rounds: int = 3

    @classmethod
    def from_grpo_config(cls, grpo_config, **overrides) -> "PPOConfig":
        """The `PPOConfig` of TRL `GRPOConfig` `grpo_config` (`advantage_estimator` "grpo"), `overrides` on top; keys
        it cannot honour are named in one warning or refused. Table: `docs/coming-from-grpo.md`; code:
        :func:`trl_ext.ppo.grpo_compat.from_grpo.ppo_kwargs_from_grpo`."""
        from .grpo_compat.from_grpo import ppo_kwargs_from_grpo

        return cls(**ppo_kwargs_from_grpo(grpo_config, overrides))

    @property
    def critic_free(self) -> bool:
        """True when the advantage estimator needs no value model (every registered one but `gae`)."""
        return not get_estimator(self.advantage_estimator).value_model

    @property
    def has_value_model(self) -> bool:
        """True when the run loads, trains and saves a value model (`advantage_estimator` "gae"): what the recipe
        loader, the planner and the trainer's critic (:mod:`trl_ext.ppo.objective.critic`) ask."""
        return not self.critic_free

    def __post_init__(self):
        check_fields(self)  # each field's range and choices (trl_ext.field_rules)
        check_launch(self)  # engine limits: before accelerate's state is set up for that engine
        check_evaluation(self)  # eval keys: before HF's checks of them (ValueErrors)
        super().__post_init__()
        self.local_rollout_forward_batch_size = rollout_chunk_value(self.local_rollout_forward_batch_size)
        self.train_micro_batch_size = micro_batch_value(self.train_micro_batch_size)
        self.kl_in = default_kl_in(self.kl_in, self.advantage_estimator)  # unset: the estimator's
        check_combinations(self)  # how the settings combine (trl_ext.ppo.combination_rules)


def ppo_config_from(args):
    """The trainer's `args`: a `PPOConfig` as it is; a TRL `GRPOConfig` through :meth:`PPOConfig.from_grpo_config`
    (so that a GRPOTrainer script runs with only the trainer's name changed)."""
    from trl import GRPOConfig

    if isinstance(args, GRPOConfig) and not isinstance(args, PPOConfig):
        return PPOConfig.from_grpo_config(args)
    return args
