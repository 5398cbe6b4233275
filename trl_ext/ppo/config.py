"""Configuration of :class:`trl_ext.PPOTrainer`."""

from dataclasses import dataclass
from typing import Literal, Optional, get_args

from ..config_rules import check_fields, help_from_docstring
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


@help_from_docstring
@dataclass
class PPOConfig(EngineOnCPUArgsMixin, ToolArgs, RewardFunctionArgs, ModelInitArgs, PromptArgs, SamplingArgs,
                NonFinitePolicyArgs, EvaluationArgs, ParentPPOConfig):
    r"""Configuration for [`trl_ext.PPOTrainer`]: every field of TRL 1.12's `experimental.ppo.PPOConfig` (TRL's class
    on TRL 1.10-1.12, trl-ext's copy from 1.13 on, see :mod:`trl_ext.ppo.base`), plus the extensions below (all of
    them default to TRL's behaviour). Each field's command-line help is the first sentence of its entry here
    (:func:`trl_ext.config_rules.help_from_docstring`). Every rule on the settings is checked at construction: each
    field's range and choices (:mod:`trl_ext.config_rules`), then how they combine (:mod:`trl_ext.ppo.config_rules`).

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
        max_grad_norm (`float`, *optional*, defaults to `1.0`):
            HF's key: before every optimizer step the gradients of policy and value model together are scaled to a
            global L2 norm of at most this (one norm: they share one optimizer, and DeepSpeed's engine clips one),
            after the NaN/inf check. `0` turns clipping off (TRL's PPO clips nothing). The pre-clip norm is logged as
            `policy/grad_norm`. Under DeepSpeed the engine clips: its `gradient_clipping` is set from this key, and a
            different value fixed in the accelerate or DeepSpeed config is refused.
        local_rollout_forward_batch_size (`int` or `"auto"`, *optional*, defaults to `64`):
            Per-device sequences per generation call and per scoring (reference, value, reward) forward pass, as in
            TRL. `"auto"`: the largest chunk, up to the per-device batch, whose memory budget
            (:mod:`trl_ext.ppo.rollout.memory_budget`, from the loaded models' shapes, LoRA rank, quantization and the longest
            prompt of the train set) fits `max_memory_gib`; chosen once when the trainer is built
            (:mod:`trl_ext.ppo.rollout.chunk`), which then holds the number in `args`. Needs a LoRA policy. The chunk
            changes which random numbers go to which sequence: samples come from the same distribution, not the same
            samples (so a run with `auto` is not bit-identical to one with another chunk).
        max_memory_gib (`float`, *optional*):
            Memory target of one device's whole process, in GiB, for `local_rollout_forward_batch_size: "auto"`.
            Defaults, on CUDA, to the device's free memory when the trainer is built plus what this process's
            allocator already holds (`torch.cuda.mem_get_info`); required on other devices (the budget models a
            GPU's allocator, not a CPU process). With it set, the choice depends on the models and settings only.
        train_micro_batch_size (`int` or `"auto"`, *optional*):
            Sequences per forward/backward of the PPO epochs, independent of the rollout batch: mini-batches, optimizer
            steps and the rollout stay as `per_device_train_batch_size`, `gradient_accumulation_steps` and
            `num_mini_batches` define them; the gradients of a mini-batch's micro-batches accumulate into its one
            optimizer step (:mod:`trl_ext.ppo.micro_batches`). Each loss term is weighted by its share of the
            mini-batch, so the update does not depend on the micro-batch; with it set, `token_mean`'s normaliser is
            the mini-batch's token count. `"auto"`: the largest micro-batch whose training phase fits `max_memory_gib`
            (or the device's free memory on CUDA) beside the persistent memory (needs a LoRA policy). `None`
            (default): micro-batches of `per_device_train_batch_size`, as TRL. Not under DeepSpeed.
        rollout_engine (`str`, *optional*, defaults to `"generate"`):
            How the rollout samples: `"generate"` (TRL's `model.generate`, per chunk of
            `local_rollout_forward_batch_size`), `"continuous_batching"` (transformers' continuous-batching engine: a
            paged KV cache sized like one chunk's, a new prompt admitted as soon as a response stops; faster when
            response lengths are uneven; the engine's log-probs are the old log-probs when only the temperature
            shapes sampling, else one teacher-forced forward recomputes them) or `"auto"` (continuous batching when a
            stop token is set and `response_length >= 64`, else generate; the choice is printed once and kept in
            `trainer.rollout_engine_choice`). Refused under DeepSpeed ZeRO-3. Guide: `docs/rollout-engine.md`.
        rollout_cuda_graphs (`bool`, *optional*, defaults to `False`):
            With the `generate` engine: each chunk generates with transformers' static KV cache and its decoding
            steps are captured once as a CUDA graph and replayed (one launch per step instead of thousands: a QLoRA
            policy's decoding is bound by kernel launches; :mod:`trl_ext.ppo.rollout.decode_graphs`). Same tokens and
            log-probs as the dynamic cache up to float rounding. On CPU the static cache runs without graphs. Logs
            `rollout/cuda_graph_replays` and `rollout/eager_decode_steps`. Not with `continuous_batching` nor under
            DeepSpeed ZeRO-3.
        advantage_estimator (`str`, *optional*, defaults to `"gae"`):
            `"gae"` (TRL: a value model, GAE, advantages whitened per process) or a critic-free estimator (no value
            model: pass `value_model=None`): `"rloo"` (leave-one-out baseline), `"grpo"` (group mean and std),
            `"reinforce_pp"` (REINFORCE++: returns-to-go whitened over the global batch) or `"reinforce_pp_baseline"`
            (group mean subtracted first). Formulas: :mod:`trl_ext.ppo.objective.advantages`; guide: `docs/critic-free.md`.
        num_samples_per_prompt (`int`, *optional*, defaults to `1`):
            `k`: each prompt is sampled `k` times per update. The episodes per update and process stay
            `per_device_train_batch_size * gradient_accumulation_steps` (`local_batch_size`), of which
            `local_batch_size / k` distinct prompts, so `k` must divide it. `rloo`, `grpo` and
            `reinforce_pp_baseline` need `k >= 2`.
        kl_in (`str`, *optional*):
            Where the KL to the reference goes: `"reward"` (a per-token penalty `-kl_coef * KL_t` in the reward, as
            PPO; for `rloo`/`grpo` the sequence reward becomes `score - kl_coef * sum_t KL_t`) or `"loss"` (GRPO:
            `kl_coef * masked_mean(k3)` of the current policy added to each micro-batch loss, logged as
            `loss/kl_avg`). Defaults to `"loss"` for `grpo` and `"reward"` otherwise; `gae` takes `"reward"` only.
            `kl_controller` sets `kl_coef` either way, from the rollout's `objective/kl`.
        grpo_scale_by_std (`bool`, *optional*, defaults to `True`):
            `grpo` only: divide by the group's std. `False` is Dr. GRPO (Liu et al. 2025): `A_i = r_i - mean`.
        critic_warmup (`int`, *optional*, defaults to `0`):
            verl's key: for the first `critic_warmup` updates only the value model trains, so that GAE starts from
            a value model fitted to the policy's returns; the policy is held (its loss terms get no gradient, no
            optimizer step and no separate ptx step touch its parameters). Rollouts, metrics, the KL controller and
            the learning-rate schedule run as in every update. Logged as `critic/warmup` (1 for a held update, else
            0). `0`: off. Needs a value model (`advantage_estimator` `"gae"`). Code:
            :mod:`trl_ext.ppo.objective.critic_warmup`.
        critic_learning_rate (`float`, *optional*):
            The value model's learning rate (OpenRLHF's `--critic_learning_rate`, verl's `critic.optim.lr`): its
            parameters form their own groups of the one optimizer, scheduled like the policy's. `None` (default):
            `learning_rate`. Needs a value model.
        critic_lam (`float`, *optional*):
            Decoupled GAE (VAPO, arXiv 2504.05118): the lambda of the value model's targets, `R_t = A_t(critic_lam) +
            V_t` (1.0: Monte-Carlo returns), while the policy's advantages keep `lam`. `None` (default): `lam`.
            Needs a value model.
        length_adaptive_lam_alpha (`float`, *optional*):
            VAPO's length-adaptive lambda for the policy's advantages: `lam = 1 - 1 / (alpha * l)` per response of `l`
            tokens (the paper's alpha: 0.05), instead of `lam`. `None` (default): off. Needs a value model.

        > Policy objective (formulas: :mod:`trl_ext.ppo.objective.objectives`; TRL `GRPOConfig` names: `docs/ppo.md`). Every
        > key works with every `advantage_estimator`, GAE included; the defaults are the objective above.

        loss_aggregation (`str`, *optional*, defaults to `"token_mean"`):
            How per-token losses (policy, KL and entropy terms) become a micro-batch loss: `"token_mean"` (TRL's PPO;
            TRL GRPO's `bnpo`): mean over the micro-batch's counted tokens; `"global_token_mean"` (DAPO, Yu et al.
            2025, eq. 8; TRL's `dapo`): sum over the tokens divided by the mini-batch's token count over all
            processes and accumulation steps, so each optimizer step is one token mean of its whole batch;
            `"seq_mean_token_mean"` (GRPO, Shao et al. 2024; TRL's `grpo`): mean over sequences of each sequence's
            token mean; `"seq_mean_token_sum_norm"` (Dr. GRPO, Liu et al. 2025; TRL's `dr_grpo`): token sum over
            `micro-batch size * response_length`. Only `token_mean` depends on how the batch is split.
        cliprange_low (`float`, *optional*):
            Lower clip `eps_low` of the ratio, `clip(r, 1 - eps_low, 1 + eps_high)`. Defaults to `cliprange`.
        cliprange_high (`float`, *optional*):
            Upper clip `eps_high` (DAPO's clip-higher, e.g. 0.28; TRL's `epsilon_high`). Defaults to `cliprange`.
            With `policy_loss="cispo"` the importance weight is capped at `1 + cliprange_high`.
        dual_clip (`float`, *optional*):
            Dual clip `c > 1` (Ye et al. 2020, "Mastering Complex Control in MOBA Games"; OpenRLHF's `--dual_clip`):
            for negative advantages the loss is at most `-c * A`. `None` (default): off. Not with `cispo`.
        delta (`float`, *optional*):
            Two-sided clip (INTELLECT-2, Prime Intellect 2025; TRL's `delta`): the unclipped ratio is capped at
            `delta` (> `1 + cliprange_high`) before the min. `None` (default): off. Not with `cispo`.
        ratio_level (`str`, *optional*, defaults to `"token"`):
            `"token"`: one ratio per token (PPO); `"sequence"` (GSPO, Zheng et al. 2025; TRL's
            `importance_sampling_level`): `exp(mean_t log(pi/pi_old))` over the counted tokens, clipped per sequence.
        policy_loss (`str`, *optional*, defaults to `"clipped"`):
            `"clipped"`: the PPO surrogate with the clips above; `"cispo"` (MiniMax-M1 2025; TRL's `cispo`):
            `-sg(min(r, 1 + cliprange_high)) * A * log pi`: the weight is clipped, every token keeps its gradient.
        entropy_coef (`float`, *optional*, defaults to `0.0`):
            Entropy bonus: `- entropy_coef * H` added to the loss, `H` the entropy of the temperature-scaled policy
            aggregated as the policy loss, from the logits the loss already has (no second forward). Logged as
            `loss/entropy_avg`; `policy/entropy_avg` keeps its meaning either way.
        kl_estimator (`str`, *optional*):
            KL estimator (Schulman 2020, http://joschu.net/blog/kl-approx.html) of both the reward penalty and the
            loss term (`kl_in`), hence of `objective/kl` that the KL controllers read: `"k1"` (`log pi - log
            pi_ref`), `"k2"` (`(log r)^2 / 2`), `"k3"` (`r - 1 - log r`) or `"low_var_kl"` (verl: k3 clamped to
            [-10, 10]). `None` (default) keeps each path's TRL default: k1 in the reward and `objective/kl` (TRL's
            PPO), k3 in the loss (GRPO); set it to have the controllers read the estimate the loss penalises.
        use_bias_correction_kl (`bool`, *optional*, defaults to `False`):
            With `kl_in="loss"`: each token's KL term times the policy's ratio `pi/pi_old` (with its gradient), which
            makes the k3 gradient the unbiased reverse-KL gradient when the batch is off-policy (DeepSeek-V3.2, 2025;
            TRL's key of that name, `True` by default in TRL 1.16's `GRPOConfig`). `False`: GRPO's plain term.
        mask_truncated_completions (`bool`, *optional*, defaults to `False`):
            DAPO (sec. 3.4; TRL's key): completions without the stop token (cut at `response_length`; the test of
            `missing_eos_penalty`) leave the policy loss (their tokens stop counting; they still count in their
            group's baseline and in the value loss). Needs `stop_token` or `stop_token_id`. Logged as
            `objective/frac_truncated`.
        dynamic_sampling (`bool`, *optional*, defaults to `False`):
            DAPO (sec. 3.2): groups whose scores are all equal (zero group advantage) are dropped and more prompts
            are sampled until the update's batch is full or `max_sampling_rounds` rounds ran; a batch still short
            is filled with dropped groups. Needs a group estimator (`rloo`, `grpo`, `reinforce_pp_baseline`).
            Logged as `sampling/rounds`, `sampling/groups_dropped`, `sampling/groups_refilled`.
        max_sampling_rounds (`int`, *optional*, defaults to `3`):
            With `dynamic_sampling`: at most this many generation rounds per update (the first included).

        > Sampling of the rollout (TRL `GRPOConfig`'s keys; full description:
        > :class:`trl_ext.ppo.rollout.sampling.SamplingArgs`). They shape what is sampled; the rollout's and the
        > loss's log-probs are both `log_softmax(logits / temperature)` of the full vocabulary (TRL's GRPOTrainer too).

        top_p (`float`, *optional*, defaults to `1.0`):
            Nucleus sampling: the smallest set of tokens whose probability sums to at least `top_p`; in (0, 1],
            `1.0` = off.
        top_k (`int`, *optional*, defaults to `0`):
            Sample from the `top_k` most probable tokens; `0` = off (`1` is greedy).
        min_p (`float`, *optional*):
            Drop tokens below `min_p` times the top token's probability; in [0, 1]. `None` (default) = off.
        repetition_penalty (`float`, *optional*, defaults to `1.0`):
            Penalise tokens already in the prompt or response (`> 1`: fewer repeats); > 0, `1.0` = off.
        generation_kwargs (`dict`, *optional*):
            More `transformers.GenerationConfig` keys for the rollout's sampling; not the keys above nor those the
            trainer sets (`max_new_tokens`, `do_sample`, `num_beams`, `eos_token_id`, ...).

        > Parameters of the trainer's `reward_funcs` (full description: :class:`trl_ext.rewards.config.RewardFunctionArgs`)

        reward_weights (`list[float]`, *optional*):
            One weight per reward (the reward model first when there is one, then `reward_funcs`); default 1.0 each.
        reward_num_workers (`int`, *optional*, defaults to `0`):
            Worker processes for reward functions: `0` in process (as TRL); `> 0` timeouts and errors score None,
            are counted, and the run goes on.
        reward_timeout_s (`float`, *optional*):
            With workers: the longest a reward call may run. None: no limit.
        log_completions (`bool`, *optional*, defaults to `False`):
            Log each update's prompts, completions, rewards and advantages (wandb table, `completions.jsonl`,
            console).
        num_completions_to_print (`int`, *optional*, defaults to `4`):
            With `log_completions`: rows printed per update (None: all); the file and the table get all.

        > Parameters of models given by id and of chat prompts (TRL `GRPOConfig`'s keys; full description:
        > :mod:`trl_ext.ppo.grpo_compat.model_ids`, :mod:`trl_ext.ppo.grpo_compat.prompt_dataset`)

        model_init_kwargs (`dict`, *optional*):
            `from_pretrained` keyword arguments of the models given to the trainer as an id or path.
        chat_template_kwargs (`dict`, *optional*):
            `apply_chat_template` keyword arguments for a `prompt` column of chat messages.

        > Parameters that control NaN/inf losses and gradients (full description:
        > :class:`trl_ext.runtime.nonfinite.NonFinitePolicyArgs`)

        nonfinite_policy (`str`, *optional*, defaults to `"stop"`):
            `"stop"` (error, CLI exit code 3) or `"skip"` (no optimizer or scheduler step, counted) for a NaN/inf
            loss or gradient.
        max_consecutive_nonfinite_skips (`int`, *optional*, defaults to `10`):
            With `"skip"`: consecutive skipped steps allowed before training stops.

        > Evaluation during training: HF's `eval_strategy` (`"no"` or `"steps"`; `"epoch"` is refused), `eval_steps`
        > (in updates; default `logging_steps`), `eval_delay`, `per_device_eval_batch_size` on the trainer's
        > `eval_dataset`, scored with the run's rewards (full description: :mod:`trl_ext.ppo.evaluation`)

        eval_do_sample (`bool`, *optional*, defaults to `False`):
            `False`: each evaluation prompt gets one greedy completion. `True`: one completion sampled at
            `temperature`, as the rollouts sample, from a copy of the RNG state (the training's stream is unchanged).
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
