"""PPO: :class:`trl_ext.PPOTrainer` and :class:`trl_ext.PPOConfig`, shelved by role: the trainer, its config and the
trainer's own parts at this top; the math in ``objective/``, the sampling in ``rollout/``, multi-turn episodes in
``episodes/``, what the PPO extends in ``base/``, GRPOTrainer's inputs in ``grpo_compat/`` (each says what it holds).

* ``trainer.py``: the training loop as named, overridable steps (rollout, score, rewards, advantages, losses,
  logging); builds each extension's object once (``build_features``). It orchestrates; the rest lives below.
* ``config.py``: ``PPOConfig``, TRL's PPO fields plus the extensions; ``config_rules.py``: how its settings combine,
  checked at construction (each field's range and choices: :mod:`trl_ext.config_rules`).
* ``checkpointing.py``: what a PPO checkpoint adds to HF's (value model, KL controller, stream positions), resume,
  and the state saved before a bad update.
* ``optimize_loop.py``: the PPO epochs of ``optimize``: one optimizer step per mini-batch, forward/backward by
  micro-batch, gradients clipped to ``max_grad_norm`` (``GradientClip``).
* ``evaluation.py``: evaluation during training (``EvaluationArgs``, ``Evaluation``).
* ``ptx_data.py``: the pretraining mix (``PretrainingMix``: tokenized text, its resumable stream, the LM loss).
* ``completions_log.py``: ``log_completions`` (``CompletionsLog``); ``update_metrics.py``: the update's metrics.
* ``shared_base_roles.py``: the trainer's check of reward/value adapters on the policy's base.
* ``micro_batches.py``: ``train_micro_batch_size``: the size of the micro-batches (``auto``: the largest that fits)
  and each loss term's weight, its share of the mini-batch.
* ``base/``: what the trainer and config extend, depending on the installed TRL: TRL's ``experimental.ppo`` classes
  (TRL 1.10-1.12) or trl-ext's own base, ``base_trainer.py`` and ``base_config.py`` (TRL 1.13+, which has no PPO);
  ``parent_fixes.py``: the parent's methods fixed for DDP/DeepSpeed wrappers, shared bases, critic-free runs.
* ``grpo_compat/``: what lets a GRPOTrainer script run on ``PPOTrainer``: ``grpo_inputs.py`` (one call from
  ``__init__``), ``from_grpo.py`` (``PPOConfig.from_grpo_config``: TRL's ``GRPOConfig`` key by key),
  ``model_ids.py`` (models given as ids or paths, loaded as GRPOTrainer loads them) and ``prompt_dataset.py``
  (``prompt`` datasets, text or chat, tokenized as GRPOTrainer tokenizes them).
* ``episodes/``: multi-turn episodes with tools (``MultiTurnRollout``, ``Toolbox``, the tool rules).
* ``rollout/``: ``containers.py`` (``Rollout``, what the steps pass along), ``steps.py`` (the sampling and scoring
  steps), ``logprobs.py``, ``engine.py`` (continuous batching), ``decode_graphs.py`` (CUDA-graph decoding),
  ``chunk.py``, ``memory_budget.py`` and ``allocator_margin.py`` (``local_rollout_forward_batch_size: auto``; CUDA's
  reserved over allocated bytes), ``sequences.py``, ``prompt_stream.py``, ``dynamic_sampling.py``,
  ``reward_funcs.py`` (reward functions in the rollout).
* ``objective/``: ``objectives.py`` (the policy objectives), ``losses.py``, ``advantages.py``, ``critic.py``,
  ``kl_controllers.py``, ``masked_stats.py``.

Imports go down only, counting imports inside functions: ``objective/`` imports nothing of the other rooms or the
top; ``rollout/`` and ``episodes/`` nothing of ``base/``, ``grpo_compat/`` or the top; ``base/`` and
``grpo_compat/`` nothing of each other or the top (tests/test_layout.py). Scalar (reward/value) outputs come from :mod:`trl_ext.models.scalar_heads`, reward and value
adapters on the policy's own base from :mod:`trl_ext.models.shared_base`; atomic checkpoints, interruption and NaN
guards from :mod:`trl_ext.runtime`.
"""
