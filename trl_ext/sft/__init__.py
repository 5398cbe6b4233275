"""Supervised fine-tuning: :class:`trl_ext.SFTTrainer`, TRL's `SFTTrainer` with trl-ext's run safety.

* ``trainer.py``: :class:`~trl_ext.sft.trainer.SFTTrainer`. It adds no loss or data feature: it mixes in
  :mod:`trl_ext.runtime` (atomic checkpoints, SIGINT/SIGTERM checkpoints, the NaN-loss guard), so that an SFT run
  resumes and stops like the reward, DPO and PPO runs.
* ``config.py``: :class:`~trl_ext.sft.config.SFTConfig`, TRL's ``SFTConfig`` plus the non-finite policy
  (``nonfinite_policy``, ``max_consecutive_nonfinite_skips``, :mod:`trl_ext.runtime.nonfinite`).

The recipe stage ``trainer: sft`` (:mod:`trl_ext.recipe_loader`) runs it: SFT -> reward model -> PPO or DPO, all from
recipes.
"""
