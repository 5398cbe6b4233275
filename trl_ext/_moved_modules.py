"""trl-ext 0.1.0's flat module paths, kept importable after the move into subpackages (and ``trl_ext.recipes.cli``,
the command line's home before it moved up to ``trl_ext.cli``).

Checkpoints pickle the trainer's config by its module path (HF Trainer's ``training_args.bin`` names
``trl_ext.ppo_config.PPOConfig``), and user code may import ``trl_ext.kl_controllers`` or ``trl_ext.interruption``.
Importing an old path gives the module at its new path, the very same module object (so the classes are the same),
with a ``DeprecationWarning`` naming the new path. ``trl_ext/__init__.py`` installs :class:`MovedModuleFinder`.

The shelving of ``trl_ext/ppo/`` by role (``ppo/rollout/``, ``ppo/objective/``) and the loader package's new name
(``trl_ext.recipes`` -> ``trl_ext.recipe_loader``, every module of it too) are old paths here as well; they were
moved by ``tools/shelve_ppo.py``, which also writes their entries. ``trl_ext.ppo.rollout`` (once the module of the
update's containers) is now a package: it re-exports ``Rollout``, ``MicroBatchOutput`` and ``UpdateStats``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED = {
    "trl_ext.biased_score_model": "trl_ext.models.biased_score_model",
    "trl_ext.checkpoints": "trl_ext.runtime.checkpoints",
    "trl_ext.data": "trl_ext.recipe_loader.data",
    "trl_ext.dpo_config": "trl_ext.preference.dpo_config",
    "trl_ext.dpo_trainer": "trl_ext.preference.dpo_trainer",
    "trl_ext.epoch_stream": "trl_ext.runtime.epoch_stream",
    "trl_ext.interruption": "trl_ext.runtime.interruption",
    "trl_ext.kl_controllers": "trl_ext.ppo.objective.kl_controllers",
    "trl_ext.lora": "trl_ext.models.lora",
    "trl_ext.nonfinite": "trl_ext.runtime.nonfinite",
    "trl_ext.paths": "trl_ext.models.paths",
    "trl_ext.pipeline": "trl_ext.recipe_loader.pipeline",
    "trl_ext.ppo.advantages": "trl_ext.ppo.objective.advantages",
    "trl_ext.ppo.allocator_margin": "trl_ext.ppo.rollout.allocator_margin",
    "trl_ext.ppo.critic_free": "trl_ext.ppo.objective.critic_free",
    "trl_ext.ppo.dynamic_sampling": "trl_ext.ppo.rollout.dynamic_sampling",
    "trl_ext.ppo.kl_controllers": "trl_ext.ppo.objective.kl_controllers",
    "trl_ext.ppo.losses": "trl_ext.ppo.objective.losses",
    "trl_ext.ppo.masked_stats": "trl_ext.ppo.objective.masked_stats",
    "trl_ext.ppo.memory_budget": "trl_ext.ppo.rollout.memory_budget",
    "trl_ext.ppo.objectives": "trl_ext.ppo.objective.objectives",
    "trl_ext.ppo.prompt_stream": "trl_ext.ppo.rollout.prompt_stream",
    "trl_ext.ppo.reward_funcs": "trl_ext.ppo.rollout.reward_funcs",
    "trl_ext.ppo.rollout_chunk": "trl_ext.ppo.rollout.chunk",
    "trl_ext.ppo.rollout_engine": "trl_ext.ppo.rollout.engine",
    "trl_ext.ppo.rollout_logprobs": "trl_ext.ppo.rollout.logprobs",
    "trl_ext.ppo.rollout_steps": "trl_ext.ppo.rollout.steps",
    "trl_ext.ppo.sequences": "trl_ext.ppo.rollout.sequences",
    "trl_ext.ppo_advantages": "trl_ext.ppo.objective.advantages",
    "trl_ext.ppo_config": "trl_ext.ppo.config",
    "trl_ext.ppo_losses": "trl_ext.ppo.objective.losses",
    "trl_ext.ppo_rollout": "trl_ext.ppo.rollout.containers",
    "trl_ext.ppo_trainer": "trl_ext.ppo.trainer",
    "trl_ext.preference_losses": "trl_ext.preference.losses",
    "trl_ext.prompt_stream": "trl_ext.ppo.rollout.prompt_stream",
    "trl_ext.ptx_data": "trl_ext.ppo.ptx_data",
    "trl_ext.quantization": "trl_ext.models.quantization",
    "trl_ext.ranked_preference_data": "trl_ext.preference.ranked_data",
    "trl_ext.recipes": "trl_ext.recipe_loader",
    "trl_ext.recipes.arguments": "trl_ext.recipe_loader.arguments",
    "trl_ext.recipes.argv": "trl_ext.recipe_loader.argv",
    "trl_ext.recipes.cli": "trl_ext.cli",
    "trl_ext.recipes.data": "trl_ext.recipe_loader.data",
    "trl_ext.recipes.data_rows": "trl_ext.recipe_loader.data_rows",
    "trl_ext.recipes.file_text": "trl_ext.recipe_loader.file_text",
    "trl_ext.recipes.loader": "trl_ext.recipe_loader.loader",
    "trl_ext.recipes.lora_targets": "trl_ext.recipe_loader.lora_targets",
    "trl_ext.recipes.pipeline": "trl_ext.recipe_loader.pipeline",
    "trl_ext.recipes.plan": "trl_ext.recipe_loader.plan",
    "trl_ext.recipes.plots": "trl_ext.recipe_loader.plots",
    "trl_ext.recipes.recipe_paths": "trl_ext.recipe_loader.recipe_paths",
    "trl_ext.recipes.reward_keys": "trl_ext.recipe_loader.reward_keys",
    "trl_ext.recipes.summary": "trl_ext.recipe_loader.summary",
    "trl_ext.recipes.validation": "trl_ext.recipe_loader.validation",
    "trl_ext.reward_centering": "trl_ext.preference.reward_centering",
    "trl_ext.reward_config": "trl_ext.preference.reward_config",
    "trl_ext.reward_trainer": "trl_ext.preference.reward_trainer",
    "trl_ext.scalar_heads": "trl_ext.models.scalar_heads",
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
    """Put :class:`MovedModuleFinder` first in ``sys.meta_path``, once. First: a renamed package's old name
    (``trl_ext.recipes``) is the new package itself, so the standard finder would find the old name's submodules
    through its ``__path__`` and load them a second time as other modules; this finder answers only the old paths
    of :data:`MOVED`."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
