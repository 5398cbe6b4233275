"""PPO: :class:`trl_ext.PPOTrainer` and :class:`trl_ext.PPOConfig`, with the math and data streams they run.

* ``trainer.py``: the training loop as named, overridable steps (rollout, score, rewards, advantages, losses,
  logging), checkpoints and resume. It orchestrates; the math lives in the modules below.
* ``config.py``: ``PPOConfig``, TRL's PPO fields plus the extensions, validated in ``__post_init__``.
* ``losses.py`` (clipped policy loss, value loss in three clip modes, ptx LM loss), ``advantages.py`` (GAE),
  ``kl_controllers.py`` (fixed, adaptive, doubling): pure functions and small classes, each with its source.
* ``rollout.py``: the containers passed between the steps of one update.
* ``rollout_logprobs.py``: the sampled tokens' log-probs taken while ``generate`` samples them (no
  ``(batch, length, vocab)`` scores tensor), and the reference pass's logits without every layer's hidden states.
* ``memory_budget.py``: the bytes each part of a PPO run holds (weights, adapters, optimizer, rollout, scoring,
  training), from the model's shape and the run's settings.
* ``prompt_stream.py`` and ``ptx_data.py``: endless, resumable prompt and pretraining-mix streams (built on
  :mod:`trl_ext.runtime.epoch_stream`); ``accumulation_state.py``: accelerate's DataLoader state that decides when
  TRL's PPO accumulates gradients, saved with each checkpoint.

Scalar (reward/value) outputs come from :mod:`trl_ext.models.scalar_heads`, reward and value adapters on the
policy's own base from :mod:`trl_ext.models.shared_base`; atomic checkpoints, interruption and
NaN guards from :mod:`trl_ext.runtime`.
"""
