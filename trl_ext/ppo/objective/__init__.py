"""PPO's objective: the math of the update, pure functions and small classes, each with its source.

* ``objectives.py``: the policy objectives (loss aggregation, asymmetric/dual/two-sided clipping, GSPO, CISPO,
  entropy, KL estimators) and ``ObjectiveConfig``.
* ``losses.py``: the value loss (three clip modes), the ptx LM loss, the loss result types.
* ``advantages.py``: GAE, and the critic-free RLOO, GRPO/Dr. GRPO, REINFORCE++/-baseline.
* ``action_gae.py``: GAE over the policy's own tokens of a multi-turn episode (tool results are no steps).
* ``turn_credit.py``: the same per turn (``turn_credit: turn``): returns-to-go and baselines of a group's same turn.
* ``estimators.py``: the registry of advantage estimators, each registered once with one signature.
* ``critic.py``: the run's critic, ``ValueCritic`` (GAE with a value model) or ``CriticFree`` (a critic-free
  estimator), one ``Critic`` Protocol, chosen once by ``build_critic``; ``NoValueModel``.
* ``critic_health.py``: the value model's explained variance and error, and its credit gain over per-turn credit.
* ``critic_warmup.py``: the value model's own training: ``critic_warmup`` and ``critic_learning_rate``.
* ``kl_controllers.py``: fixed, adaptive and doubling KL coefficients.
* ``masked_stats.py``: masked mean, variance and whitening.
"""
