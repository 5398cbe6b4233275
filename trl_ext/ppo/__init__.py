"""PPO: :class:`trl_ext.PPOTrainer` and :class:`trl_ext.PPOConfig`, shelved by role. At this top, the trainer and
what it is made of:

* ``trainer.py``: ``PPOTrainer``, the update as named steps, each delegating to its part;
* ``trainer_inputs.py``: its arguments, checked and converted before the parent's ``__init__``;
* ``features.py``: each extension's one object, built once from the config;
* ``config.py``: ``PPOConfig``; ``combination_rules.py``: how its settings combine (each field's own rules:
  :mod:`trl_ext.field_rules`);
* ``optimize_loop.py``: the PPO epochs (one optimizer step per mini-batch, the micro-batches' weights, the clip);
* ``update_metrics.py``, ``evaluation.py``: the update's metrics, evaluation during training (parts);
* ``ptx_data.py``: the pretraining mix; ``completions_log.py``: ``log_completions``.

Below: the math in ``objective/``, the sampling and scoring in ``rollout/``, the memory planner in ``memory/``,
multi-turn episodes in ``episodes/``, what the PPO extends in ``base/``, GRPOTrainer's inputs in ``grpo_compat/``
(each ``__init__`` says what it holds). Imports go down only, ``objective/`` lowest (tests/test_layout.py)."""
