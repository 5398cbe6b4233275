"""The recipe keys of reward functions: ``reward_funcs`` (resolved by :mod:`trl_ext.rewards.resolve`) and what changes
without a reward model (``reward_model_path`` optional, ``reward_weights`` one per reward, ``reward_*`` model keys
and a shared base with nothing to share refused). The loader calls :func:`resolve_reward_keys` and
:func:`check_no_reward_model` while it resolves a PPO recipe; ``trl-ext check`` and ``train`` call
:func:`check_reward_columns` once the dataset's columns are known. See ``docs/reward-functions-recipes.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

from ..errors import UserInputError

__all__ = ["resolve_reward_keys", "check_no_reward_model", "check_reward_columns"]


def resolve_reward_keys(ctx) -> None:
    """``ctx``: the loader's resolution state (``pipeline``, ``training_args``, ``path``, ``has_reward_model``; sets
    ``reward_specs`` and ``reward_funcs``).

    `reward_funcs`: parse each entry, import it (a factory is called), refuse one that cannot run here; then
    `reward_weights` must hold one weight per reward (the reward model first). The dataset's columns are checked
    against each function's signature when the dataset is opened (`check_reward_columns`)."""
    from ..rewards.resolve import parse_reward_spec, resolve_reward_funcs

    pipeline = ctx.pipeline
    if pipeline.reward_funcs is not None:
        ctx.reward_specs = [parse_reward_spec(entry, i) for i, entry in enumerate(pipeline.reward_funcs)]
        ctx.reward_funcs = resolve_reward_funcs(ctx.reward_specs, Path(ctx.path).parent)
    weights = getattr(ctx.training_args, "reward_weights", None)
    if weights is not None:
        from ..rewards.contract import reward_func_names

        environments = ctx.tool_keys.environment_rewards if ctx.tool_keys else []  # environments' get_reward: last
        names = (["reward_model"] if ctx.has_reward_model else []) + reward_func_names(ctx.reward_funcs) + environments
        if len(weights) != len(names):
            raise UserInputError(
                f"recipe: key 'reward_weights' has {len(weights)} weight{'s' * (len(weights) != 1)} for "
                f"{len(names)} reward{'s' * (len(names) != 1)} ({', '.join(names) or 'none'}); give one per reward, "
                "the reward model first" + (", the environments' get_reward last" if environments else "")
            )


def check_no_reward_model(merged: dict, has_value_model: bool, pipeline) -> None:
    """`reward_funcs` without `reward_model_path`: `reward_*` keys would configure nothing, and a critic-free run
    has no model to put on a shared base."""
    for key in merged:
        if key.startswith("reward_") and key[len("reward_"):] in _model_config_fields():
            raise UserInputError(
                f"recipe: key '{key}' configures the reward model, but the recipe has none (no reward_model_path); "
                "remove the key or set reward_model_path"
            )
    if pipeline.shared_base and not has_value_model:
        raise UserInputError(
            "recipe: key 'shared_base' has nothing to share: no reward model (reward_funcs only) and no value model "
            "(critic-free advantage_estimator); remove the key"
        )


@functools.lru_cache(maxsize=None)
def _model_config_fields() -> tuple:
    from trl import ModelConfig

    return tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name != "model_name_or_path")


def check_reward_columns(recipe, columns) -> None:
    """Each reward function's signature against the train dataset's ``columns`` (None: not known here), and the
    ``environments`` keyword the trainer adds in a run with environments."""
    from ..rewards.resolve import check_reward_func

    extra = ("environments",) if getattr(recipe, "environment_factory", None) is not None else ()
    for func, entry in zip(recipe.reward_funcs, recipe.reward_func_entries):
        check_reward_func(func, entry, None if columns is None else list(columns), extra)
