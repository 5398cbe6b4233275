"""The recipe loader and pipeline behind the ``trl-ext`` command: from one YAML file (the top-level ``recipes/``
folder holds the shipped ones) to a trained model. Named ``recipe_loader`` so that the package and the folder of YAML
files are not both ``recipes``.

* ``loader.py``: read a recipe, merge ``--key value`` overrides, check what is about recipes (unknown keys, null,
  paths, the ``reward_*``/``value_*`` model keys) and resolve it into TRL's dataclasses, whose configs check their
  own settings (:func:`resolve_recipe`, :class:`Recipe`, re-exported here). Loads no model.
* ``arguments.py``: ``PipelineArguments`` (the pipeline's own keys) and ``Recipe`` (a resolved recipe).
* ``argv.py``: recipe values as the command-line tokens TRL's parser reads, and resolved values back as YAML.
* ``validation.py``: the field rules of :mod:`trl_ext.config_rules` for TRL's dataclasses' keys, ``null``, a
  config's error as the recipe's one line, LoRA and model-length checks.
* ``reward_keys.py``: ``reward_funcs`` and the keys that change without a reward model.
* ``data.py``: open a dataset split (Hub, local file, ``save_to_disk`` folder) and check its columns.
* ``data_rows.py``: bad rows (empty, identical pairs, prompt lengths); ``file_text.py``: undecodable bytes and bad
  JSON lines of local files.
* ``lora_targets.py``: ``trl-ext check``: LoRA targets against the model built without weights.
* ``pipeline.py``: run a resolved recipe: open the data, load the models (:mod:`trl_ext.models`), build the trainer
  (:mod:`trl_ext.sft`, :mod:`trl_ext.ppo`, :mod:`trl_ext.preference`), train, save.
* ``plots.py``: ``trl-ext plot``: the logged curves of runs (their ``trainer_state.json``) as PNG files.
* ``plan.py``: ``trl-ext plan``: a PPO recipe's memory budget from the checkpoints' ``config.json`` only, whether it
  fits a GPU, and the fastest rollout-chunk and micro-batch settings that do.

The command line itself is :mod:`trl_ext.cli` (``trl-ext check|train|plan|plot|export|sample|score``).
"""

from .loader import Recipe, resolve_recipe, valid_keys

__all__ = ["Recipe", "resolve_recipe", "valid_keys"]
