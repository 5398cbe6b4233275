"""The recipe keys of multi-turn episodes: ``tools`` (functions the model may call) and ``environment_factory`` (a
callable that builds an environment, or ``{name: callable}`` with an ``environment`` column choosing one per row),
passed to ``trl_ext.PPOTrainer(tools=..., environment_factory=...)`` (TRL GRPOTrainer's contract,
:mod:`trl_ext.ppo.episodes`).

Entries are written and imported as ``reward_funcs`` entries are (:mod:`trl_ext.rewards.resolve`):
``module:function``, dotted ``module.function``, ``path/to/file.py:function`` (the recipe's folder first, then the
current directory), and for a tool also a factory ``{name: FACTORY, kwargs: {...}}`` whose call returns it.

Checked while the recipe resolves, before any model loads (:func:`resolve_tool_keys`): each entry imports and is
callable; each tool, and each public method of each environment, has the JSON schema the chat template renders
(typed arguments, a docstring with an ``Args:`` section: ``transformers.utils.get_json_schema``); each environment
factory is called once and its instance must have ``reset``. An environment whose class has ``get_reward`` is a
reward source (named after the class), so such a recipe needs neither ``reward_model_path`` nor ``reward_funcs``.
Once the data and the tokenizer are open: :func:`check_tool_data` (a ``prompt`` column of chat messages; the
``environment`` column of several environments) and :func:`check_tool_tokenizer` (a template that renders tool
calls). Each problem is one line naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import UserInputError

__all__ = ["ToolKeys", "check_reward_source", "check_tool_data", "check_tool_tokenizer", "resolve_tool_keys",
           "tool_lines", "uses_tools"]

SPEC_FORMS = "'module:function' or 'path/to/file.py:function'"
SCHEMA_HINT = "a tool needs type hints on its arguments and a docstring with an Args: section describing each"


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


def _decoded(value):
    """A mapping that travelled through the argument parser as JSON text, back as the recipe wrote it."""
    if isinstance(value, str) and value.lstrip().startswith(("{", "[")):
        try:
            return json.loads(value)
        except ValueError:
            return value  # left as text: the spec parser names it
    return value


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def check_tool(tool, where: str) -> None:
    """``tool`` can be offered to the model: a named callable whose JSON schema the chat template can render."""
    from transformers.utils import get_json_schema

    if not callable(tool) or not hasattr(tool, "__name__"):
        raise UserInputError(f"{where}: {type(tool).__name__} is not a function (a tool is called by its __name__)")
    try:
        get_json_schema(tool)
    except Exception as err:  # noqa: BLE001 - transformers' parsing errors, as one line
        raise UserInputError(f"{where}: the chat template cannot describe it ({_one_line(err)}); {SCHEMA_HINT}"
                             ) from None


def _resolve_tools(entries: list, base_dir: Path) -> tuple[list, list]:
    """The callables of the ``tools`` entries and how messages name them."""
    from ..rewards.resolve import load_reward_func, parse_reward_spec

    tools, where = [], []
    for index, entry in enumerate(entries):
        spec = parse_reward_spec(_decoded(entry), index, key="tools")
        if spec.kind == "remote":
            raise spec.fail(f"a tool is a Python function called in the training process; give {SPEC_FORMS}")
        tool = load_reward_func(spec, base_dir, what="a tool (a function)")
        check_tool(tool, spec.where)
        tools.append(tool)
        where.append(spec.where)
    return tools, where


def _environment_specs(value) -> dict:
    """``{name or None: (spec text, how messages name it)}`` of the ``environment_factory`` value."""
    key = "recipe: key 'environment_factory'"
    if isinstance(value, str):
        return {None: (value, f"{key} {value.strip()!r}")}
    if not isinstance(value, dict) or not value:
        raise UserInputError(f"{key}: give {SPEC_FORMS.replace('function', 'callable')}, or a mapping of environment "
                             f"names to them (one per value of the dataset's 'environment' column), got {value!r}")
    out = {}
    for name, spec in value.items():
        if not isinstance(spec, str):
            raise UserInputError(f"{key} environment {name!r}: give {SPEC_FORMS.replace('function', 'callable')}, "
                                 f"got {spec!r} (an environment with arguments: a function in a file that builds it)")
        out[str(name)] = (spec, f"{key} environment {str(name)!r} {spec.strip()!r}")
    return out


def _resolve_environment(spec_text: str, where: str, base_dir: Path):
    """``(factory, instance)``: the callable imported and called once; its instance must have ``reset``."""
    from ..rewards.resolve import load_reward_func, parse_reward_spec

    spec = parse_reward_spec(spec_text, where=where)
    if spec.kind != "function":
        raise spec.fail("an environment is built in the training process; give "
                        f"{SPEC_FORMS.replace('function', 'callable')}")
    factory = load_reward_func(spec, base_dir)
    try:
        instance = factory()
    except Exception as err:  # noqa: BLE001 - the user's constructor, as one line
        raise UserInputError(f"{where}: calling it failed: {_one_line(err)} (the trainer calls it without "
                             "arguments to build each episode's environment)") from None
    if not callable(getattr(instance, "reset", None)):
        raise UserInputError(f"{where}: its instance ({type(instance).__name__}) has no reset method; an environment "
                             "defines reset(**row), called with each dataset row before the episode")
    return factory, instance


def resolve_tool_keys(ctx) -> ToolKeys:
    """The recipe's :class:`ToolKeys` (module docstring); ``ctx``: the loader's resolution state (``pipeline``,
    ``training_args``, ``path``). The parsed entries are put back in ``ctx.pipeline`` (mappings decoded)."""
    from ..ppo.episodes.toolbox import environment_methods

    pipeline, base_dir, out = ctx.pipeline, Path(ctx.path).parent, ToolKeys()
    if pipeline.tools is not None:
        pipeline.tools = [_decoded(entry) for entry in pipeline.tools]
        out.tools, out.tool_entries = _resolve_tools(pipeline.tools, base_dir)
    if pipeline.environment_factory is None:
        return out
    pipeline.environment_factory = _decoded(pipeline.environment_factory)
    factories, methods = {}, 0
    for name, (spec_text, where) in _environment_specs(pipeline.environment_factory).items():
        factories[name], instance = _resolve_environment(spec_text, where, base_dir)
        cls = type(instance).__name__
        tools = environment_methods(instance)
        for method in tools:
            check_tool(method, f"{where}: method '{method.__name__}'")
        methods += len(tools)
        rewarded = callable(getattr(instance, "get_reward", None))
        if rewarded and cls not in out.environment_rewards:
            out.environment_rewards.append(cls)
        out.environment_lines.append(
            f"{'' if name is None else f'{name}: '}{cls} (reset; tools: "
            f"{', '.join(m.__name__ for m in tools) or 'none'}; reward: {'get_reward' if rewarded else 'none'})")
    out.environment_factory = factories[None] if None in factories else factories
    if not methods and not out.tools:
        raise UserInputError("recipe: key 'environment_factory': its environments have no public method and the "
                             "recipe has no 'tools': the model would have nothing to call")
    if getattr(ctx.training_args, "reward_num_workers", 0):
        raise UserInputError("recipe: key 'reward_num_workers': reward functions receive the environments, which live "
                             "in the training process; set reward_num_workers: 0 with environment_factory")
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
    with several environments, its ``environment`` column names one of them in every row."""
    if not uses_tools(recipe):
        return
    keys = " and ".join(k for k in ("tools", "environment_factory") if getattr(recipe, k, None))
    where, columns = f"dataset '{name}' split '{split}'", list(dataset.column_names or [])
    listing = f"(columns: {', '.join(columns) or 'none'})"
    if "prompt" not in columns:
        raise UserInputError(f"{where} has no column 'prompt' {listing}; {keys} need the prompts as chat messages "
                             "(rendered with the tools' schema)")
    prompt = dataset[0]["prompt"] if len(dataset) else []  # one Arrow type for the column: the first row tells
    if not (isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt)):
        raise UserInputError(f"{where} row 0: with {keys} 'prompt' must be chat messages (a list of "
                             f"{{'role', 'content'}} dicts), got {type(prompt).__name__}")
    factories = recipe.environment_factory
    if isinstance(factories, dict):
        if "environment" not in columns:
            raise UserInputError(f"{where} has no column 'environment' {listing}; environment_factory names several "
                                 f"environments ({', '.join(factories)}): each row names its own")
        unknown = [env for env in dataset.unique("environment") if env not in factories]
        if unknown:
            row = list(dataset["environment"]).index(unknown[0])
            raise UserInputError(f"{where} row {row}: environment {unknown[0]!r} is not one of environment_factory's "
                                 f"({', '.join(factories)})")


