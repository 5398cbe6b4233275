"""The contract of ``tools`` / ``environment_factory``: the tools and environments themselves
(:func:`check_tool`, :func:`check_environment`), the dataset's prompts, the settings, the stop token, the chat
template. The trainer (:meth:`Toolbox.for_trainer`, :class:`Toolbox`) and the recipe loader
(:mod:`trl_ext.recipe_loader.tool_keys`, before any model loads) call the same functions; each caller names the
offending input its own way (``where``, or ``name``: a trainer argument as is, a recipe key as ``recipe: key '...'``).
Each problem is one :class:`~trl_ext.errors.UserInputError` line.
"""

from __future__ import annotations

import contextlib
import inspect
import weakref
from dataclasses import dataclass
from typing import Any

from ...errors import UserInputError, one_line

__all__ = ["NOT_TOOLS", "CheckedEnvironment", "check_environment", "check_something_to_call", "check_tool",
           "check_tool_args", "check_tool_callable", "check_tool_dataset", "check_tool_stop_token",
           "check_tool_template", "environment_methods", "reward_classes"]

REWARD_METHODS = ("get_reward", "get_turn_reward")
NOT_TOOLS = ("reset", *REWARD_METHODS)
"""An environment's public methods that are not tools: TRL's ``reset`` and ``get_reward``, trl-ext's per-turn reward."""
SCHEMA_HINT = "a tool needs type hints on its arguments and a docstring with an Args: section describing each"
_KEPT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # factory -> what check_environment(keep=True) built


def _as_is(key: str) -> str:
    return key


def check_tool_callable(tool, where: str) -> None:
    """``tool`` is a callable with a ``__name__`` (the model calls a tool by its name). ``where``: how messages name
    the entry; the value is shown as its repr when that is one short line, else by its type."""
    if not callable(tool) or not hasattr(tool, "__name__"):
        shown = repr(tool)
        if len(shown) > 40 or "\n" in shown:
            shown = type(tool).__name__
        raise UserInputError(f"{where}: {shown} is not a function (a tool is called by its __name__)")


def check_tool(tool, where: str) -> None:
    """``tool`` can be offered to the model: a named callable whose JSON schema the chat template can render."""
    from transformers.utils import get_json_schema

    check_tool_callable(tool, where)
    try:
        get_json_schema(tool)
    except Exception as err:  # noqa: BLE001 - transformers' parsing errors, as one line
        raise UserInputError(f"{where}: the chat template cannot describe it ({one_line(err)}); {SCHEMA_HINT}"
                             ) from None


def environment_methods(instance) -> list:
    """The tool methods of an environment instance: public functions of its class but :data:`NOT_TOOLS` (listed on
    the class, as TRL does: ``getmembers`` on the instance would evaluate properties)."""
    return [getattr(instance, name) for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in NOT_TOOLS and not name.startswith("_")]


@dataclass
class CheckedEnvironment:
    """An environment factory's first instance, checked: its tool methods and which of ``get_reward`` and
    ``get_turn_reward`` it has."""

    instance: Any
    tools: list
    rewards: tuple


def check_environment(factory, where: str, *, keep: bool = False) -> CheckedEnvironment:
    """Build one instance of ``factory`` and check it: the call works, the instance has ``reset``, each public
    method is a tool the chat template can describe. ``where``: how messages name the factory. ``keep``: hand this
    instance to the next check of ``factory`` instead of building another (`trl-ext train`: the recipe loader's
    check, then the trainer's, which plays it)."""
    with contextlib.suppress(TypeError):  # a factory that cannot be weakly referenced is never kept
        kept = _KEPT.pop(factory, None)
        if kept is not None:
            return kept
    if not callable(factory):
        raise UserInputError(f"{where}: {factory!r} is not callable")
    try:
        instance = factory()
    except Exception as err:  # noqa: BLE001 - the user's constructor, as one line
        raise UserInputError(f"{where}: calling it failed: {one_line(err)} (the trainer calls it without "
                             "arguments to build each episode's environment)") from None
    if not callable(getattr(instance, "reset", None)):
        raise UserInputError(f"{where}: its instance ({type(instance).__name__}) has no reset method; an environment "
                             "defines reset(**row), called with each dataset row before the episode")
    tools = environment_methods(instance)
    for method in tools:
        check_tool(method, f"{where}: method '{method.__name__}'")
    rewards = tuple(m for m in REWARD_METHODS if callable(getattr(instance, m, None)))
    checked = CheckedEnvironment(instance, tools, rewards)
    if keep:
        with contextlib.suppress(TypeError):
            _KEPT[factory] = checked
    return checked


