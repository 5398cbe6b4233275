"""YAML recipes and the ``trl-ext`` command: from one file to a trained model.

* ``loader.py``: read a recipe, merge ``--key value`` overrides, check every key, path and combination, and resolve it
  into TRL's dataclasses (:func:`resolve_recipe`, :class:`Recipe`, re-exported here). Loads no model.
* ``data.py``: open a dataset split (Hub, local file, ``save_to_disk`` folder) and check its columns.
* ``pipeline.py``: run a resolved recipe: open the data, load the models (:mod:`trl_ext.models`), build the trainer
  (:mod:`trl_ext.sft`, :mod:`trl_ext.ppo`, :mod:`trl_ext.preference`), train, save.
* ``cli.py``: ``trl-ext check|train|plot`` (also ``python -m trl_ext``): one-line errors, exit codes.
* ``plots.py``: ``trl-ext plot``: the logged curves of runs (their ``trainer_state.json``) as PNG files.
"""

from .loader import Recipe, resolve_recipe, valid_keys

__all__ = ["Recipe", "resolve_recipe", "valid_keys"]
