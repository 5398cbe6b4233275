"""Rewards computed by programs: TRL GRPO's ``reward_funcs`` contract for :class:`trl_ext.PPOTrainer` and recipes.

* ``contract.py``: how a reward function is named, called (TRL 1.16's keywords, ``async def`` together) and what
  it may return (one float or None per completion; anything else is one error naming the function);
* ``config.py``: the config fields (``reward_weights``, ``reward_num_workers``, ``reward_timeout_s``,
  ``log_completions``, ``num_completions_to_print``), mixed into ``PPOConfig``;
* ``columns.py``: the collator that carries the dataset's columns next to the tokenized prompt;
* ``scoring.py``: the scorer the trainer calls (reward models + functions -> one weighted score per completion);
* ``metrics.py``: ``rewards/<name>/mean``, ``reward``, ``completions/*`` and the rest, in TRL's names;
* ``remote.py``: a reward served over HTTP (OpenRLHF's remote reward contract);
* ``resolve.py``: recipe entries (``module:function``, ``file.py:function``, factories, URLs) -> functions.

The trainer's side (which step calls what) is :mod:`trl_ext.ppo.rollout.reward_funcs`; the guide is
``docs/reward-functions.md``.
"""