def reward_classes(environments: list[CheckedEnvironment], method: str = "get_reward") -> list[type]:
    """The classes of ``environments`` that have ``method`` (``get_reward``: a reward source named after the class),
    each once, in order."""
    classes = [type(env.instance) for env in environments if method in env.rewards]
    return list(dict.fromkeys(classes))


def check_something_to_call(tools: list, environments: list[CheckedEnvironment], *, name=_as_is) -> None:
    """Tools, or an environment with a public method: else the model would have nothing to call."""
    if tools or any(env.tools for env in environments):
        return
    if not environments:
        raise UserInputError(f"{name('tools')}: none given and no environment_factory: the model would have nothing "
                             "to call")
    raise UserInputError(f"{name('environment_factory')}: its environments have no public method and there are no "
                         "tools: the model would have nothing to call")


def check_tool_dataset(dataset, tools, environment_factory, *, where: str) -> None:
    """The dataset's ``prompt`` column holds chat messages (they are rendered with the tools' schema); with several
    environments its ``environment`` column names one of them in every row. ``where``: how messages name the
    dataset. A dataset without ``column_names`` is not checked here (the episodes check each row as it comes)."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        return
    columns = list(columns)
    keys = " and ".join(k for k, v in (("tools", tools), ("environment_factory", environment_factory)) if v)
    listing = f"(columns: {', '.join(columns) or 'none'})"
    if "prompt" not in columns:
        raise UserInputError(f"{where} has no column 'prompt' {listing}; {keys} need the prompts as chat messages "
                             "(rendered with the tools' schema)")
    prompt = dataset[0]["prompt"] if len(dataset) else []  # one Arrow type for the column: the first row tells
    if not (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)):
        raise UserInputError(f"{where} row 0: with {keys} 'prompt' must be chat messages (a list of "
                             f"{{'role', 'content'}} dicts), got {type(prompt).__name__}")
    if not isinstance(environment_factory, dict):
        return
    if "environment" not in columns:
        raise UserInputError(f"{where} has no column 'environment' {listing}; environment_factory names several "
                             f"environments ({', '.join(environment_factory)}): each row names its own")
    environments = list(dataset["environment"])
    unknown = [env for env in dict.fromkeys(environments) if env not in environment_factory]
    if unknown:
        raise UserInputError(f"{where} row {environments.index(unknown[0])}: environment {unknown[0]!r} is not one "
                             f"of environment_factory's ({', '.join(environment_factory)})")


def check_tool_args(args, environment_factory, *, name=_as_is) -> None:
    """The settings episodes with tools cannot honour: ``dynamic_sampling`` (its extra rounds' episodes are not
    merged), and ``reward_num_workers`` with environments (reward functions receive them, and they live in the
    training process)."""
    if getattr(args, "dynamic_sampling", False):
        raise UserInputError(f"{name('dynamic_sampling')}: not supported with tools yet (the episodes of its extra "
                             "rounds are not merged); leave dynamic_sampling off with tools or environment_factory")
    if environment_factory is not None and getattr(args, "reward_num_workers", 0):
        raise UserInputError(f"{name('reward_num_workers')}: reward functions receive the environments, which live "
                             "in the training process; set reward_num_workers: 0 with environment_factory")


def check_tool_stop_token(args, tokenizer, *, name=_as_is) -> None:
    """Every turn ends at the tokenizer's EOS: no other ``stop_token_id``."""
    stop = getattr(args, "stop_token_id", None)
    if stop is not None and stop != tokenizer.eos_token_id:
        raise UserInputError(f"{name('stop_token_id')}: {stop} with tools; each turn ends at the tokenizer's EOS "
                             f"({tokenizer.eos_token_id}): leave stop_token_id unset or use stop_token: eos")


def check_tool_template(tokenizer, *, name: str, model: str | None = None) -> None:
    """The tokenizer's chat template renders a tool-calling conversation, and TRL can parse the tool calls a model
    writes with it (a response schema is added to ``tokenizer`` where it has no parser yet). ``model``: the model
    the tokenizer came from, when a recipe names it (its ``chat_template_path`` can then replace the template).
    On a TRL without these helpers nothing is checked here (the trainer reports what it cannot do)."""
    try:
        from ...trl_internals import add_response_schema, supports_tool_calling
    except ImportError:
        return
    of = f" of {model!r}" if model is not None else ""
    if not supports_tool_calling(tokenizer):
        raise UserInputError(f"{name}: the chat template{of} does not render a tool-calling conversation (user, "
                             "assistant with tool_calls, tool); use a model whose template does (Qwen2.5/Qwen3, "
                             f"Llama 3.1){' or set chat_template_path' if model is not None else ''}")
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError as err:
            raise UserInputError(f"{name}: TRL cannot parse tool calls with the chat template{of} ({one_line(err)})"
                                 ) from None
