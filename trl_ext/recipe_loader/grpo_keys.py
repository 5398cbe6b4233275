"""GRPOConfig's names in PPO recipes: ``num_generations``, ``beta``, ``epsilon``, ``max_completion_length`` and the
other keys that PPOConfig names otherwise (``from_grpo.RENAMED``) become PPOConfig's keys by the mapping
:meth:`trl_ext.PPOConfig.from_grpo_config` uses (``from_grpo.renamed_kwargs``), before the recipe is parsed; a
recipe that gives both names of one setting is refused. Table: docs/coming-from-grpo.md."""

from __future__ import annotations

from ..errors import UserInputError
from ..ppo.grpo_compat.from_grpo import RENAMED, renamed_kwargs

__all__ = ["translate_grpo_keys"]


def _typed(value):
    """A command-line override's string as YAML reads it (``--beta 0.04`` -> 0.04); recipe values unchanged."""
    import yaml

    return yaml.safe_load(value) if isinstance(value, str) else value


def translate_grpo_keys(merged: dict) -> dict:
    """A PPO recipe's keys (recipe and overrides merged) with GRPOConfig's names replaced by PPOConfig's.

    As ``from_grpo_config`` maps them: ``num_generations`` -> ``num_samples_per_prompt`` (with ``advantage_estimator:
    grpo`` unless the recipe sets one), ``beta`` -> ``kl_coef`` (with ``kl_in: loss``, GRPO's k3 term, unless the
    recipe sets ``kl_in`` or an ``advantage_estimator``, whose default then holds), ``max_completion_length`` ->
    ``response_length`` (with ``stop_token: eos`` unless set), and the rest of ``RENAMED``.

    Raises:
        UserInputError: both names of a setting (``beta`` and ``kl_coef``), or a value with no counterpart.
    """
    names = [key for key in merged if key in RENAMED]
    if not names:
        return merged
    for name in names:
        for target in RENAMED[name]:
            if target in merged:
                raise UserInputError(
                    f"recipe: keys '{name}' and '{target}' are both given: '{name}' is GRPOConfig's name for "
                    f"'{target}' (as PPOConfig.from_grpo_config maps it); keep one")
    try:
        translated = renamed_kwargs({name: _typed(merged[name]) for name in names})
    except UserInputError as err:
        raise UserInputError(f"recipe: key '{str(err).split(':', 1)[0]}':{str(err).split(':', 1)[1]}") from None
    out = {key: value for key, value in merged.items() if key not in names}
    out.update({key: value for key, value in translated.items() if key not in merged})
    if "num_generations" in names and "advantage_estimator" not in merged:
        out["advantage_estimator"] = "grpo"
    if "beta" in names and "kl_in" not in merged and "advantage_estimator" not in merged:
        out["kl_in"] = "loss"
    return out
