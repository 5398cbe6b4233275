"""The user's code that recipes and trainers name: :mod:`.entries` parses and imports ``module:function`` entries
(reward functions, tools, environment factories), :mod:`.workers` runs functions (reward functions, tools) in worker
processes with a time limit (:class:`~trl_ext.user_code.workers.FunctionPool`). Used by :mod:`trl_ext.rewards`,
:mod:`trl_ext.ppo.episodes` and :mod:`trl_ext.recipe_loader`; imports nothing of theirs."""
