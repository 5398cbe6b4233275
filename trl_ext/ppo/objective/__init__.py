"""PPO's objective: the math of the update, pure functions and small classes, each with its source.

* ``objectives.py``: the policy objectives (loss aggregation, asymmetric/dual/two-sided clipping, GSPO, CISPO,
  entropy, KL estimators) and ``ObjectiveConfig``.
* ``losses.py``: the value loss (three clip modes), the ptx LM loss, the loss result types.
* ``advantages.py``: GAE, and the critic-free RLOO, GRPO/Dr. GRPO, REINFORCE++/-baseline.
* ``critic_free.py``: ``CriticFree`` (a critic-free estimator in the trainer), ``NoValueModel``, prompt groups.
* ``kl_controllers.py``: fixed, adaptive and doubling KL coefficients.
* ``masked_stats.py``: masked mean, variance and whitening.
"""
