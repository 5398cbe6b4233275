"""TRL GRPOTrainer's ``tools`` / ``environment_factory`` contract (TRL 1.16), as :class:`trl_ext.PPOTrainer` takes
it. How it works: docs/ppo-internals.md#the-tools-contract."""

from __future__ import annotations

import asyncio
import inspect
import numbers

from ...errors import UserInputError
from .tool_rules import (check_environment, check_something_to_call, check_tool, check_tool_args, check_tool_dataset,
                         check_tool_stop_token, check_tool_template, environment_methods, reward_classes)

__all__ = ["Toolbox", "parse_turn", "tool_suffix_ids"]


def parse_turn(tokenizer, ids: list[int], prefix: list[int], tools: list) -> dict:
    """TRL's ``parse_response`` of one assistant turn, on every TRL trl-ext admits: ``tools`` (which types the
    calls' arguments by their schema) is passed where TRL takes it (1.14 on)."""
    from ...trl_internals import parse_response

    if "tools" in inspect.signature(parse_response).parameters:
        return parse_response(tokenizer, ids, prefix=prefix, tools=tools)
    return parse_response(tokenizer, ids, prefix=prefix)


def tool_suffix_ids(tokenizer, tool_messages: list[dict], *, chat_template=None, **chat_template_kwargs) -> list[int]:
    """The tokens that follow an assistant turn with tool calls: the tool results as the template renders them and
    the next assistant header (TRL's ``_get_tool_suffix_ids``: a dummy conversation, EOS-trimmed prefix). The
    trainer's episodes append these, and so must any data written to match them (an SFT warm start, an evaluator)."""
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}]}]
    kwargs = dict(tokenize=True, chat_template=chat_template, return_dict=False, **chat_template_kwargs)
    prefix = list(tokenizer.apply_chat_template(dummy, add_generation_prompt=False, **kwargs))
    full = list(tokenizer.apply_chat_template(dummy + tool_messages, add_generation_prompt=True, **kwargs))
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[: eos[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise UserInputError("processing_class: the chat template renders a tool call differently when a tool "
                             "result follows it (not prefix-preserving)")
    return full[len(prefix):]


class Toolbox:
    """The run's tools and environments (module docstring): built once from the trainer's ``tools`` and
    ``environment_factory``, then per update :meth:`start_batch` gives each row its environment and its tools."""

    def __init__(self, tools, environment_factory, processing_class, chat_template_kwargs: dict | None = None):
        tools = list(tools or [])
        for i, tool in enumerate(tools):
            check_tool(tool, f"tools[{i}]")
        self.standalone_tools = tools
        self.multi_environment = isinstance(environment_factory, dict)
        if environment_factory is None:
            self.factories = None
        elif self.multi_environment:
            self.factories = dict(environment_factory)
        else:
            self.factories = {None: environment_factory}
        self.env_tools: dict = {}
        self.pool: dict = {}
        self.tools = list(tools)  # the union over environments: where only their presence matters
        checked = []
        for name, factory in (self.factories or {}).items():
            env = check_environment(factory, "environment_factory" + ("" if name is None else f"[{name!r}]"))
            checked.append(env)
            self.env_tools[name] = tools + env.tools
            self.pool[name] = [env.instance]
            self.tools += [m for m in env.tools if m not in self.tools]
        check_something_to_call(tools, checked)
        self.reward_types = reward_classes(checked, "get_reward")
        self.turn_reward_types = reward_classes(checked, "get_turn_reward")
        """The environment classes with ``get_turn_reward`` (per-turn rewards), in ``environment_factory``'s order."""
        self.processing_class = processing_class
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.chat_template = self._check_template(processing_class)
        self.environments: list | None = None
        self.row_tools: list[list] = []

    @classmethod
    def for_trainer(cls, tools, environment_factory, processing_class, args, train_dataset) -> "Toolbox":
        """The trainer's toolbox, after the checks of what the trainer was given with it (:mod:`.tool_rules`)."""
        check_tool_dataset(train_dataset, tools, environment_factory, where="train_dataset")
        check_tool_stop_token(args, processing_class)
        check_tool_args(args, environment_factory)
        return cls(tools, environment_factory, processing_class, args.chat_template_kwargs)

    def with_environment_rewards(self, reward_funcs) -> list:
        """``reward_funcs`` as a list (possibly empty) with the environments' ``get_reward`` sources appended."""
        if reward_funcs is None:
            funcs = []
        elif isinstance(reward_funcs, (list, tuple)):
            funcs = list(reward_funcs)
        else:
            funcs = [reward_funcs]
        return funcs + self.reward_functions()[0]

    def render_dataset(self, dataset):
        """``dataset`` with ``input_ids`` = each row's prompt rendered with its tools (its environment's, by the
        ``environment`` column): the lengths the trainer plans memory and the engine's cache with, and the prompts
        the updates start from. ``reset`` text is not known before an episode starts (a prompt with it is rendered,
        and its length checked, then: :meth:`MultiTurnRollout.begin`)."""
        def render(row):
            name = row.get("environment") if self.multi_environment else None
            tools = self.env_tools[name] if self.factories is not None else self.tools
            return {"input_ids": self._render(row["prompt"], tools)}

        return dataset.map(render)

    def _check_template(self, processing_class):
        """TRL's checks and setup of the tokenizer (:func:`.tool_rules.check_tool_template`); returns the template to
        render with (None: the tokenizer's)."""
        from ...trl_internals import get_training_chat_template, is_chat_template_prefix_preserving

        check_tool_template(processing_class, name="processing_class")
        if is_chat_template_prefix_preserving(processing_class):
            return None
        return get_training_chat_template(processing_class)

    # ------------------------------------------------------------------ rewards

    def reward_functions(self) -> tuple[list, list[str]]:
        """One reward function per environment class with ``get_reward`` (TRL's: ``environments`` in, one value or
        None per row), and their names (the class names)."""
        funcs, names = [], []
        for env_type in self.reward_types:
            if inspect.iscoroutinefunction(env_type.get_reward):
                async def get_reward(environments, _env_type=env_type, **kwargs):
                    return [await e.get_reward() if type(e) is _env_type else None for e in environments]
            else:
                def get_reward(environments, _env_type=env_type, **kwargs):
                    return [e.get_reward() if type(e) is _env_type else None for e in environments]
            get_reward.__name__ = env_type.__name__
            funcs.append(get_reward)
            names.append(env_type.__name__)
        return funcs, names

    def turn_reward(self, row: int) -> float | None:
        """Row ``row``'s environment's reward for the turn just played: its ``get_turn_reward()`` (awaited when
        ``async def``) as a float, or None (no such method, no environment, or it returned None)."""
        env = self.environments[row] if self.environments is not None else None
        method = getattr(env, "get_turn_reward", None)
        if not callable(method):
            return None
        value = asyncio.run(method()) if inspect.iscoroutinefunction(method) else method()
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise UserInputError(f"environment_factory: {type(env).__name__}.get_turn_reward returned {value!r}; it "
                                 "must return a number (the reward of the turn just played) or None")
        return float(value)

    # ------------------------------------------------------------------ one batch

    def start_batch(self, rows: list[dict], prompts: list) -> list:
        """Give each row an environment (from the pool) and its tools, reset the environments with the rows
        (``environment`` left out in multi-environment mode) and return the prompts with their ``reset`` text
        appended to the last user message (new lists; the rows are left untouched)."""
        prompts = list(prompts)
        if self.factories is None:
            self.environments = None
            self.row_tools = [self.standalone_tools] * len(rows)
            return prompts
        names = [row.get("environment") if self.multi_environment else None for row in rows]
        unknown = sorted({repr(n) for n in names if n not in self.factories})
        if unknown:
            raise UserInputError(f"environment column: {', '.join(unknown)} not among environment_factory's "
                                 f"environments {list(self.factories)}")
        cursor: dict = {}
        self.environments = []
        for name in names:
            pool, index = self.pool[name], cursor.get(name, 0)
            if index == len(pool):
                pool.append(self.factories[name]())
            cursor[name] = index + 1
            self.environments.append(pool[index])
        self.row_tools = [self.standalone_tools + environment_methods(env) for env in self.environments]
        for i, (row, env) in enumerate(zip(rows, self.environments)):
            kwargs = {k: v for k, v in row.items() if k != "environment"} if self.multi_environment else dict(row)
            observation = env.reset(**kwargs)
            if observation is not None:
                last = prompts[i][-1]
                prompts[i] = prompts[i][:-1] + [{**last, "content": last["content"] + observation}]
        return prompts

    def replace_environment(self, row: int) -> None:
        """After a method of row ``row``'s environment timed out (its thread cannot be stopped): a fresh instance
        takes its place in the pool for the next updates."""
        if self.environments is None:
            return
        env = self.environments[row]
        for name, pool in self.pool.items():
            if env in pool:
                pool[pool.index(env)] = self.factories[name]()

    def render_prompt(self, prompt: list, row: int) -> list[int]:
        """The prompt's token ids with row ``row``'s tools in the system turn (TRL's ``_tokenize_prompts``)."""
        return self._render(prompt, self.row_tools[row] if self.row_tools else self.tools)

    def _render(self, prompt: list, tools: list) -> list[int]:
        """``prompt`` rendered with ``tools`` and the assistant header, as token ids (TRL's ``_tokenize_prompts``)."""
        ids = self.processing_class.apply_chat_template(
            prompt, tools=tools or None, chat_template=self.chat_template, add_generation_prompt=True,
            tokenize=True, return_dict=True, **self.chat_template_kwargs)["input_ids"]
        return list(ids[0] if ids and isinstance(ids[0], list) else ids)

    def tool_suffix_ids(self, tool_messages: list[dict]) -> list[int]:
        """:func:`tool_suffix_ids` with this run's tokenizer and chat template."""
        return tool_suffix_ids(self.processing_class, tool_messages, chat_template=self.chat_template,
                               **self.chat_template_kwargs)

    def parse(self, ids: list[int], prefix: list[int], row: int) -> dict:
        """One assistant turn's message (``tool_calls`` when it calls tools): TRL's ``parse_response``."""
        return parse_turn(self.processing_class, ids, prefix, self.row_tools[row] if self.row_tools else self.tools)

    def tool_dict(self, row: int) -> dict:
        """Row ``row``'s tools by name."""
        return {tool.__name__: tool for tool in (self.row_tools[row] if self.row_tools else self.tools)}
