"""TRL GRPO's reward-function contract: how a reward function is named, called and what it may return. How it works:
docs/internals-recipes.md#the-reward-contract."""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import threading

from ..errors import UserInputError

__all__ = [
    "CONTRACT_KEYWORDS",
    "RewardFunctionError",
    "call_reward_funcs",
    "check_rewards",
    "is_async_reward_func",
    "is_reward_model",
    "reward_func_names",
]

CONTRACT_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
"""The keywords every reward function gets besides the dataset columns (TRL 1.16's, minus ``environments``)."""

_RESERVED_COLUMNS = ("prompt", "completion", "completion_ids", "input_ids", "attention_mask")
"""Dataset columns not passed as keyword arguments: the prompt arrives as ``prompts``; the tokenized prompt stays."""


class RewardFunctionError(UserInputError):
    """A reward function failed or broke the contract; the message names it and the first offending completion.

    Raised in the process that called the function (reward functions run in process unless
    ``reward_num_workers > 0``); the run stops there, before any optimizer step of the update, so the last complete
    checkpoint is intact.
    """


def is_reward_model(func) -> bool:
    """True for a model in ``reward_funcs`` (scored by its scalar head like PPO's reward model), not a function."""
    import torch

    return isinstance(func, torch.nn.Module)


def _func_name(func) -> str:
    if is_reward_model(func):
        if hasattr(func, "adapter_name"):  # trl_ext.models.shared_base.SharedBaseScalarModel
            return func.adapter_name
        path = getattr(getattr(func, "config", None), "_name_or_path", "") or type(func).__name__
        return str(path).rstrip("/").split("/")[-1]
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", None) or type(func).__name__


def reward_func_names(funcs) -> list[str]:
    """Metric names of the reward functions (``rewards/<name>/mean``): TRL's (``__name__``; a model's
    ``config._name_or_path`` basename), made unique with ``_2``, ``_3``... when two share a name."""
    names, seen = [], {}
    for func in funcs:
        name = _func_name(func)
        seen[name] = seen.get(name, 0) + 1
        names.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return names


def is_async_reward_func(func) -> bool:
    """True for an ``async def`` function or an object whose ``__call__`` is one."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(getattr(func, "__call__", None))


def keyword_columns(columns: dict) -> dict:
    """The dataset columns a reward function gets as keywords (all but the prompt and the tokenized prompt)."""
    return {key: value for key, value in columns.items() if key not in _RESERVED_COLUMNS}


def _describe(inputs: dict, index: int) -> str:
    """The completion at ``index`` in a short form for error messages."""
    def short(value):
        text = repr(value)
        return text if len(text) <= 120 else text[:117] + "..."

    parts = [f"{key}={short(inputs[key][index])}" for key in ("prompts", "completions") if key in inputs]
    parts += [f"{key}={short(value[index])}" for key, value in inputs.items()
              if key not in CONTRACT_KEYWORDS and isinstance(value, list) and len(value) > index]
    return ", ".join(parts)


def check_rewards(name: str, values, inputs: dict) -> list[float]:
    """The rewards of one call as floats (``None`` -> NaN), or :class:`RewardFunctionError`.

    Args:
        name: the function's name, for the message.
        values: what it returned.
        inputs: the keywords it was called with (``completions`` sets the expected count; the first offending
            completion is quoted from them).
    """
    expected = len(inputs["completions"])
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise RewardFunctionError(
            f"reward function '{name}': returned {type(values).__name__}, expected a list of {expected} floats "
            "(one per completion, None where it does not apply)"
        )
    values = list(values.tolist() if hasattr(values, "tolist") else values)
    if len(values) != expected:
        raise RewardFunctionError(
            f"reward function '{name}': returned {len(values)} rewards for {expected} completions; return exactly "
            "one float (or None) per completion"
        )
    out = []
    for i, value in enumerate(values):
        if value is None:
            out.append(math.nan)
            continue
        if hasattr(value, "item") and getattr(value, "ndim", 0) == 0:
            value = value.item()
        if not isinstance(value, numbers.Real):
            raise RewardFunctionError(
                f"reward function '{name}': reward {i} is {type(value).__name__} {value!r}, not a number (return "
                f"a float or None); completion: {_describe(inputs, i)}"
            )
        value = float(value)
        if not math.isfinite(value):
            raise RewardFunctionError(
                f"reward function '{name}': reward {i} is {value} (return None for 'not applicable', never NaN/inf); "
                f"completion: {_describe(inputs, i)}"
            )
        out.append(value)
    return out


def _raise_from_call(name: str, exc: BaseException, inputs: dict):
    raise RewardFunctionError(
        f"reward function '{name}' raised {type(exc).__name__}: {exc}; first completion of the call: "
        f"{_describe(inputs, 0) if inputs['completions'] else '(none)'}"
    ) from exc


def _run_coroutines(coroutines):
    """Run coroutines together (``asyncio.gather``); in a thread of its own when an event loop already runs here
    (a notebook), since ``asyncio.run`` refuses to nest."""
    async def gather():
        return await asyncio.gather(*coroutines, return_exceptions=True)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("value", asyncio.run(gather())))
    thread.start()
    thread.join()
    return result["value"]


def call_reward_funcs(funcs: dict, inputs: dict) -> dict[int, list[float]]:
    """Call reward functions in this process, as TRL does: the synchronous ones one after the other, then every
    ``async def`` one together. Returns ``{index: rewards}`` (validated by :func:`check_rewards`).

    Args:
        funcs: ``{index: (name, function)}``.
        inputs: the keywords of the contract (``prompts``, ``completions``, ``completion_ids``, the columns,
            ``trainer_state``, ``log_extra``, ``log_metric``).

    Raises:
        RewardFunctionError: a function raised (its exception is chained) or broke the contract.
    """
    results, pending = {}, []
    for index, (name, func) in funcs.items():
        if is_async_reward_func(func):
            pending.append((index, name, func))
            continue
        try:
            values = func(**inputs)
        except Exception as exc:  # noqa: BLE001 - user code: report it with its inputs
            _raise_from_call(name, exc, inputs)
        results[index] = check_rewards(name, values, inputs)
    if pending:
        outputs = _run_coroutines([func(**inputs) for _, _, func in pending])
        for (index, name, _), values in zip(pending, outputs):
            if isinstance(values, BaseException):
                _raise_from_call(name, values, inputs)
            results[index] = check_rewards(name, values, inputs)
    return results
