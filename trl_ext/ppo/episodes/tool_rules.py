"""The rules on what comes with ``tools`` / ``environment_factory``: the dataset's prompts, the settings, the stop
token, the chat template. The trainer (:meth:`Toolbox.for_trainer`, :class:`Toolbox`) and the recipe loader
(:mod:`trl_ext.recipe_loader.tool_keys`, before any model loads) call the same functions; each caller names the
offending input its own way (``name``: a trainer argument or field as is, a recipe key as ``recipe: key '...'``).
Each problem is one :class:`~trl_ext.errors.UserInputError` line.
"""

from __future__ import annotations

from ...errors import UserInputError, one_line

__all__ = ["check_tool_args", "check_tool_callable", "check_tool_dataset", "check_tool_stop_token",
           "check_tool_template"]


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
        from trl.chat_template_utils import add_response_schema, supports_tool_calling
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
