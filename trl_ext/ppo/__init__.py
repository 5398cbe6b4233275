"""PPO: :class:`trl_ext.PPOTrainer` and :class:`trl_ext.PPOConfig`, with the math and data streams they run.

* ``trainer.py``: the training loop as named, overridable steps (rollout, score, rewards, advantages, losses,
  logging), checkpoints and resume. It orchestrates; the math lives in the modules below.
* ``config.py``: ``PPOConfig``, TRL's PPO fields plus the extensions, validated in ``__post_init__``.
* ``base.py``: what those two extend, depending on the installed TRL: TRL's ``experimental.ppo`` classes (TRL
  1.10-1.12) or trl-ext's own base, ``base_trainer.py`` and ``base_config.py`` (TRL 1.13+, which has no PPO).
* ``losses.py`` (clipped policy loss, value loss in three clip modes, ptx LM loss, k3 KL loss), ``advantages.py``
  (GAE, and the critic-free RLOO, GRPO/Dr. GRPO, REINFORCE++/-baseline), ``kl_controllers.py`` (fixed, adaptive,
  doubling): pure functions and small classes, each with its source.
* ``critic_free.py``: what the trainer's steps call for a critic-free ``advantage_estimator``: no value model,
  ``num_samples_per_prompt`` groups, the estimators on a scored rollout, the group metrics.
* ``sequences.py`` (sampling responses, truncation at the stop token, padded forward passes) and
  ``masked_stats.py`` (masked mean, variance, whitening): the tensor helpers of the steps, the same on every TRL.
* ``rollout.py``: the containers passed between the steps of one update; ``checkpointing.py``: what a PPO checkpoint
  adds to HF's (value model, KL controller, stream positions), resume, and the state saved before a bad update.
* ``rollout_logprobs.py``: the sampled tokens' log-probs taken while ``generate`` samples them (no
  ``(batch, length, vocab)`` scores tensor; TRL's path with that tensor for the configs it cannot rebuild), and the
  reference pass's logits without every layer's hidden states.
* ``memory_budget.py``: the bytes each part of a PPO run holds (weights, adapters, optimizer, rollout, scoring,
  training), from the model's shape and the run's settings; ``rollout_chunk.py``: ``local_rollout_forward_batch_size:
  auto``, the largest rollout/scoring chunk whose budget fits ``max_memory_gib``, chosen once from the loaded models.
* ``from_grpo.py`` (``PPOConfig.from_grpo_config``: TRL's ``GRPOConfig`` key by key), ``model_ids.py`` (models given
  as ids or paths, loaded as GRPOTrainer loads them) and ``prompt_dataset.py`` (``prompt`` datasets, text or chat,
  tokenized as GRPOTrainer tokenizes them): what lets a GRPOTrainer script run on ``PPOTrainer``.
* ``prompt_stream.py`` and ``ptx_data.py``: endless, resumable prompt and pretraining-mix streams (built on
  :mod:`trl_ext.runtime.epoch_stream`); ``accumulation_state.py``: accelerate's DataLoader state that decides when
  TRL's PPO accumulates gradients, saved with each checkpoint.

Scalar (reward/value) outputs come from :mod:`trl_ext.models.scalar_heads`, reward and value adapters on the
policy's own base from :mod:`trl_ext.models.shared_base`; atomic checkpoints, interruption and
NaN guards from :mod:`trl_ext.runtime`.
"""
