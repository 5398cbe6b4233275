"""PPO trainer: TRL 1.12's `experimental.ppo.PPOTrainer` (:mod:`trl_ext.ppo.base`) with extensions, and a training
loop made of named steps that a subclass overrides one at a time. Each step delegates to a part built once in
``__init__`` from what it reads (the rollout and scoring: :class:`~.rollout.steps.RolloutSteps`; the metrics:
:class:`~.update_metrics.UpdateMetrics`; evaluation: :class:`~.evaluation.Evaluation`; checkpoints:
:class:`~trl_ext.runtime.checkpoints.PPOCheckpoints`; the extensions: :mod:`.features`). The steps: docs/ppo.md,
"One update, step by step"."""

from __future__ import annotations

import math
import os
import time

import torch

from ..errors import UserInputError
from ..runtime.checkpoints import (VALUE_MODEL_DIR, AtomicCheckpointMixin, PPOCheckpoints, latest_checkpoint,
                                   ppo_state_file, resolve_checkpoint)
from ..runtime.devices import empty_cache, release_memory
from ..runtime.interruption import raise_if_interrupted, watch_signals
from ..runtime.nonfinite import Finding, NonFiniteError, StepGuard, count_nonfinite, guarded_optimizer_step
from .base import OnlineTrainerState
from .base.parent_fixes import PPOParent
from .config import PPOConfig
from .evaluation import Evaluation
from .features import build_features
from .objective.critic_warmup import with_critic_learning_rate
from .objective.objectives import kl_penalty, rollout_objective
from .optimize_loop import GradientClip, MiniBatchPlan, UpdateSteps, run_ppo_epochs
from .rollout import MicroBatchOutput, Rollout, UpdateStats
from .rollout.logprobs import training_forward
from .rollout.prompt_stream import PromptStream, grouped_prompt_loader, repeat_prompts
from .rollout.sampling import RolloutSampling
from .rollout.steps import RolloutSettings, RolloutSteps, ScoringSteps
from .trainer_inputs import prepare_trainer_inputs
from .update_metrics import UpdateMetrics

__all__ = ["PPOConfig", "PPOTrainer", "VALUE_MODEL_DIR", "ppo_state_file"]


