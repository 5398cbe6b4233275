"""PPO trainer: TRL 1.12's `experimental.ppo.PPOTrainer` (:mod:`trl_ext.ppo.base`) with extensions, and a training
loop made of named steps that a subclass overrides one at a time. The steps and the extensions they call:
docs/ppo.md, "One update, step by step"."""

from __future__ import annotations

import math
import os
import time

import torch
from torch import nn
from transformers import GenerationConfig

from ..errors import UserInputError
from ..models.dtypes import float32_trainable_parameters
from ..models.lora import check_lora_targets
from ..runtime.checkpoints import AtomicCheckpointMixin, latest_checkpoint, resolve_checkpoint
from ..runtime.devices import empty_cache, release_memory
from ..runtime.engines import deepspeed_gradient_clipping
from ..runtime.interruption import raise_if_interrupted, watch_signals
from ..runtime.nonfinite import Finding, NonFiniteError, StepGuard, count_nonfinite, guarded_optimizer_step
from ..trl_internals import selective_log_softmax
from .base import OnlineTrainerState, ParentPPOTrainer
from .checkpointing import VALUE_MODEL_DIR, PPOCheckpointMixin, ppo_state_file
from .completions_log import CompletionsLog
from .episodes.multi_turn import MultiTurnRollout
from .episodes.toolbox import Toolbox
from .episodes.turn_rewards import TurnRewards
from .evaluation import EvaluateMixin, Evaluation
from .config import PPOConfig, ppo_config_from
from .config_rules import check_trainer_inputs
from .objective.critic import build_critic, check_value_model, group_prompts, repeat_prompts
from .objective.critic_warmup import CriticWarmup
from .objective.value_parameters import with_critic_learning_rate
from .rollout.dynamic_sampling import DynamicSampling
from .objective.kl_controllers import KLController, build_kl_controller
from .objective.objectives import ObjectiveConfig, kl_penalty, rollout_objective
from .rollout.prompt_stream import PromptStream
from .grpo_compat.grpo_inputs import grpo_inputs
from .micro_batches import objective_for_micro_batches, resolve_train_micro_batch
from .optimize_loop import GradientClip, MiniBatchPlan, UpdateSteps, run_ppo_epochs
from .base.parent_fixes import ParentFixesMixin, ParentInitArgs
from .ptx_data import PretrainingMix, PtxConfig
from .rollout.reward_funcs import (
    attach_reward_scorer,
    prepare_reward_funcs,
)
from .rollout import MicroBatchOutput, Rollout, UpdateStats
from .rollout.chunk import AUTO, resolve_auto_rollout_chunk
from .rollout.sampling import rollout_generation_kwargs
from .rollout.steps import RolloutStepsMixin
from .shared_base_roles import check_shared_base_roles
from .update_metrics import UpdateMetricsMixin
from .rollout.decode_graphs import DecodeGraphs
from .rollout.engine import build_rollout_engine
from .rollout.sequences import INVALID_LOGPROB, forward

__all__ = ["PPOConfig", "PPOTrainer", "VALUE_MODEL_DIR", "ppo_state_file"]

