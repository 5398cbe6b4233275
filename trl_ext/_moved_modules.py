"""trl-ext 0.1.0's flat module paths, kept importable after the move into subpackages (and ``trl_ext.recipes.cli``,
the command line's home before it moved up to ``trl_ext.cli``).

Checkpoints pickle the trainer's config by its module path (HF Trainer's ``training_args.bin`` names
``trl_ext.ppo_config.PPOConfig``), and user code may import ``trl_ext.kl_controllers`` or ``trl_ext.interruption``.
Importing an old path gives the module at its new path, the very same module object (so the classes are the same),
with a ``DeprecationWarning`` naming the new path. ``trl_ext/__init__.py`` installs :class:`MovedModuleFinder`.
``trl_ext.models`` and ``trl_ext.recipes`` kept their names: they are packages now and re-export their public names.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "trl_ext.accumulation_state": "trl_ext.ppo.accumulation_state",
    "trl_ext.biased_score_model": "trl_ext.models.biased_score_model",
    "trl_ext.checkpoints": "trl_ext.runtime.checkpoints",
    "trl_ext.data": "trl_ext.recipes.data",
    "trl_ext.dpo_config": "trl_ext.preference.dpo_config",
    "trl_ext.dpo_trainer": "trl_ext.preference.dpo_trainer",
    "trl_ext.epoch_stream": "trl_ext.runtime.epoch_stream",
    "trl_ext.interruption": "trl_ext.runtime.interruption",
    "trl_ext.kl_controllers": "trl_ext.ppo.kl_controllers",
    "trl_ext.lora": "trl_ext.models.lora",
    "trl_ext.nonfinite": "trl_ext.runtime.nonfinite",
    "trl_ext.paths": "trl_ext.models.paths",
    "trl_ext.pipeline": "trl_ext.recipes.pipeline",
    "trl_ext.ppo_advantages": "trl_ext.ppo.advantages",
    "trl_ext.ppo_config": "trl_ext.ppo.config",
    "trl_ext.ppo_losses": "trl_ext.ppo.losses",
    "trl_ext.ppo_rollout": "trl_ext.ppo.rollout",
    "trl_ext.ppo_trainer": "trl_ext.ppo.trainer",
    "trl_ext.preference_losses": "trl_ext.preference.losses",
    "trl_ext.prompt_stream": "trl_ext.ppo.prompt_stream",
    "trl_ext.ptx_data": "trl_ext.ppo.ptx_data",
    "trl_ext.quantization": "trl_ext.models.quantization",
    "trl_ext.ranked_preference_data": "trl_ext.preference.ranked_data",
    "trl_ext.reward_centering": "trl_ext.preference.reward_centering",
    "trl_ext.reward_config": "trl_ext.preference.reward_config",
    "trl_ext.reward_trainer": "trl_ext.preference.reward_trainer",
    "trl_ext.scalar_heads": "trl_ext.models.scalar_heads",
    # the command line went back to the top (it runs both recipes/ and export/); 0.2's path still imports
    "trl_ext.recipes.cli": "trl_ext.cli",
}
"""Old module path -> new module path."""


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths in :data:`MOVED` and loads each as the module at its new path."""

    def __init__(self):
        self._own_specs = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new}; import it from there (the old path will go in a later release)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # the import system gave the module the old path's spec; it keeps its own (importlib.reload, pickling)
        module.__spec__ = self._own_specs.pop(module.__spec__.name)


def install() -> None:
    """Add :class:`MovedModuleFinder` to ``sys.meta_path`` once (after the standard finders)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
