"""Supervised fine-tuning: :class:`trl_ext.SFTTrainer`, TRL's `SFTTrainer` with trl-ext's run safety.

* ``trainer.py``: :class:`~trl_ext.sft.trainer.SFTTrainer`. It adds no loss or data feature: it mixes in
  :mod:`trl_ext.runtime` (atomic checkpoints, SIGINT/SIGTERM checkpoints, the NaN-loss guard), so that an SFT run
  resumes and stops like the reward, DPO and PPO runs. Its config is TRL's ``SFTConfig`` itself (no field added),
  also importable as :class:`trl_ext.SFTConfig`.

The recipe stage ``trainer: sft`` (:mod:`trl_ext.recipes`) runs it: SFT -> reward model -> PPO or DPO, all from
recipes.
"""
