"""YAML recipes and the ``trl-ext`` command: from one file to a trained model.

* ``loader.py``: read a recipe, merge ``--key value`` overrides, check every key, path and combination, and resolve it
  into TRL's dataclasses (:func:`resolve_recipe`, :class:`Recipe`, re-exported here). Loads no model.
* ``data.py``: open a dataset split (Hub, local file, ``save_to_disk`` folder) and check its columns.
* ``pipeline.py``: run a resolved recipe: open the data, load the models (:mod:`trl_ext.models`), build the trainer
  (:mod:`trl_ext.sft`, :mod:`trl_ext.ppo`, :mod:`trl_ext.preference`), train, save.
* ``cli.py``: ``trl-ext check|train|plan|plot`` (also ``python -m trl_ext``): one-line errors, exit codes.
* ``plots.py``: ``trl-ext plot``: the logged curves of runs (their ``trainer_state.json``) as PNG files.
* ``plan.py``: ``trl-ext plan``: a PPO recipe's memory budget from the checkpoints' ``config.json`` only, whether it
  fits a GPU, and the fastest rollout-chunk and micro-batch settings that do.
"""

from .loader import Recipe, resolve_recipe, valid_keys

__all__ = ["Recipe", "resolve_recipe", "valid_keys"]