class PPOTrainer(AtomicCheckpointMixin, PPOParent):
    """TRL's PPO trainer (see :mod:`trl_ext.ppo.base`) with trl-ext's extensions. Takes TRL's arguments and
    GRPOTrainer's (:mod:`trl_ext.ppo.trainer_inputs`), plus `ptx_dataset`, `kl_controller`, `reward_funcs`,
    `tools` and `environment_factory`: docs/ppo.md, "The trainer's arguments"."""

    _tag_names = ["trl", "ppo", "trl-ext"]

    def __init__(self, args: PPOConfig, processing_class=None, model=None, ref_model=None, reward_model=None,
                 train_dataset=None, value_model=None, data_collator=None, eval_dataset=None, optimizers=(None, None),
                 callbacks=None, peft_config=None, ptx_dataset=None, kl_controller=None, reward_funcs=None, tools=None,
                 environment_factory=None) -> None:
        inputs = prepare_trainer_inputs(  # checked and converted before any of it runs (trainer_inputs.py)
            args, processing_class, model, ref_model, reward_model, train_dataset, value_model, data_collator,
            eval_dataset, optimizers, callbacks, peft_config, ptx_dataset, kl_controller, reward_funcs, tools,
            environment_factory)
        self.shared_base = inputs.shared_base
        super().__init__(inputs.args, **inputs.parent)  # the parent (PPOParent: its view of the config)
        self.build_features(inputs.reward_list, inputs.ptx_dataset, kl_controller, inputs.toolbox)

    def build_features(self, reward_list, ptx_dataset, kl_controller, toolbox=None) -> None:
        """After the parent's ``__init__``: the prompt loader of ``num_samples_per_prompt`` groups, each extension's
        one object (:func:`~.features.build_features`; kept as attributes of the same names), the NaN/inf guard,
        the gradient clip, and the parts the steps delegate to, each built from what it reads."""
        args, accelerator = self.args, self.accelerator
        grouped = grouped_prompt_loader(args.num_samples_per_prompt, args.local_batch_size, self.train_dataset,
                                        self.data_collator, accelerator, args.seed, self.local_seed)
        if grouped is not None:  # local_batch_size / k prompts per update (the torch RNG where the parent left it)
            self.dataloader = grouped
            self.local_dataloader_batch_size = args.local_batch_size // args.num_samples_per_prompt
        if len(self.dataloader) == 0:  # it drops its incomplete batch: an epoch without one would never end
            raise UserInputError(
                f"train_dataset has {len(self.train_dataset)} rows, fewer than one batch of "
                f"{self.local_dataloader_batch_size} prompts per process (the incomplete batch is dropped): use more "
                "prompts or a smaller per_device_train_batch_size / gradient_accumulation_steps")
        self.prompt_length = max(len(ids) for ids in self.train_dataset["input_ids"])
        f = build_features(args, processing_class=self.processing_class, accelerator=accelerator, model=self.model,
                           reward_model=self.reward_model, prompt_length=self.prompt_length,
                           shared_base=self.shared_base, reward_list=reward_list, ptx_dataset=ptx_dataset,
                           kl_controller=kl_controller, toolbox=toolbox, fsdp=getattr(self, "is_fsdp_enabled", False))
        self.objective, self.reward_model, self.reward_scoring, self.critic = (f.objective, f.reward_model,
                                                                               f.reward_scoring, f.critic)
        self.critic_warmup, self.rollout_chunk_choice, self.decode_graphs = (f.critic_warmup, f.rollout_chunk_choice,
                                                                             f.decode_graphs)
        self.rollout_engine, self.rollout_engine_choice, self.kl_ctl = (f.rollout_engine, f.rollout_engine_choice,
                                                                        f.kl_ctl)
        self.ptx, self.completions_log, self.dynamic_sampling = f.ptx, f.completions_log, f.dynamic_sampling
        self.multi_turn, self.turn_rewards = f.multi_turn, f.turn_rewards
        self.step_guard = StepGuard(args.nonfinite_policy, args.max_consecutive_nonfinite_skips,
                                    (accelerator, self.stop_on_nonfinite) if self.is_deepspeed_enabled else None)
        self.grad_clip = GradientClip(args.max_grad_norm, accelerator, self.model)  # max_grad_norm (0: off)
        self.rollout_steps = RolloutSteps(  # steps 2 and 3
            RolloutSettings.from_args(args, self.processing_class, self.stop_token_id), model=self.model,
            ref_model=self.ref_model, reward_model=self.reward_model, accelerator=accelerator,
            reference_context=self.null_ref_context, critic=self.critic, reward_scoring=self.reward_scoring,
            multi_turn=self.multi_turn, rollout_engine=self.rollout_engine, decode_graphs=self.decode_graphs)
        self.metrics = UpdateMetrics(  # step 7
            accelerator=accelerator, eos_token_id=self.processing_class.eos_token_id, objective=self.objective,
            critic=self.critic, grad_clip=self.grad_clip, step_guard=self.step_guard,
            critic_warmup=self.critic_warmup, reward_scoring=self.reward_scoring, turn_rewards=self.turn_rewards,
            decode_graphs=self.decode_graphs)
        self.evaluation = Evaluation.build(  # eval_strategy "steps": eval_dataset generated on and scored
            args, dataset=self.eval_dataset, reward_scoring=self.reward_scoring, data_collator=self.data_collator,
            model=self.model, accelerator=accelerator, processing_class=self.processing_class,
            reward_model=self.reward_model)
        self.checkpoints = PPOCheckpoints(  # what a checkpoint adds to HF's; the state before an update
            accelerator=accelerator, model=self.model, value_model=self.critic.has_value_model,
            should_save=args.should_save, deepspeed=self.is_deepspeed_enabled, kl_controller=self.kl_ctl,
            ptx_stream=self.ptx_stream)
        self.prompt_iterator, self.sampling = None, None  # train()'s (init_data_streams)
        self._update_start_state, self._optimizer_stepped, self._mini_batch_plan = None, False, None

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
        """Create `self.prompt_iterator` (endless and resumable, over `self.dataloader`) and the rollout's generation
        settings from the config (`self.sampling`)."""
        self.prompt_iterator = PromptStream(self.dataloader)
        self.sampling = RolloutSampling.from_args(self.args)  # TRL's generation config, with the sampling keys

    @property
    def generation_config(self):
        """The rollout's `GenerationConfig` (``self.sampling``'s, built by `init_data_streams`)."""
        return self.sampling.config

    def run_update(self, update: int) -> None:
        """One PPO update: rollouts, scoring, rewards, advantages, optimisation, the step counter and the KL
        controller (here only), logging, callbacks, checkpoint."""
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

    # ------------------------------------------------------------------ steps 1-3: prompts, rollout, scoring

    def next_prompt_batch(self) -> dict:
        """The next batch of `args.local_batch_size` tokenized prompts (cycles over the train set forever)."""
        return repeat_prompts(next(self.prompt_iterator), self.args.num_samples_per_prompt)

    def generate_rollouts(self, queries: torch.Tensor) -> Rollout:
        """Sample one response per query with the policy and keep its log-probs under the temperature-scaled full
        distribution (the loss's), each turn by `sample_turn`; with ``tools`` a multi-turn episode
        (:meth:`~.rollout.steps.RolloutSteps.generate`)."""
        return self.rollout_steps.generate(queries, self.sampling, self.sample_turn, self.submit_rollout_chunk)

    def sample_turn(self, policy, queries: torch.Tensor, max_new_tokens: int, on_chunk=None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """At most ``max_new_tokens`` tokens after each left-padded query: ``(query_responses, logprobs)``
        (:meth:`~.rollout.steps.RolloutSteps.sample_turn`); ``on_chunk(start, responses)`` as each chunk is done."""
        return self.rollout_steps.sample_turn(policy, queries, max_new_tokens, self.sampling, on_chunk)

    def score_rollouts(self, rollout: Rollout) -> None:
        """Reference log-probs, values and scores, per chunk of `local_rollout_forward_batch_size`; then masks
        (:meth:`~.rollout.steps.RolloutSteps.score`, calling the four steps below)."""
        self.rollout_steps.score(rollout, ScoringSteps(self.compute_ref_logprobs, self.postprocess_responses,
                                                       self.compute_values, self.compute_scores))

    def submit_rollout_chunk(self, start: int, responses: torch.Tensor) -> None:
        """Right after a chunk (or a continuous-batching row) is generated: with reward functions in workers, its
        truncated responses go to them, scored while the rest generates."""
        if self.reward_scoring is not None:
            self.rollout_steps.submit_chunk(start, self.postprocess_responses(responses))

    def compute_ref_logprobs(self, query_response: torch.Tensor, response: torch.Tensor, context_length: int
                             ) -> torch.Tensor:
        """Log-probs of `response` under the reference model (the LoRA policy with adapters off if none given)."""
        return self.rollout_steps.ref_logprobs(query_response, response, context_length)

    def postprocess_responses(self, responses: torch.Tensor) -> torch.Tensor:
        """Truncate each response after the first stop token (pad the rest), if a stop token is set."""
        return self.rollout_steps.postprocess(responses)

    def compute_values(self, query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """Per-response-token values `(batch, response_length)` from the run's critic (zeros without one)."""
        return self.rollout_steps.values(query_response, context_length)

    def compute_scores(self, postprocessed_query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """Reward-model score `(batch,)` of each (truncated) query+response: the head's output at its last token.
        With `reward_funcs`: `(batch, models)`, the scores of the reward models among them (functions come later)."""
        return self.rollout_steps.scores(postprocessed_query_response, context_length)

    @property
    def reward_scorer(self):
        """The :class:`~trl_ext.rewards.scoring.RewardScorer` of `reward_funcs` (None without)."""
        return None if self.reward_scoring is None else self.reward_scoring.scorer

    # ------------------------------------------------------------------ steps 4-5: rewards, advantages

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

    # ------------------------------------------------------------------ step 6: optimisation

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
        memory then; the micro-batch is kept in ``self.train_micro_batch``)."""
        if self._mini_batch_plan is None:
            unwrapped = self.accelerator.unwrap_model(self.model)
            self._mini_batch_plan = MiniBatchPlan.for_run(
                self.args, self.objective, self.accelerator, getattr(unwrapped, "policy", unwrapped),
                self.prompt_length, shared=bool(self.shared_base), value_model=self.critic.has_value_model,
                reward_model=self.reward_model is not None)
            self.train_micro_batch = self._mini_batch_plan.micro
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
        logits, new_logprobs, vpred_temp = training_forward(  # the logits of the response positions alone
            model, rollout.query_responses[micro_batch_inds], rollout.responses[micro_batch_inds],
            rollout.padding_mask[micro_batch_inds], self.processing_class.pad_token_id, args.temperature)
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

    # ------------------------------------------------------------------ step 7: metrics; evaluation

    def update_metrics(self, rollout: Rollout, stats: UpdateStats, kl_coef: float, timings: dict) -> dict:
        """TRL's metrics of one update (same names and formulas), plus `objective/kl_coef`, `loss/ptx_avg`, `time/*`,
        and the extensions' (`docs/metrics.md`; :class:`~.update_metrics.UpdateMetrics`). Changes nothing."""
        return self.metrics.compute(rollout, stats, kl_coef, timings, episode=self.state.episode,
                                    seconds=time.time() - self.start_time, lr=self.lr_scheduler.get_last_lr()[0])

    def log_update(self, metrics: dict) -> None:
        """Log the update's `metrics` (``run_update`` has advanced the step counter; it steps the KL controller
        after)."""
        self.log(metrics)

    def evaluate(self, *args, **kwargs) -> dict:
        """Score `eval_dataset` now with the current policy, log the `eval_*` metrics and call the callbacks'
        `on_evaluate`; returns the metrics. The update loop calls it when `control.should_evaluate` is set (HF's
        `DefaultFlowCallback`: every `eval_steps` updates). Needs `eval_strategy` "steps" (arguments are ignored)."""
        if self.evaluation is None:
            raise UserInputError("evaluate: needs eval_strategy 'steps' and an eval_dataset when the trainer is built")
        metrics = self.evaluation.run(self.state, self.postprocess_responses)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    # ------------------------------------------------------------------ step 8: checkpoints

    def save_extra_checkpoint_files(self, checkpoint_dir: str) -> None:
        """Add to a checkpoint what HF's `_save_checkpoint` leaves out for PPO: the value model (main process) and
        each process's trl-ext state (KL controller, prompt and ptx stream positions)."""
        self.checkpoints.save(checkpoint_dir, self.prompt_iterator)

    def load_checkpoint(self, checkpoint: str) -> None:
        """Restore weights, optimizer, LR scheduler, KL controller, data stream positions and RNG states. Called by
        `train(resume_from_checkpoint=...)` after `init_train_state` (which restored `self.state`) and
        `init_data_streams`."""
        extra = self.checkpoints.read(checkpoint)  # refuses a checkpoint this run cannot resume from
        self.checkpoints.load_weights(checkpoint)
        self._load_optimizer_and_scheduler(checkpoint)
        self.checkpoints.load_state(extra, checkpoint, self.prompt_iterator)
        self._load_rng_state(checkpoint)

    def capture_update_start(self) -> dict:
        """What an update changes before its first optimizer step: episode count, RNG states, data positions."""
        return self.checkpoints.capture(self.state.episode, self.prompt_iterator)

    def save_update_start_checkpoint(self) -> str:
        """Rewind episode, RNGs and data positions to the start of the current update and save `checkpoint-N`
        (N = completed updates). Only valid before the update's first optimizer step."""
        self.state.episode = self.checkpoints.rewind(self._update_start_state, self.prompt_iterator)
        self._save_checkpoint(self.model, trial=None)
        return self.last_checkpoint
