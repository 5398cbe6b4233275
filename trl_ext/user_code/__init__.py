"""The user's code that recipes and trainers name: :mod:`.workers` runs functions (reward functions, tools) in worker
processes with a time limit (:class:`~trl_ext.user_code.workers.FunctionPool`). Used by :mod:`trl_ext.rewards` and
:mod:`trl_ext.ppo.episodes`; imports nothing of theirs."""