def check_tool_tokenizer(recipe, tokenizer) -> None:
    """With tools: every turn ends at the tokenizer's EOS (no other ``stop_token_id``), and its chat template renders
    a tool-calling conversation whose tool calls TRL can parse (the trainer's own checks, before any model loads)."""
    if not uses_tools(recipe):
        return
    stop = getattr(recipe.training_args, "stop_token_id", None)
    if stop is not None and stop != tokenizer.eos_token_id:
        raise UserInputError(f"recipe: key 'stop_token_id': {stop} with tools; each turn ends at the tokenizer's EOS "
                             f"({tokenizer.eos_token_id}): leave stop_token_id unset or use stop_token: eos")
    try:
        from trl.chat_template_utils import add_response_schema, supports_tool_calling
    except ImportError:  # an older TRL: the trainer reports what it cannot do
        return
    model = recipe.model_args.model_name_or_path
    if not supports_tool_calling(tokenizer):
        raise UserInputError(f"recipe: key 'model_name_or_path': the chat template of '{model}' does not render a "
                             "tool-calling conversation (user, assistant with tool_calls, tool); use a model whose "
                             "template does (Qwen2.5/Qwen3, Llama 3.1) or set chat_template_path")
    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError as err:
            raise UserInputError(f"recipe: key 'model_name_or_path': TRL cannot parse tool calls with the chat "
                                 f"template of '{model}' ({_one_line(err)})") from None


def tool_lines(recipe) -> list[str]:
    """What `trl-ext check` prints about the recipe's tools and environments."""
    lines = []
    if getattr(recipe, "tools", None):
        lines.append(f"tools: {', '.join(t.__name__ for t in recipe.tools)} (imported; JSON schemas for the chat "
                     "template)")
    for line in getattr(recipe, "environment_lines", None) or []:
        lines.append(f"environment: {line}")
    return lines
