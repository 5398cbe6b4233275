"""The recipe keys of multi-turn episodes: ``tools`` (functions the model may call) and ``environment_factory`` (a
callable that builds an environment, or ``{name: callable}`` with an ``environment`` column choosing one per row),
passed to ``trl_ext.PPOTrainer(tools=..., environment_factory=...)`` (TRL GRPOTrainer's contract,
:mod:`trl_ext.ppo.episodes`). How it works: docs/internals-recipes.md#tool-keys-of-a-recipe."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserInputError
from ..ppo.episodes.tool_rules import (check_environment, check_something_to_call, check_tool, check_tool_args,
                                       check_tool_dataset, check_tool_stop_token, check_tool_template, reward_classes)
from ..user_code.entries import FORMS, load_entry, parse_entry

__all__ = ["ToolKeys", "check_reward_source", "check_tool_data", "check_tool_tokenizer", "resolve_tool_keys",
           "tool_lines", "uses_tools"]


@dataclass
class ToolKeys:
    """The resolved ``tools`` and ``environment_factory`` of a recipe.

    Attributes:
        tools / tool_entries: the tools' callables and how messages name them (``recipe: key 'tools' entry N ...``).
        environment_factory: the callable (a dict of them for several environments), or None.
        environment_rewards: the class names of the environments with ``get_reward`` (reward sources, in order).
        environment_lines: what `trl-ext check` prints about each environment.
    """

    tools: list = field(default_factory=list)
    tool_entries: list = field(default_factory=list)
    environment_factory: Any = None
    environment_rewards: list = field(default_factory=list)
    environment_lines: list = field(default_factory=list)

    def recipe_fields(self) -> dict:
        """The :class:`~trl_ext.recipe_loader.arguments.Recipe` fields of the same names."""
        return {"tools": self.tools, "tool_entries": self.tool_entries,
                "environment_factory": self.environment_factory, "environment_lines": self.environment_lines}


def uses_tools(recipe) -> bool:
    """Whether the run has multi-turn episodes (tools or environments)."""
    return bool(getattr(recipe, "tools", None)) or getattr(recipe, "environment_factory", None) is not None


def recipe_key(key: str) -> str:
    """How messages name a recipe key."""
    return f"recipe: key '{key}'"


def _resolve_tools(entries: list, base_dir: Path) -> tuple[list, list]:
    """The callables of the ``tools`` entries and how messages name them."""
    tools, where = [], []
    for index, value in enumerate(entries):
        entry = parse_entry(value, index, key="tools")
        tool = load_entry(entry, base_dir, what="a tool")
        check_tool(tool, entry.where)
        tools.append(tool)
        where.append(entry.where)
    return tools, where


def _environment_specs(value) -> dict:
    """``{name or None: (spec text, how messages name it)}`` of the ``environment_factory`` value."""
    key = "recipe: key 'environment_factory'"
    if isinstance(value, str):
        return {None: (value, f"{key} {value.strip()!r}")}
    if not isinstance(value, dict) or not value:
        raise UserInputError(f"{key}: give {FORMS.replace('function', 'callable')}, or a mapping of environment "
                             f"names to them (one per value of the dataset's 'environment' column), got {value!r}")
    out = {}
    for name, spec in value.items():
        if not isinstance(spec, str):
            raise UserInputError(f"{key} environment {name!r}: give {FORMS.replace('function', 'callable')}, "
                                 f"got {spec!r} (an environment with arguments: a function in a file that builds it)")
        out[str(name)] = (spec, f"{key} environment {str(name)!r} {spec.strip()!r}")
    return out


def _environment_line(name, env) -> str:
    """What `trl-ext check` prints about one checked environment."""
    return (f"{'' if name is None else f'{name}: '}{type(env.instance).__name__} (reset; tools: "
            f"{', '.join(m.__name__ for m in env.tools) or 'none'}; reward: {', '.join(env.rewards) or 'none'})")


def resolve_tool_keys(ctx) -> ToolKeys:
    """The recipe's :class:`ToolKeys` (module docstring); ``ctx``: the loader's resolution state (``pipeline``,
    ``training_args``, ``path``, ``for_check``)."""
    pipeline, base_dir, out = ctx.pipeline, Path(ctx.path).parent, ToolKeys()
    if pipeline.tools is not None:
        out.tools, out.tool_entries = _resolve_tools(pipeline.tools, base_dir)
    if pipeline.environment_factory is None:
        if out.tools:
            check_tool_args(ctx.training_args, None, name=recipe_key)
        return out
    factories, checked = {}, []
    for name, (text, where) in _environment_specs(pipeline.environment_factory).items():
        entry = parse_entry(text, key="environment_factory", where=where)
        factories[name] = load_entry(entry, base_dir, what="an environment factory")
        checked.append(check_environment(factories[name], where, keep=not ctx.for_check))  # train: the trainer's
        out.environment_lines.append(_environment_line(name, checked[-1]))
    out.environment_factory = factories[None] if None in factories else factories
    out.environment_rewards = [cls.__name__ for cls in reward_classes(checked)]
    check_something_to_call(out.tools, checked, name=recipe_key)
    check_tool_args(ctx.training_args, out.environment_factory, name=recipe_key)
    return out


def check_reward_source(ctx) -> None:
    """A PPO recipe needs a reward: a reward model, reward functions, or an environment with ``get_reward``."""
    tool_keys = ctx.tool_keys or ToolKeys()
    if ctx.has_reward_model or ctx.reward_funcs or tool_keys.environment_rewards:
        return
    message = ("recipe: missing key 'reward_model_path' (the reward model PPO optimises) or 'reward_funcs' (reward "
               "functions)")
    if tool_keys.environment_factory is not None:
        message += "; environment_factory's environments have no get_reward method either"
    raise UserInputError(message)


def check_tool_data(recipe, dataset, *, name: str, split: str) -> None:
    """With tools: the dataset's ``prompt`` column holds chat messages (rendered with the tools' schema);
    with several environments, its ``environment`` column names one of them in every row (the trainer's rule,
    :func:`~trl_ext.ppo.episodes.tool_rules.check_tool_dataset`)."""
    if uses_tools(recipe):
        check_tool_dataset(dataset, getattr(recipe, "tools", None), recipe.environment_factory,
                           where=f"dataset '{name}' split '{split}'")


def check_tool_tokenizer(recipe, tokenizer) -> None:
    """With tools: every turn ends at the tokenizer's EOS (no other ``stop_token_id``), and its chat template renders
    a tool-calling conversation whose tool calls TRL can parse (the trainer's own rules,
    :mod:`trl_ext.ppo.episodes.tool_rules`, before any model loads)."""
    if not uses_tools(recipe):
        return
    check_tool_stop_token(recipe.training_args, tokenizer, name=recipe_key)
    check_tool_template(tokenizer, name=recipe_key("model_name_or_path"), model=recipe.model_args.model_name_or_path)


def tool_lines(recipe) -> list[str]:
    """What `trl-ext check` prints about the recipe's tools and environments."""
    lines = []
    if getattr(recipe, "tools", None):
        lines.append(f"tools: {', '.join(t.__name__ for t in recipe.tools)} (imported; JSON schemas for the chat "
                     "template)")
    for line in getattr(recipe, "environment_lines", None) or []:
        lines.append(f"environment: {line}")
    return lines
