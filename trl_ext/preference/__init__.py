"""Preference training: :class:`trl_ext.RewardTrainer` and :class:`trl_ext.DPOTrainer`, subclasses of TRL's.

* ``reward_trainer.py`` / ``reward_config.py``: label smoothing, ranked lists of K responses, reward centering.
* ``dpo_trainer.py`` / ``dpo_config.py``: label smoothing for the default ``sigmoid`` loss (cDPO), through TRL's own
  ``robust`` loss.
* ``losses.py``: the pure loss functions both trainers call, each with its formula and source.
* ``ranked_data.py``: tokenization and collation of ranked (K-wise) preference data.
* ``reward_centering.py``: folds a reward offset into the score head's bias (with
  :mod:`trl_ext.models.biased_score_model` for heads that have none).

Both trainers take their atomic checkpoints, interruption handling and NaN-loss guard from :mod:`trl_ext.runtime`.
"""