class PPOTrainer(RolloutStepsMixin, UpdateMetricsMixin, EvaluateMixin, ParentFixesMixin, PPOCheckpointMixin,
                 AtomicCheckpointMixin, ParentPPOTrainer):
    """TRL's PPO trainer (see :mod:`trl_ext.ppo.base`) with trl-ext's extensions. Takes TRL's arguments and
    GRPOTrainer's (:mod:`trl_ext.ppo.grpo_compat.grpo_inputs`), plus `ptx_dataset`, `kl_controller`, `reward_funcs`,
    `tools` and `environment_factory`: docs/ppo.md, "The trainer's arguments"."""

    _tag_names = ["trl", "ppo", "trl-ext"]

    def __init__(
        self,
        args: PPOConfig,
        processing_class=None,
        model=None,
        ref_model=None,
        reward_model=None,
        train_dataset=None,
        value_model=None,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
        ptx_dataset=None,
        kl_controller: KLController | None = None,
        reward_funcs=None,
        tools=None,
        environment_factory=None,
    ) -> None:
        # GRPOTrainer's inputs: a GRPOConfig, model ids, `prompt` datasets (trl_ext/ppo/grpo_compat/grpo_inputs.py)
        args = ppo_config_from(args)
        (args, processing_class, model, ref_model, reward_model, value_model, reward_funcs, train_dataset,
         eval_dataset) = grpo_inputs(args, processing_class, model, ref_model, reward_model, value_model, reward_funcs,
                                     train_dataset, eval_dataset, multi_turn=bool(tools or environment_factory))
        if not isinstance(args, PPOConfig):
            raise UserInputError(f"args: expected a trl_ext.PPOConfig, got {type(args).__name__}")
        ptx_dataset = check_trainer_inputs(args, ptx_dataset, kl_controller,  # the trainer's own arguments
                                           eval_dataset, multi_turn=bool(tools or environment_factory))
        value_model = check_value_model(args, value_model)  # critic-free: a stand-in without parameters
        if args.critic_learning_rate is not None and optimizers[0] is not None:
            raise UserInputError("critic_learning_rate: sets the value model's parameter groups of the optimizer the "
                                 "trainer builds, and an optimizer was passed; set the rates in your optimizer's "
                                 "groups instead, or pass none")
        toolbox = None
        if tools or environment_factory:  # multi-turn episodes (trl_ext/ppo/episodes): TRL's contract
            toolbox = Toolbox.for_trainer(tools, environment_factory, processing_class, args, train_dataset)
            train_dataset = toolbox.render_dataset(train_dataset)  # prompt lengths with the tools' schema
            reward_funcs = toolbox.with_environment_rewards(reward_funcs)
        reward_model, data_collator, reward_list = prepare_reward_funcs(
            args, processing_class, reward_model, reward_funcs, data_collator,
            getattr(train_dataset, "column_names", None),  # each function's signature against the columns
            extra_keywords=("environments",) if toolbox is not None and toolbox.factories else ())
        if peft_config is not None and isinstance(model, nn.Module):  # as the loaders and `trl-ext check` do
            check_lora_targets(model, peft_config)
        self.shared_base = check_shared_base_roles(model, reward_model, value_model, peft_config, args)
        if args.fp16:  # the loss scaler needs float32 gradients (trl_ext.models.dtypes)
            float32_trainable_parameters(model, value_model)

        with deepspeed_gradient_clipping(args.max_grad_norm):  # DeepSpeed: the engine clips at max_grad_norm
            # the parent's view of the config: its kl_estimator check knows k1/k3 only (ParentInitArgs)
            super().__init__(args=ParentInitArgs(args), processing_class=processing_class, model=model,
                             ref_model=ref_model, reward_model=reward_model, train_dataset=train_dataset,
                             value_model=value_model, data_collator=data_collator, eval_dataset=eval_dataset,
                             optimizers=optimizers, callbacks=callbacks, peft_config=peft_config)
        self.args = args
        self.build_features(reward_list, ptx_dataset, kl_controller, toolbox)

    def build_features(self, reward_list, ptx_dataset, kl_controller: KLController | None, toolbox=None) -> None:
        """After the parent's ``__init__``: each extension's one object, built once from the config (None when it is
        off): the objective's keys, reward-function scoring, the critic (a value model or a critic-free estimator;
        never None), the rollout chunk and engine, the KL controller, the pretraining mix, the completions log,
        dynamic sampling, multi-turn episodes with tools (``toolbox``: :class:`~trl_ext.ppo.episodes.toolbox.Toolbox`),
        the NaN/inf guard."""
        args, processing_class = self.args, self.processing_class
        # the loss keys of trl_ext.ppo.objective.objectives (train_micro_batch_size: token_mean over the mini-batch)
        self.objective = objective_for_micro_batches(ObjectiveConfig.from_args(args), args)
        # Nothing below may touch the global torch/numpy RNGs: the parent left them exactly where its train() expects.
        self.reward_scoring = attach_reward_scorer(self, reward_list)  # reward_funcs (None without): the scorer
        # with or without a value model (the budgets below ask it)
        self.critic = build_critic(args, self.accelerator, multi_turn=toolbox is not None)
        # critic_warmup: the first updates train the value model alone (None when 0)
        self.critic_warmup = CriticWarmup.build(args, self.accelerator.unwrap_model(self.model))
        group_prompts(self)  # num_samples_per_prompt > 1: local_batch_size / k prompts per update (same RNG after)
        if len(self.dataloader) == 0:  # it drops its incomplete batch: an epoch without one would never end
            raise UserInputError(
                f"train_dataset has {len(self.train_dataset)} rows, fewer than one batch of "
                f"{self.local_dataloader_batch_size} prompts per process (the incomplete batch is dropped): use more "
                "prompts or a smaller per_device_train_batch_size / gradient_accumulation_steps")
        if args.local_rollout_forward_batch_size == AUTO:  # the largest chunk that fits args.max_memory_gib
            self.rollout_chunk_choice = resolve_auto_rollout_chunk(self)
        self.rollout_engine = build_rollout_engine(self)  # None: generate; else continuous batching (auto: a rule)
        # rollout_cuda_graphs: generate's decoding steps as CUDA graphs over a static cache (None: off)
        self.decode_graphs = DecodeGraphs.build(args, self.rollout_engine, self.accelerator)
        # HF Trainer.__init__ (which TRL's PPO never calls) sets these; its checkpoint save/load code reads them
        for name in ("is_fsdp_xla_enabled", "is_fsdp_xla_v1_enabled", "is_fsdp_xla_v2_enabled"):
            if not hasattr(self, name):
                setattr(self, name, False)
        self.kl_ctl = (
            kl_controller
            if kl_controller is not None
            else build_kl_controller(args.kl_controller, args.kl_coef, args.kl_target, args.kl_horizon)
        )
        self.ptx = (PretrainingMix(ptx_dataset, processing_class, PtxConfig.from_args(args), self.accelerator)
                    if ptx_dataset is not None else None)
        self.completions_log = (CompletionsLog.from_args(args, processing_class, self.accelerator)
                                if args.log_completions else None)
        self.dynamic_sampling = (DynamicSampling.from_args(args, self.accelerator, processing_class.pad_token_id)
                                 if args.dynamic_sampling else None)
        self.multi_turn = MultiTurnRollout(toolbox, args, processing_class) if toolbox is not None else None
        self.turn_rewards = TurnRewards.build(toolbox, self.accelerator)  # environments' get_turn_reward (or None)
        self.evaluation = Evaluation.build(self)  # eval_strategy "steps": eval_dataset generated on and scored
        if self.multi_turn is not None:
            self.multi_turn.check_launch(self)
            if self.rollout_engine is not None:
                self.multi_turn.engine_prompt_length = self.rollout_engine.plan.prompt_length
        self.prompt_iterator = None
        self._update_start_state = None
        self._optimizer_stepped = False
        self._mini_batch_plan = None
        self.step_guard = StepGuard(args.nonfinite_policy, args.max_consecutive_nonfinite_skips,
                                    (self.accelerator, self.stop_on_nonfinite) if self.is_deepspeed_enabled else None)
        self.grad_clip = GradientClip(args.max_grad_norm, self.accelerator, self.model)  # max_grad_norm (0: off)

    # ------------------------------------------------------------------ the loop

    def train(self, resume_from_checkpoint: str | bool | None = None):
        """Run PPO for `args.num_total_batches` updates (from `self.state.global_step + 1`).

        Args:
            resume_from_checkpoint (`str` or `bool`, *optional*):
                A checkpoint folder to continue from, or `True` for the latest complete `checkpoint-N` in
                `args.output_dir`. Restores weights, optimizer, scheduler, KL controller, data positions and RNGs.

        Raises:
            TrainingInterrupted: on SIGINT/SIGTERM, after saving a checkpoint at the end of the current update.
            NonFiniteError: on NaN/inf scores or losses, after saving the state before the update when possible.
        """
        checkpoint = resolve_checkpoint(resume_from_checkpoint, self.args.output_dir)
        args = self.args
        self.model.train()
        self.init_train_state(checkpoint)
        self.init_data_streams()
        if checkpoint is not None:
            self.load_checkpoint(checkpoint)
        self.accelerator.print("===training policy===")
        self.start_time = time.time()
        with watch_signals(self) as interruption:
            try:
                for update in range(self.state.global_step + 1, args.num_total_batches + 1):
                    self.run_update(update)
                    if self.control.should_training_stop:
                        break
            finally:
                if self.reward_scoring is not None:
                    self.reward_scoring.close()  # the reward workers (restarted by the next train())
                if self.multi_turn is not None:
                    self.multi_turn.close()  # the tool workers (restarted by the next train())
            # HF trainer specifics
            self.control = self.callback_handler.on_train_end(args, self.state, self.control)
            if self.control.should_save:
                self._save_checkpoint(self.model, trial=None)
                self.control = self.callback_handler.on_save(self.args, self.state, self.control)
        raise_if_interrupted(self, interruption)

    def init_train_state(self, checkpoint: str | None = None) -> None:
        """Reset `self.state` (global step 0, episode 0, logging/eval/save steps) and call `on_train_begin`.

        With a `checkpoint`, the state (global step, episode, log history) comes from its `trainer_state.json`.
        """
        args = self.args
        if checkpoint is not None:
            state = OnlineTrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
            state.is_local_process_zero = self.is_local_process_zero()
            state.is_world_process_zero = self.is_world_process_zero()
            self.state = state
        else:
            self.state.global_step = 0
            self.state.episode = 0
        self.state.max_steps = args.num_total_batches
        self.state.num_train_epochs = args.total_episodes / self.train_dataset_len
        # Compute absolute values for logging, eval, and save if given as ratio
        for name in ("logging_steps", "eval_steps", "save_steps"):
            value = getattr(args, name)
            if value is not None:
                setattr(self.state, name, math.ceil(self.state.max_steps * value) if value < 1 else value)
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if self.is_deepspeed_enabled:  # backward compatibility
            self.deepspeed = self.model
            self.model_wrapped = self.model

    def init_data_streams(self) -> None:
        """Create `self.prompt_iterator` (endless and resumable, over `self.dataloader`) and the generation config."""
        self.prompt_iterator = PromptStream(self.dataloader)
        self.generation_kwargs = rollout_generation_kwargs(self.args)  # TRL's, with the sampling keys
        self.generation_config = GenerationConfig(**self.generation_kwargs)

    def run_update(self, update: int) -> None:
        """One PPO update: rollouts, scoring, rewards, advantages, optimisation, logging, callbacks, checkpoint."""
        args = self.args
        self._update_start_state = self.capture_update_start()
        self._optimizer_stepped = False
        self.state.episode += 1 * args.batch_size
        data = self.next_prompt_batch()
        t0 = time.perf_counter()
        with torch.no_grad():
            rollout, scored, t1 = self.sample_and_score(data)
            if scored:
                rollout = self.resample_groups(rollout)  # dynamic_sampling: more rounds, informative groups only
                kl_coef = float(self.kl_ctl.value)
                self.compute_rewards(rollout, kl_coef)
                self.compute_advantages(rollout)
            empty_cache()  # between phases, as TRL
        if scored:
            t2 = time.perf_counter()
            stats = self.optimize(rollout, kl_coef)
            t3 = time.perf_counter()
            timings = {"time/rollout": t1 - t0, "time/scoring": t2 - t1, "time/optimization": t3 - t2}
            with torch.no_grad():
                metrics = self.update_metrics(rollout, stats, kl_coef, timings)
        else:  # NaN/inf scores under nonfinite_policy "skip": the update is dropped (nor scheduler nor KL step)
            metrics = {**self.step_guard.metrics(), "episode": self.state.episode}
        self.state.epoch = self.state.episode / self.train_dataset_len  # the update is done: the one place the
        self.state.global_step += 1  # step counter advances
        self.log_update(metrics)
        if scored:
            self.kl_ctl.update(metrics["objective/kl"], args.batch_size)  # the KL controller's one step
            if self.completions_log is not None:
                self.completions_log.log(rollout, self.state.global_step)
            if stats.stepped:  # False only when the guard skipped every optimizer step of the update
                self.lr_scheduler.step()
        self.control = self.callback_handler.on_step_end(args, self.state, self.control)
        if self.control.should_evaluate and self.evaluation is not None:  # every eval_steps updates (HF's flow)
            self.evaluate()
        if args.num_sample_generations > 0 and (update - 1) % self.sample_generations_freq == 0:
            self.generate_completions(sampling=True)
        del rollout
        release_memory()  # gc.collect() once per update, on accelerators only
        # After the sample generations (TRL saves before them): they draw from the torch RNG, and the checkpoint's
        # RNG state must be the one the next update starts from.
        if self.control.should_save:
            self._save_checkpoint(self.model, trial=None)
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)

    def sample_and_score(self, data: dict, where: str = "") -> tuple[Rollout, bool, float]:
        """Steps 2 and 3 for one prompt batch (the update's, or a dynamic-sampling round's): `generate_rollouts`,
        `score_rollouts`, the NaN/inf check of the scores and `clip_scores`. Returns the rollout, whether its scores
        are finite (else the guard's `skip`) and `time.perf_counter()` when generation ended."""
        if self.multi_turn is not None:  # tools: environments reset, prompts rendered with their tools
            data = self.multi_turn.begin(data)
        if self.reward_scoring is not None:  # reward_funcs: prompts and dataset columns of this batch
            self.reward_scoring.begin(data, self.state)
        rollout = self.generate_rollouts(data["input_ids"].to(self.accelerator.device))
        generated = time.perf_counter()
        self.score_rollouts(rollout)
        scored = self.check_finite("objective/scores", rollout.scores, "rollouts", where=where)
        if scored:
            self.clip_scores(rollout)
        return rollout, scored, generated

    def resample_groups(self, rollout: Rollout) -> Rollout:
        """`dynamic_sampling`: the update's rollout from more rounds, informative groups only
        (:class:`~trl_ext.ppo.rollout.dynamic_sampling.DynamicSampling`; each round through `next_prompt_batch` and
        `sample_and_score`); `rollout` unchanged when off."""
        if self.dynamic_sampling is None:
            return rollout
        return self.dynamic_sampling.resample(
            rollout, lambda where: self.sample_and_score(self.next_prompt_batch(), where=where))

    def check_finite(self, quantity: str, tensor: torch.Tensor, unit: str, where: str = "") -> bool:
        """True if `tensor` is finite on all processes, else False (`skip`) or `stop_on_nonfinite` (`stop`)."""
        counts = count_nonfinite(tensor, self.accelerator)
        if counts.ok:
            return True
        return self.step_guard.apply(Finding(quantity, counts, unit, where), self.stop_on_nonfinite)

    def stop_on_nonfinite(self, finding: Finding) -> None:
        """Raise :class:`~trl_ext.runtime.nonfinite.NonFiniteError` for `finding` (scores, a loss, gradients). If no
        optimizer step was taken in this update yet, the state before the update is saved first (`checkpoint-N`, N =
        completed updates); else the weights have already moved and the error names the latest complete checkpoint.
        """
        if not self._optimizer_stepped and self._update_start_state is not None:
            checkpoint, saved = self.save_update_start_checkpoint(), True
        else:
            checkpoint, saved = latest_checkpoint(self.args.output_dir), False
        raise NonFiniteError(self.state.global_step + 1, finding.quantity, finding.counts, finding.unit, checkpoint,
                             saved=saved, where=finding.where + self.step_guard.stop_note())

    def optimizer_step(self) -> bool:
        """`optimizer.step()` after checking the step's losses and gradients (one host sync per optimizer step) and
        clipping the gradients to `max_grad_norm` (`self.grad_clip`); during `critic_warmup` the policy's gradients
        are dropped first (the step skips it). True when the step was taken."""
        if self.critic_warmup is not None:
            self.critic_warmup.hold()
        stepped = guarded_optimizer_step(self.step_guard, self.optimizer, self.accelerator, self.stop_on_nonfinite,
                                         before_step=self.grad_clip)
        self._optimizer_stepped |= stepped  # the weights moved in this update: no rewinding it (stop_on_nonfinite)
        return stepped

    def clip_scores(self, rollout: Rollout) -> None:
        """With `args.reward_clip = c`, clip the scores to `[-c, c]` (DeepSpeed-Chat's `clip_reward_value`, trlx's
        `cliprange_reward`) and keep the clipped fraction in `rollout.scores_clipfrac`. Runs after the
        `missing_eos_penalty` and before the rewards are built."""
        clip = self.args.reward_clip
        if clip is None:
            return
        rollout.scores_clipfrac = (rollout.scores.abs() > clip).float().mean()
        rollout.scores = rollout.scores.clamp(-clip, clip)

    # ------------------------------------------------------------------ data

    def next_prompt_batch(self) -> dict:
        """The next batch of `args.local_batch_size` tokenized prompts (cycles over the train set forever)."""
        return repeat_prompts(next(self.prompt_iterator), self.args.num_samples_per_prompt)

    def compute_rewards(self, rollout: Rollout, kl_coef: float) -> None:
        """The per-token KL to the reference (`kl_estimator`; default k1, as TRL) and the environments' per-turn
        rewards, then the critic's per-token reward at this update's `kl_coef` (``self.critic.rewards``)."""
        rollout.kl = kl_penalty(rollout.logprobs, rollout.ref_logprobs, self.objective.reward_kl_estimator)
        if self.turn_rewards is not None:
            rollout.turn_rewards = self.turn_rewards.tensor(rollout, like=rollout.kl)
        rollout.rewards = self.critic.rewards(rollout, kl_coef)

    def compute_advantages(self, rollout: Rollout) -> None:
        """Advantages and value targets from the critic (``self.critic.advantages``): GAE with a value model, else the
        critic-free estimator."""
        self.critic.advantages(rollout)
        if self.reward_scoring is not None:  # reward_funcs: completions no reward scored
            self.reward_scoring.zero_unscorable(rollout)

    # ------------------------------------------------------------------ optimisation

    def create_optimizer(self):
        """HF's optimizer over policy and value model; with `critic_learning_rate`, the value model's parameters in
        groups of their own at that rate (the LR schedule, built after, scales every group's own rate)."""
        optimizer = super().create_optimizer()
        if self.args.critic_learning_rate is not None:
            with_critic_learning_rate(optimizer, self.model, self.args.critic_learning_rate)
        return optimizer

    def optimize(self, rollout: Rollout, kl_coef: float) -> UpdateStats:
        """`num_ppo_epochs` passes over the rollout, each in a fresh `np.random.permutation`, one optimizer step per
        mini-batch, forward/backward by micro-batch (:func:`trl_ext.ppo.optimize_loop.run_ppo_epochs`, calling this
        trainer's `compute_micro_batch_loss`, `optimizer_step` and `ptx_step`). During ``critic_warmup``'s updates only
        the value model trains (``self.critic_warmup``)."""
        if self.critic_warmup is not None:
            self.critic_warmup.begin(self.state.global_step)
        self.grad_clip.begin()  # policy/grad_norm: this update's steps
        ptx_mode = self.ptx.mode if self.ptx is not None and not self.policy_held else None
        steps = UpdateSteps(loss=self.compute_micro_batch_loss, step=self.optimizer_step,
                            zero_grad=self.optimizer.zero_grad, observe=self.step_guard.observe,
                            ptx_batch=self.next_ptx_batch if ptx_mode == "joint" else None,
                            ptx_step=self.ptx_step if ptx_mode == "separate" else None)
        return run_ppo_epochs(rollout, self.mini_batch_plan(), steps, self.accelerator, self.model,
                              kl_coef=kl_coef, deepspeed=self.is_deepspeed_enabled)

    def mini_batch_plan(self) -> MiniBatchPlan:
        """How each update's rollout is cut, built at the first update (``train_micro_batch_size: auto`` measures the
        memory then)."""
        if self._mini_batch_plan is None:
            micro = resolve_train_micro_batch(self) if self.args.train_micro_batch_size is not None else None
            self._mini_batch_plan = MiniBatchPlan.from_args(self.args, self.objective, micro)
        return self._mini_batch_plan

    @property
    def policy_held(self) -> bool:
        """True during ``critic_warmup``'s updates: no policy step (nor ptx batch) in this update's optimisation."""
        return self.critic_warmup is not None and self.critic_warmup.holding

    def compute_micro_batch_loss(
        self, model, rollout: Rollout, micro_batch_inds, ptx_batch: dict | None = None, *,
        kl_coef: float, token_normalizer: torch.Tensor | None = None,
    ) -> MicroBatchOutput:
        """Loss of one micro-batch: `pg_loss + vf_coef * vf_loss` (+ KL and entropy terms of the objective,
        :func:`trl_ext.ppo.objective.objectives.objective_terms`; + `ptx_coef * lm_loss` in joint ptx mode). `kl_coef`: the
        update's (read once in `run_update`); `token_normalizer`: the mini-batch's (`global_token_mean`)."""
        args = self.args
        context_length = rollout.context_length
        padding_mask = rollout.padding_mask[micro_batch_inds]
        responses = rollout.responses[micro_batch_inds]
        # the logits of the positions that predict a response token alone (as TRL's GRPOTrainer asks for them)
        output, vpred_temp = forward(model, rollout.query_responses[micro_batch_inds],
                                     self.processing_class.pad_token_id, logits_to_keep=responses.shape[1] + 1)
        logits = output.logits[:, :-1]
        logits /= args.temperature + 1e-7
        new_logprobs = selective_log_softmax(logits, responses)
        new_logprobs = torch.masked_fill(new_logprobs, padding_mask, INVALID_LOGPROB)
        vf = self.critic.value_loss(vpred_temp, rollout, micro_batch_inds, logits.device)  # zero without a critic
        obj = rollout_objective(self.objective, rollout, micro_batch_inds, new_logprobs, logits, kl_coef,
                                token_normalizer)
        value_term = args.vf_coef * vf.loss
        loss = obj.policy.loss + value_term
        if obj.penalty is not None:  # kl_coef * KL (kl_in="loss") - entropy_coef * entropy
            loss = loss + obj.penalty
        ptx_loss = None
        if ptx_batch is not None:
            ptx_loss = self.compute_ptx_loss(ptx_batch)
            loss = loss + self.ptx.coef * ptx_loss
        if self.critic_warmup is not None:  # critic_warmup: the value term alone while the policy is held
            loss = self.critic_warmup.loss(loss, value_term)
        return MicroBatchOutput(loss=loss, policy=obj.policy, value=vf, logits=logits, ptx_loss=ptx_loss,
                                kl_loss=obj.kl_loss, entropy=obj.entropy, entropy_loss=obj.entropy_loss)

    @property
    def ptx_stream(self):
        """The ptx batch stream (None without PPO-ptx); its position is saved in checkpoints."""
        return None if self.ptx is None else self.ptx.stream

    @property
    def ptx_dataset(self):
        """The tokenized ptx dataset (None without PPO-ptx)."""
        return None if self.ptx is None else self.ptx.dataset

    def next_ptx_batch(self) -> dict:
        """The next ptx micro-batch (:class:`~trl_ext.ppo.ptx_data.PretrainingMix`; its own data order, cycled)."""
        return self.ptx.next_batch()

    def compute_ptx_loss(self, batch: dict) -> torch.Tensor:
        """The policy's LM loss on a ptx batch (:func:`trl_ext.ppo.objective.losses.ptx_lm_loss`)."""
        policy = self.accelerator.unwrap_model(self.model).policy
        return self.ptx.lm_loss(policy, batch, self.accelerator.device)

    def ptx_step(self) -> torch.Tensor:
        """DeepSpeed-Chat's separate ptx step (`ptx_mode="separate"`): backward of `ptx_coef * lm_loss` on the next
        ptx batch, then an optimizer step; returns the LM loss (detached)."""
        lm_loss = self.compute_ptx_loss(self.next_ptx_batch())
        self.step_guard.observe(lm_loss, "loss/ptx")
        self.ptx.backward_separate(lm_loss, self.accelerator, self.accelerator.unwrap_model(self.model).policy)
        self.optimizer_step()
        self.optimizer.zero_grad()
        return lm_loss.detach()
