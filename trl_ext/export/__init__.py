"""After training: export a run's models, sample from its policy, score data with its reward model.

* ``run_dir.py``: what a run, checkpoint or export holds (:func:`open_run`: its models by role, ``policy``,
  ``reward``, ``value``) and loading one role as a plain ``transformers`` model with adapters merged
  (:func:`load_merged`).
* ``export_models.py``: ``trl-ext export RUN_DIR OUT_DIR`` (:func:`export_run`).
* ``model_card.py``: the export's model card (``OUT_DIR/README.md``) and ``--push-to-hub REPO``.
* ``sample.py``: ``trl-ext sample RUN_DIR --prompts FILE [--reward MODEL_DIR]``.
* ``score.py``: ``trl-ext score REWARD_DIR --data FILE``.

The command-line parsers are in :mod:`trl_ext.cli`; user docs in ``docs/export-sample-score.md``.
"""

from .export_models import export_run
from .run_dir import load_merged, open_run

__all__ = ["export_run", "load_merged", "open_run"]
