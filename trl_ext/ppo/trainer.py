"""PPO trainer: TRL 1.12's `experimental.ppo.PPOTrainer` with extensions and a training loop made of named steps.

The parent is TRL's trainer on TRL 1.10-1.12 and trl-ext's own copy of its behaviour from TRL 1.13 on
(:mod:`trl_ext.ppo.base` chooses); nothing below depends on which.

One update of :meth:`PPOTrainer.train` runs these methods in order; override one to change one step:

1. ``next_prompt_batch()``: the next batch of prompts from ``self.prompt_iterator``.
2. ``generate_rollouts(queries) -> Rollout``: sample responses and their log-probs (torch RNG), the log-probs taken
   as the tokens are sampled (:mod:`trl_ext.ppo.rollout_logprobs`).
3. ``score_rollouts(rollout)``: reference log-probs (``compute_ref_logprobs``), values (``compute_values``),
   truncation at the stop token (``postprocess_responses``), scores (``compute_scores``), padding masks.
   Then ``check_finite("objective/scores", ...)`` and ``clip_scores`` (``reward_clip``); ``sample_and_score(data)``
   runs steps 2-3 so, for the update's batch and for each dynamic-sampling round. Losses and gradients are
   checked once per optimizer step, before it (``optimizer_step``, :mod:`trl_ext.runtime.nonfinite`).
4. ``compute_rewards(rollout, kl_coef)``: per-token reward ``-kl_coef * KL`` plus the score at the last token.
5. ``compute_advantages(rollout)``: GAE (:func:`trl_ext.ppo.advantages.gae_advantages`) and whitening; with a
   critic-free ``advantage_estimator`` (RLOO, GRPO, REINFORCE++) :mod:`trl_ext.ppo.critic_free` instead (no value
   model; ``num_samples_per_prompt`` samples of each prompt, repeated by ``next_prompt_batch``).
6. ``optimize(rollout) -> UpdateStats``: PPO epochs (numpy permutation per epoch) over mini/micro-batches;
   each micro-batch calls ``compute_micro_batch_loss`` (policy, value and joint ptx losses from
   :mod:`trl_ext.ppo.losses`); separate ptx steps go through ``ptx_step``.
7. ``update_metrics(...) -> dict`` and ``log_update(metrics)``: TRL's metrics plus ours, then the KL controller
   (``self.kl_ctl``) updates from the update's ``objective/kl``.
8. Callbacks, sample generations, then the checkpoint if one is due (``save_extra_checkpoint_files`` adds the value
   model and the trl-ext state; ``load_checkpoint`` restores them on ``train(resume_from_checkpoint=...)``).

Reward and value models may be adapters on the policy's own base (:mod:`trl_ext.models.shared_base`): the steps are
the same; the reference then switches adapters without peft's ``disable_adapter`` (which would freeze the value
adapter) and ``save_model`` writes the policy's adapter only.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from torch import nn
from transformers import GenerationConfig
from trl.models.utils import unwrap_model_for_generation
from trl.trainer.utils import selective_log_softmax

from ..errors import UserInputError
from ..models.dtypes import float32_trainable_parameters
from ..models.lora import check_lora_targets
from ..models.scalar_heads import scalar_model_outputs
from ..models.shared_base import (
    adapter_switch,
    check_shared_base_roles,
    saving_policy_adapters_only,
    scalar_adapter_names,
)
from ..runtime.checkpoints import AtomicCheckpointMixin, latest_checkpoint, resolve_checkpoint
from ..runtime.devices import empty_cache, release_memory
from ..runtime.engines import gathered_parameters
from ..runtime.interruption import raise_if_interrupted, watch_signals
from ..runtime.nonfinite import Finding, NonFiniteError, StepGuard, count_nonfinite, guarded_optimizer_step
from .advantages import gae_advantages
from .base import OnlineTrainerState, ParentPPOTrainer
from .checkpointing import VALUE_MODEL_DIR, PPOCheckpointMixin, ppo_state_file
from .completions_log import log_completions
from .config import PPOConfig
from .critic_free import check_value_model, critic_free_advantages, critic_free_metrics, group_prompts, no_value_loss
from .critic_free import repeat_prompts
from .dynamic_sampling import resample_groups
from .kl_controllers import KLController, build_kl_controller
from .losses import ptx_lm_loss, value_loss
from .masked_stats import masked_whiten
from .objectives import ObjectiveConfig, kl_penalty, mini_batch_token_normalizer, objective_metrics, rollout_objective
from .prompt_stream import PromptStream
from .ptx_data import PtxStream, separate_ptx_step, tokenize_ptx_dataset
from .reward_funcs import (
    attach_reward_scorer,
    begin_reward_scoring,
    finish_reward_scoring,
    model_reward_scores,
    prepare_reward_funcs,
    reward_func_metrics,
    submit_rollout_chunk,
    zero_unscorable_advantages,
)
from .rollout import MicroBatchOutput, Rollout, UpdateStats
from .rollout_chunk import AUTO, resolve_auto_rollout_chunk
from .rollout_engine import build_rollout_engine
from .rollout_logprobs import generate_with_full_scores, generate_with_logprobs, sampling_plan, sequence_logits
from .sequences import INVALID_LOGPROB, first_true_indices, forward, truncate_response

__all__ = ["PPOConfig", "PPOTrainer", "VALUE_MODEL_DIR", "ppo_state_file"]

class PPOTrainer(PPOCheckpointMixin, AtomicCheckpointMixin, ParentPPOTrainer):
    """TRL's PPO trainer (see :mod:`trl_ext.ppo.base`) with value-clip modes, KL controllers, PPO-ptx and steps.

    Takes every argument of TRL's trainer (same order), plus:

    Args:
        ptx_dataset ([`~datasets.Dataset`], *optional*):
            Pretraining-mix data for PPO-ptx: plain text in a `text` column, or tokenized `input_ids`. Required
            when `args.ptx_coef > 0`; ignored with a warning when `args.ptx_coef == 0`.
        kl_controller ([`trl_ext.ppo.kl_controllers.KLController`], *optional*):
            Your own KL controller (any object with a float `value` and `update(kl, n_steps)`); overrides
            `args.kl_controller`. Its `value` is the coefficient of the next update's rewards.
        reward_funcs (`callable`, [`~torch.nn.Module`] or a list of them, *optional*):
            Rewards computed by programs, with TRL GRPO's contract (:mod:`trl_ext.rewards.contract`): each callable
            gets `prompts`, `completions`, `completion_ids`, every other column of `train_dataset` (one value per
            completion) and `trainer_state`, and returns one float or None per completion. Scalar-headed models
            (same tokenizer as the policy) may be mixed in. `reward_model` may then be None; when both are given the
            reward model is the first reward. The score is `sum_i reward_weights[i] * r_i` over the rewards that did
            not return None; it then goes through the same pipeline as a reward model's score. Guide:
            `docs/reward-functions.md`.

    `value_model` is None with a critic-free `args.advantage_estimator` (:mod:`trl_ext.ppo.critic_free`).
    `reward_model` and `value_model` may be [`trl_ext.models.shared_base.SharedBaseScalarModel`]s made by
    `add_scalar_adapter(model, ...)`: LoRA adapters with their own score heads on the policy's base (one base for
    policy, reference, reward and value; `peft_config` must then be None, the policy being a peft model already;
    `trainer.shared_base` is then True). The numbers are those of separate models with the same weights (tested).

    With every extension at its default it logs the same numbers as TRL's trainer (tested), plus
    `objective/kl_coef` and `time/rollout`, `time/scoring`, `time/optimization` (seconds per update), and
    `loss/ptx_avg` when ptx is on.

    Checkpoints (`save_strategy`/`save_steps`/`save_total_limit`, as in HF Trainer) are complete and atomic (written
    under `tmp-checkpoint-N`, then renamed): the policy (or its adapter) via `save_model`, the value model in
    `value_model/`, optimizer, LR scheduler, RNG states (`rng_state*.pth`), `trainer_state.json` (global step,
    episode, log history) and per process `trl_ext_ppo_state_{rank}.pt` (KL controller, prompt and ptx stream
    positions). `train(resume_from_checkpoint=...)` restores all of it, so a resumed run logs the same numbers as
    an uninterrupted one. SIGINT/SIGTERM during `train()` save a checkpoint at the end of the current update and
    raise :class:`trl_ext.runtime.interruption.TrainingInterrupted`. NaN/inf: `args.nonfinite_policy` (`check_finite`).
    """

    _tag_names = ["trl", "ppo", "trl-ext"]

    def __init__(
        self,
        args: PPOConfig,
        processing_class,
        model,
        ref_model,
        reward_model,
        train_dataset,
        value_model,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
        ptx_dataset=None,
        kl_controller: KLController | None = None,
        reward_funcs=None,
    ) -> None:
        if not isinstance(args, PPOConfig):
            raise UserInputError(f"args: expected a trl_ext.PPOConfig, got {type(args).__name__}")
        if args.ptx_coef > 0 and ptx_dataset is None:
            raise UserInputError(
                f"ptx_coef: is {args.ptx_coef} but no ptx_dataset was given; pass ptx_dataset= or set ptx_coef=0"
            )
        if ptx_dataset is not None and args.ptx_coef == 0:
            warnings.warn("ptx_dataset is ignored because ptx_coef is 0; set ptx_coef > 0 to use it", stacklevel=2)
            ptx_dataset = None
        if kl_controller is not None and not (
            hasattr(kl_controller, "value") and callable(getattr(kl_controller, "update", None))
        ):
            raise UserInputError("kl_controller: needs a `value` attribute and an `update(kl, n_steps)` method")
        value_model = check_value_model(args, value_model)  # critic-free: a stand-in without parameters
        reward_model, data_collator, reward_list = prepare_reward_funcs(
            args, processing_class, reward_model, reward_funcs, data_collator,
            getattr(train_dataset, "column_names", None))  # each function's signature against the columns
        if peft_config is not None and isinstance(model, nn.Module):  # as the loaders and `trl-ext check` do
            check_lora_targets(model, peft_config)
        self.shared_base = check_shared_base_roles(model, reward_model, value_model, peft_config, args)
        if args.fp16:  # the loss scaler needs float32 gradients (trl_ext.models.dtypes)
            float32_trainable_parameters(model, value_model)

        kl_estimator, args.kl_estimator = args.kl_estimator, "k1"  # TRL 1.12's __init__ takes k1/k3 only
        super().__init__(
            args=args,
            processing_class=processing_class,
            model=model,
            ref_model=ref_model,
            reward_model=reward_model,
            train_dataset=train_dataset,
            value_model=value_model,
            data_collator=data_collator,
            eval_dataset=eval_dataset,
            optimizers=optimizers,
            callbacks=callbacks,
            peft_config=peft_config,
        )
        args.kl_estimator = kl_estimator
        self.objective = ObjectiveConfig.from_args(args)  # the loss keys of trl_ext.ppo.objectives
        # Nothing below may touch the global torch/numpy RNGs: the parent left them exactly where its train() expects.
        attach_reward_scorer(self, reward_list)  # reward_funcs: the scorer (and its worker processes)
        group_prompts(self)  # num_samples_per_prompt > 1: local_batch_size / k prompts per update (same RNG after)
        if args.local_rollout_forward_batch_size == AUTO:  # the largest chunk that fits args.max_memory_gib
            self.rollout_chunk_choice = resolve_auto_rollout_chunk(self)
        self.rollout_engine = build_rollout_engine(self)  # None: generate; else continuous batching (auto: a rule)
        if not args.sync_with_dataloader:
            self._decouple_accumulation_from_dataloaders()
        # HF Trainer.__init__ (which TRL's PPO never calls) sets these; its checkpoint save/load code reads them
        for name in ("is_fsdp_xla_enabled", "is_fsdp_xla_v1_enabled", "is_fsdp_xla_v2_enabled"):
            if not hasattr(self, name):
                setattr(self, name, False)
        self.kl_ctl = (
            kl_controller
            if kl_controller is not None
            else build_kl_controller(args.kl_controller, args.kl_coef, args.kl_target, args.kl_horizon)
        )
        self.ptx_dataset = None
        self.ptx_stream = None
        if ptx_dataset is not None:
            self.ptx_dataset = tokenize_ptx_dataset(ptx_dataset, processing_class, args.ptx_max_length)
            self.ptx_stream = PtxStream(
                self.ptx_dataset,
                processing_class,
                batch_size=args.ptx_batch_size or args.per_device_train_batch_size,
                seed=args.seed,
                num_replicas=self.accelerator.num_processes,
                rank=self.accelerator.process_index,
            )
        self.prompt_iterator = None
        self._resumed_dataloader_stack = None
        self._update_start_state = None
        self._optimizer_stepped = False
        self.step_guard = StepGuard(args.nonfinite_policy, args.max_consecutive_nonfinite_skips,
                                    (self.accelerator, self.stop_on_nonfinite) if self.is_deepspeed_enabled else None)

    # ------------------------------------------------------------------ parent fixes

    def _decouple_accumulation_from_dataloaders(self) -> None:
        """`sync_with_dataloader=False`: gradient accumulation depends on the micro-batch count alone, as in HF
        Trainer (see :mod:`trl_ext.ppo.accumulation_state` for what TRL's setting does)."""
        gradient_state = self.accelerator.gradient_state
        gradient_state.plugin_kwargs = {**gradient_state.plugin_kwargs, "sync_with_dataloader": False}

    @contextmanager
    def null_ref_context(self):
        """Reference = the policy with its adapters disabled (or `ref_adapter_name` active).

        TRL looks up `self.model.policy`, which a DistributedDataParallel wrapper does not have; we unwrap first.
        """
        policy = self.accelerator.unwrap_model(self.model).policy
        if scalar_adapter_names(policy):
            # Shared base: peft's disable_adapter/set_adapter would set requires_grad=False on the value adapter.
            with adapter_switch(policy).use(self.ref_adapter_name):
                yield
            return
        with policy.disable_adapter() if self.is_peft_model and not self.ref_adapter_name else nullcontext():
            if self.ref_adapter_name:
                policy.set_adapter(self.ref_adapter_name)
            yield
            if self.ref_adapter_name:
                policy.set_adapter(self.model_adapter_name or "default")

    # TRL's PPOTrainer skips transformers.Trainer.__init__, which sets this; transformers 5's `_save` reads it on
    # ranks that do not save (crash under several processes without it).
    is_distributed_loading_by_transformers = False

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """Save the policy only (TRL's behaviour), also when the model is wrapped in DistributedDataParallel or a
        DeepSpeed engine. With a shared base, the policy's adapter only (the value adapter is saved with the value
        model).

        Under DeepSpeed TRL's own `save_model` crashes (`'LlamaConfig' object has no attribute 'get'`: it hands the
        policy to transformers as if it were the engine); here the policy is saved with `save_pretrained` like under
        DDP, its parameters gathered first under ZeRO-3 (every process takes part). Called on every process. (A
        shared base is refused under DeepSpeed, so this branch never meets one.)
        """
        backup = self.model
        if self.is_deepspeed_enabled:
            policy = self.accelerator.unwrap_model(self.model).policy
            self.model = policy
            try:
                with gathered_parameters(policy, self.accelerator):
                    self._save(output_dir if output_dir is not None else self.args.output_dir)
            finally:
                self.model = backup
            return
        self.model = self.accelerator.unwrap_model(self.model)
        try:
            with saving_policy_adapters_only(self.accelerator.unwrap_model(backup).policy):
                super().save_model(output_dir, _internal_call)
        finally:
            self.model = backup

    def create_optimizer(self):
        """HF's optimizer; under DeepSpeed without its empty parameter group. A LoRA policy without a value model
        (critic-free) has no parameter without weight decay: DeepSpeed drops that empty group from the optimizer,
        and the LR scheduler, built on both groups, then failed at its first step."""
        optimizer = super().create_optimizer()
        if self.accelerator.state.deepspeed_plugin is not None:  # (is_deepspeed_enabled is set after this)
            optimizer.param_groups[:] = [group for group in optimizer.param_groups if group["params"]]
        return optimizer

    def generate_completions(self, sampling: bool = False):
        """TRL's sample generations, scored by the reward model; skipped in a run without one (warned at init)."""
        if self.reward_model is not None:
            super().generate_completions(sampling=sampling)

    def create_model_card(self, *args, **kwargs):
        """TRL's model card (written with each checkpoint), also when the model is wrapped in DistributedDataParallel
        (TRL reads `self.model.config`, which the wrapper does not have: checkpoints crashed under DDP)."""
        backup = self.model
        self.model = self.accelerator.unwrap_model(self.model)
        try:
            return super().create_model_card(*args, **kwargs)
        finally:
            self.model = backup

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
                if self.reward_scorer is not None:
                    self.reward_scorer.close()  # the reward workers (restarted by the next train())
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
        self.generation_kwargs = {
            "max_new_tokens": self.args.response_length,
            "temperature": (self.args.temperature + 1e-7),
            "top_k": 0.0,
            "top_p": 1.0,
            "do_sample": True,
        }
        self.generation_config = GenerationConfig(**self.generation_kwargs)

    def run_update(self, update: int) -> None:
        """One PPO update: rollouts, scoring, rewards, advantages, optimisation, logging, callbacks, checkpoint."""
        args = self.args
        self._update_start_state = self.capture_update_start()
        self._optimizer_stepped = False
        self.state.episode += 1 * args.batch_size
        data = self.next_prompt_batch()
        if self._resumed_dataloader_stack is not None:
            self._restore_dataloader_stack()
        t0 = time.perf_counter()
        with torch.no_grad():
            rollout, scored, t1 = self.sample_and_score(data)
            if scored:
                rollout = resample_groups(self, rollout)  # dynamic_sampling: more rounds, informative groups only
                kl_coef = float(self.kl_ctl.value)
                self.compute_rewards(rollout, kl_coef)
                self.compute_advantages(rollout)
            empty_cache()  # between phases, as TRL
        if scored:
            t2 = time.perf_counter()
            stats = self.optimize(rollout)
            t3 = time.perf_counter()
            timings = {"time/rollout": t1 - t0, "time/scoring": t2 - t1, "time/optimization": t3 - t2}
            with torch.no_grad():
                metrics = self.update_metrics(rollout, stats, kl_coef, timings)
            self.log_update(metrics)
            if args.log_completions:
                log_completions(self, rollout)
        else:  # NaN/inf scores under nonfinite_policy "skip": the update is dropped (nor scheduler nor KL step)
            self.state.global_step += 1
            self.log({**self.step_guard.metrics(), "episode": self.state.episode})
        if self._optimizer_stepped:  # False only when the guard skipped every optimizer step of the update
            self.lr_scheduler.step()
        self.control = self.callback_handler.on_step_end(args, self.state, self.control)

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
        begin_reward_scoring(self, data)  # reward_funcs: prompts and dataset columns of this batch
        rollout = self.generate_rollouts(data["input_ids"].to(self.accelerator.device))
        generated = time.perf_counter()
        self.score_rollouts(rollout)
        scored = self.check_finite("objective/scores", rollout.scores, "rollouts", where=where)
        if scored:
            self.clip_scores(rollout)
        return rollout, scored, generated

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
        """`optimizer.step()` after checking the step's losses and gradients (one host sync per optimizer step)."""
        return guarded_optimizer_step(self.step_guard, self.optimizer, self.accelerator, self.stop_on_nonfinite)

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

    # ------------------------------------------------------------------ rollout and scoring

    def generate_rollouts(self, queries: torch.Tensor) -> Rollout:
        """Sample one response per query with the policy; keep their log-probs under the sampling distribution.

        The log-probs are taken as the tokens are sampled (:mod:`trl_ext.ppo.rollout_logprobs`): peak memory holds
        one step's `(batch, vocab)` scores, not TRL's `(batch, response_length, vocab)` tensor; the numbers are
        TRL's. Generation configs that module cannot rebuild keep TRL's path (with a one-time warning).
        """
        args = self.args
        context_length = queries.shape[1]
        with unwrap_model_for_generation(
            self.model,
            self.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            generation_kwargs=self.generation_kwargs,  # fixes transformers#42762, as TRL does
        ) as unwrapped_model:
            plan = sampling_plan(unwrapped_model.policy, self.generation_config)
            pad_token_id, chunk = self.processing_class.pad_token_id, args.local_rollout_forward_batch_size
            if self.rollout_engine is not None:  # continuous batching (trl_ext.ppo.rollout_engine)
                query_responses, logprobs = self.rollout_engine.generate(self, unwrapped_model.policy, queries)
            elif plan is not None:
                query_responses, logprobs = generate_with_logprobs(
                    unwrapped_model.policy, queries, chunk, pad_token_id, plan,
                    on_chunk=lambda start, responses: submit_rollout_chunk(self, start, responses),
                )
            else:
                warnings.warn("generate_rollouts: sampling config not rebuilt; keeping TRL's path", stacklevel=2)
                query_responses, logprobs = generate_with_full_scores(unwrapped_model.policy, queries, chunk,
                                                                      pad_token_id, self.generation_config)
        return Rollout(
            queries=queries,
            context_length=context_length,
            query_responses=query_responses,
            responses=query_responses[:, context_length:].contiguous(),
            logprobs=logprobs,
        )

    def score_rollouts(self, rollout: Rollout) -> None:
        """Reference log-probs, values and scores, per chunk of `local_rollout_forward_batch_size`; then masks."""
        args = self.args
        pad_token_id = self.processing_class.pad_token_id
        context_length = rollout.context_length
        chunk = args.local_rollout_forward_batch_size
        postprocessed, ref_logprobs, values, scores, sequence_lengths = [], [], [], [], []
        for i in range(0, rollout.queries.shape[0], chunk):
            query = rollout.queries[i : i + chunk]
            query_response = rollout.query_responses[i : i + chunk]
            response = rollout.responses[i : i + chunk]
            ref_logprobs.append(self.compute_ref_logprobs(query_response, response, context_length))
            postprocessed_response = self.postprocess_responses(response)
            postprocessed_query_response = torch.cat((query, postprocessed_response), 1)
            sequence_lengths.append(first_true_indices(postprocessed_response == pad_token_id) - 1)
            values.append(self.compute_values(query_response, context_length))
            scores.append(self.compute_scores(postprocessed_query_response, context_length))
            postprocessed.append(postprocessed_response)
        rollout.postprocessed_responses = torch.cat(postprocessed, 0)
        ref_logprobs = torch.cat(ref_logprobs, 0)
        rollout.sequence_lengths = sequence_lengths = torch.cat(sequence_lengths, 0)
        scores = torch.cat(scores, 0)
        if self.reward_scorer is not None:  # reward_funcs: reward models' scores + functions -> weighted score
            scores = finish_reward_scoring(self, rollout, scores)
        values = torch.cat(values, 0)

        # Completions without the stop token (EOS) get `missing_eos_penalty` subtracted from their score.
        rollout.contain_eos_token = torch.any(rollout.postprocessed_responses == self.processing_class.eos_token_id, -1)
        if args.missing_eos_penalty is not None:
            scores[~rollout.contain_eos_token] -= args.missing_eos_penalty

        # padding_mask: after the last response token; padding_mask_p1: one later (the value of the EOS state counts)
        responses = rollout.responses
        response_idxs = torch.arange(responses.shape[1], device=responses.device).repeat(responses.shape[0], 1)
        rollout.padding_mask = response_idxs > sequence_lengths.unsqueeze(1)
        rollout.logprobs = torch.masked_fill(rollout.logprobs, rollout.padding_mask, INVALID_LOGPROB)
        rollout.ref_logprobs = torch.masked_fill(ref_logprobs, rollout.padding_mask, INVALID_LOGPROB)
        rollout.padding_mask_p1 = response_idxs > (sequence_lengths + 1).unsqueeze(1)
        rollout.values = torch.masked_fill(values, rollout.padding_mask_p1, 0)
        rollout.scores = scores

    def compute_ref_logprobs(
        self, query_response: torch.Tensor, response: torch.Tensor, context_length: int
    ) -> torch.Tensor:
        """Log-probs of `response` under the reference model (the LoRA policy with adapters off if none given)."""
        pad_token_id = self.processing_class.pad_token_id
        if self.ref_model is None:
            with self.null_ref_context():
                ref_output = sequence_logits(self.accelerator.unwrap_model(self.model).policy, query_response,
                                             pad_token_id)
        else:
            ref_output = sequence_logits(self.ref_model, query_response, pad_token_id)
        ref_logits = ref_output.logits[:, context_length - 1 : -1]
        ref_logits /= self.args.temperature + 1e-7
        return selective_log_softmax(ref_logits, response)

    def postprocess_responses(self, responses: torch.Tensor) -> torch.Tensor:
        """Truncate each response after the first stop token (pad the rest), if a stop token is set."""
        if self.stop_token_id is not None:  # handle the edge case when stop_token_id exists but is 0
            return truncate_response(self.stop_token_id, self.processing_class.pad_token_id, responses)
        return responses

    def compute_values(self, query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """Per-response-token values `(batch, response_length)` from the value model (plain or PEFT)."""
        if self.args.critic_free:
            return torch.zeros(query_response[:, context_length:].shape, device=query_response.device)
        value_model = self.accelerator.unwrap_model(self.model).value_model
        full_value, _, _ = scalar_model_outputs(
            value_model, query_response, self.processing_class.pad_token_id, context_length
        )
        return full_value[:, context_length - 1 : -1].squeeze(-1)

    def compute_scores(self, postprocessed_query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """Reward-model score `(batch,)` of each (truncated) query+response: the head's output at its last token.
        With `reward_funcs`: `(batch, models)`, the scores of the reward models among them (functions come later)."""
        if self.reward_scorer is not None:
            return model_reward_scores(self, postprocessed_query_response, context_length)
        _, score, _ = scalar_model_outputs(
            self.reward_model, postprocessed_query_response, self.processing_class.pad_token_id, context_length
        )
        return score

    def compute_rewards(self, rollout: Rollout, kl_coef: float) -> None:
        """Per-token rewards: `-kl_coef * KL_t` on every token, plus the score on the last one (then optional
        whitening). KL_t: `args.kl_estimator` (:func:`trl_ext.ppo.objectives.kl_penalty`; default k1, as TRL).
        """
        args = self.args
        kl = kl_penalty(rollout.logprobs, rollout.ref_logprobs, self.objective.reward_kl_estimator)
        non_score_reward = -kl_coef * kl
        rewards = non_score_reward.clone()
        actual_start = torch.arange(rewards.size(0), device=rewards.device)
        sequence_lengths_p1 = rollout.sequence_lengths + 1
        actual_end = torch.where(sequence_lengths_p1 < rewards.size(1), sequence_lengths_p1, rollout.sequence_lengths)
        rewards[actual_start, actual_end] += rollout.scores
        if args.whiten_rewards:
            rewards = masked_whiten(rewards, mask=~rollout.padding_mask_p1, shift_mean=False)
            rewards = torch.masked_fill(rewards, rollout.padding_mask_p1, 0)
        rollout.kl, rollout.non_score_reward, rollout.rewards, rollout.kl_coef = kl, non_score_reward, rewards, kl_coef

    def compute_advantages(self, rollout: Rollout) -> None:
        """GAE advantages and returns; advantages whitened over the response tokens. (Critic-free: the estimator.)"""
        if self.args.critic_free:
            critic_free_advantages(rollout, self.args, self.accelerator)
        else:
            advantages, returns = gae_advantages(rollout.rewards, rollout.values, self.args.gamma, self.args.lam)
            advantages = masked_whiten(advantages, ~rollout.padding_mask)
            rollout.advantages = torch.masked_fill(advantages, rollout.padding_mask, 0)
            rollout.returns = returns
        zero_unscorable_advantages(rollout)  # reward_funcs: completions no reward scored

    # ------------------------------------------------------------------ optimisation

    def optimize(self, rollout: Rollout) -> UpdateStats:
        """`num_ppo_epochs` passes over the rollout, each in a fresh `np.random.permutation`, by mini/micro-batch."""
        args = self.args
        accelerator = self.accelerator
        model = self.model
        stats = UpdateStats((args.num_ppo_epochs, args.num_mini_batches, args.gradient_accumulation_steps),
                            accelerator.device)
        ptx_joint = self.ptx_stream is not None and args.ptx_mode == "joint"
        ptx_separate = self.ptx_stream is not None and args.ptx_mode == "separate"
        for ppo_epoch_idx in range(args.num_ppo_epochs):
            b_inds = np.random.permutation(args.local_batch_size)
            for minibatch_idx, mini_batch_start in enumerate(
                range(0, args.local_batch_size, args.local_mini_batch_size)
            ):
                mini_batch_inds = b_inds[mini_batch_start : mini_batch_start + args.local_mini_batch_size]
                rollout.token_normalizer = mini_batch_token_normalizer(self.objective, rollout, mini_batch_inds,
                                                                       args.gradient_accumulation_steps, accelerator)
                for gradient_accumulation_idx, micro_batch_start in enumerate(
                    range(0, args.local_mini_batch_size, args.per_device_train_batch_size)
                ):
                    micro_batch_end = micro_batch_start + args.per_device_train_batch_size
                    micro_batch_inds = mini_batch_inds[micro_batch_start:micro_batch_end]
                    with accelerator.accumulate(model):
                        ptx_batch = self.next_ptx_batch() if ptx_joint else None
                        out = self.compute_micro_batch_loss(model, rollout, micro_batch_inds, ptx_batch)
                        self.step_guard.observe(out.loss, "loss/total", where=f" (PPO epoch {ppo_epoch_idx + 1}, "
                                                f"mini-batch {minibatch_idx + 1}, "
                                                f"micro-batch {gradient_accumulation_idx + 1})")
                        accelerator.backward(out.loss)
                        if self.optimizer_step():
                            self._optimizer_stepped = True
                        self.optimizer.zero_grad()
                        if ptx_separate and accelerator.sync_gradients:
                            stats.ptx_losses.append(self.ptx_step())
                        stats.record((ppo_epoch_idx, minibatch_idx, gradient_accumulation_idx), out)
                    del out
        return stats

    def compute_micro_batch_loss(
        self, model, rollout: Rollout, micro_batch_inds, ptx_batch: dict | None = None
    ) -> MicroBatchOutput:
        """Loss of one micro-batch: `pg_loss + vf_coef * vf_loss` (+ KL and entropy terms of the objective,
        :func:`trl_ext.ppo.objectives.objective_terms`; + `ptx_coef * lm_loss` in joint ptx mode)."""
        args = self.args
        context_length = rollout.context_length
        padding_mask = rollout.padding_mask[micro_batch_inds]
        padding_mask_p1 = rollout.padding_mask_p1[micro_batch_inds]
        output, vpred_temp = forward(model, rollout.query_responses[micro_batch_inds],
                                     self.processing_class.pad_token_id)
        logits = output.logits[:, context_length - 1 : -1]
        logits /= args.temperature + 1e-7
        new_logprobs = selective_log_softmax(logits, rollout.responses[micro_batch_inds])
        new_logprobs = torch.masked_fill(new_logprobs, padding_mask, INVALID_LOGPROB)
        if args.critic_free:
            vf = no_value_loss(logits.device)
        else:
            vpred = torch.masked_fill(vpred_temp[:, context_length - 1 : -1].squeeze(-1), padding_mask_p1, 0)
            vf = value_loss(vpred, rollout.values[micro_batch_inds], rollout.returns[micro_batch_inds],
                            ~padding_mask_p1, args.cliprange_value, args.value_clip)
        obj = rollout_objective(self.objective, rollout, micro_batch_inds, new_logprobs, logits)
        loss = obj.policy.loss + args.vf_coef * vf.loss
        if obj.penalty is not None:  # kl_coef * KL (kl_in="loss") - entropy_coef * entropy
            loss = loss + obj.penalty
        ptx_loss = None
        if ptx_batch is not None:
            ptx_loss = self.compute_ptx_loss(ptx_batch)
            loss = loss + args.ptx_coef * ptx_loss
        return MicroBatchOutput(loss=loss, policy=obj.policy, value=vf, logits=logits, ptx_loss=ptx_loss,
                                kl_loss=obj.kl_loss, entropy=obj.entropy, entropy_loss=obj.entropy_loss)

    def next_ptx_batch(self) -> dict:
        """The next ptx micro-batch from `self.ptx_stream` (its own data order, cycled)."""
        return next(self.ptx_stream)

    def compute_ptx_loss(self, batch: dict) -> torch.Tensor:
        """The policy's LM loss on a ptx batch (:func:`trl_ext.ppo.losses.ptx_lm_loss`)."""
        policy = self.accelerator.unwrap_model(self.model).policy
        input_ids = batch["input_ids"].to(self.accelerator.device)
        attention_mask = batch["attention_mask"].to(self.accelerator.device)
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        logits = policy(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
        return ptx_lm_loss(logits, input_ids, attention_mask)

    def ptx_step(self) -> torch.Tensor:
        """DeepSpeed-Chat's separate ptx step (:func:`trl_ext.ppo.ptx_data.separate_ptx_step`); returns the LM loss."""
        return separate_ptx_step(self)

    # ------------------------------------------------------------------ logging

    def update_metrics(self, rollout: Rollout, stats: UpdateStats, kl_coef: float, timings: dict) -> dict:
        """TRL's metrics of one update (same names and formulas), plus `objective/kl_coef`, `loss/ptx_avg`, `time/*`."""
        gather = self.accelerator.gather_for_metrics
        padding_mask = rollout.padding_mask
        mean_kl = rollout.kl.sum(1).mean()
        # Mask padding positions, filled with INVALID_LOGPROB, else they'd drag the entropy negative
        mean_entropy = ((-rollout.logprobs) * (~padding_mask).float()).sum(1).mean()
        mean_non_score_reward = rollout.non_score_reward.sum(1).mean()
        rlhf_reward = mean_non_score_reward + rollout.scores.mean()
        metrics = {}
        metrics["eps"] = int(self.state.episode / (time.time() - self.start_time))
        metrics["objective/kl"] = gather(mean_kl).mean().item()
        metrics["objective/entropy"] = gather(mean_entropy).mean().item()
        metrics["objective/non_score_reward"] = gather(mean_non_score_reward).mean().item()
        metrics["objective/rlhf_reward"] = gather(rlhf_reward).mean().item()
        metrics["objective/scores"] = gather(rollout.scores.mean()).mean().item()
        metrics["policy/approxkl_avg"] = gather(stats.approxkl).mean().item()
        metrics["policy/clipfrac_avg"] = gather(stats.pg_clipfrac).mean().item()
        metrics["loss/policy_avg"] = gather(stats.pg_loss).mean().item()
        metrics["loss/value_avg"] = gather(stats.vf_loss).mean().item()
        metrics["val/clipfrac_avg"] = gather(stats.vf_clipfrac).mean().item()
        metrics["policy/entropy_avg"] = gather(stats.entropy).mean().item()
        metrics["val/ratio"] = gather(stats.ratio).mean().item()
        metrics["val/ratio_var"] = gather(stats.ratio).var().item()
        metrics["val/num_eos_tokens"] = (rollout.responses == self.processing_class.eos_token_id).sum().item()
        metrics["objective/kl_coef"] = kl_coef
        if rollout.scores_clipfrac is not None:
            metrics["objective/scores_clipfrac"] = gather(rollout.scores_clipfrac).mean().item()
        if stats.ptx_losses:
            metrics["loss/ptx_avg"] = gather(torch.stack(stats.ptx_losses).mean()).mean().item()
        metrics.update(objective_metrics(rollout, stats, self.objective, self.accelerator))
        if self.args.critic_free:
            critic_free_metrics(metrics, rollout, stats, self.args, self.accelerator)
        metrics.update(reward_func_metrics(self, rollout))  # reward_funcs: rewards/*, reward, completions/*
        metrics.update(timings)
        metrics.update(self.step_guard.metrics())  # nonfinite/*: only under `skip` or fp16's loss scaler
        metrics["lr"] = self.lr_scheduler.get_last_lr()[0]
        metrics["episode"] = self.state.episode
        return metrics

    def log_update(self, metrics: dict) -> None:
        """Advance the step counters, log `metrics`, then let the KL controller see this update's KL."""
        self.state.epoch = self.state.episode / self.train_dataset_len  # used by self.log
        self.state.global_step += 1
        self.log(metrics)
        self.kl_ctl.update(metrics["objective/kl"], self.args.batch_size)
