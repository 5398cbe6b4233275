"""What lets a TRL `GRPOTrainer` script run on :class:`trl_ext.PPOTrainer` with only the trainer's name changed.

* ``grpo_inputs.py``: the trainer's inputs in GRPOTrainer's forms resolved, one call from ``PPOTrainer.__init__``;
* ``from_grpo.py``: TRL's ``GRPOConfig`` key by key as ``PPOConfig`` keyword arguments
  (``PPOConfig.from_grpo_config``);
* ``model_ids.py``: models given as ids or paths, loaded as GRPOTrainer loads them (``model_init_kwargs``);
* ``prompt_dataset.py``: ``prompt`` datasets, text or chat, tokenized as GRPOTrainer tokenizes them
  (``chat_template_kwargs``).

``model_ids.py`` and ``prompt_dataset.py`` hold config fields that :class:`trl_ext.PPOConfig` mixes in, and
``from_grpo.py`` the conversion its classmethod calls, so no module here imports the config (the trainer maps a
``GRPOConfig`` before ``grpo_inputs``).
"""
