"""Running the tool calls of a batch of episodes, with TRL GRPOTrainer's error semantics and a time limit. How it
works: docs/ppo-internals.md#running-tool-calls."""

from __future__ import annotations

import asyncio
import inspect
import threading
from dataclasses import dataclass

__all__ = ["ToolCallCounts", "ToolExecutor"]


@dataclass
class ToolCallCounts:
    """Calls, failures (errors and timeouts) and timeouts of one batch of episodes on this process."""

    calls: int = 0
    failures: int = 0
    timeouts: int = 0


class _DropRecorders:
    """A tool as the worker pool calls it: the pool passes ``log_extra``/``log_metric`` (reward functions' recorders),
    a tool takes only its own arguments."""

    def __init__(self, tool):
        self.tool = tool

    def __call__(self, log_extra=None, log_metric=None, **arguments):
        return self.tool(**arguments)


class _TimedOut(Exception):
    pass


def _call_in_thread(tool, arguments: dict, timeout_s: float):
    """``tool(**arguments)`` in a daemon thread, joined for ``timeout_s`` (raises what the tool raised, or
    :class:`_TimedOut`)."""
    box: dict = {}

    def run():
        try:
            if inspect.iscoroutinefunction(tool):
                box["value"] = asyncio.run(asyncio.wait_for(tool(**arguments), timeout_s))
            else:
                box["value"] = tool(**arguments)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name=f"tool-{getattr(tool, '__name__', 'call')}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive() or isinstance(box.get("error"), asyncio.TimeoutError):
        raise _TimedOut
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _call_directly(tool, arguments: dict):
    if inspect.iscoroutinefunction(tool):
        return asyncio.run(tool(**arguments))
    return tool(**arguments)


class ToolExecutor:
    """Runs tool calls (module docstring). ``standalone_tools``: the trainer's ``tools`` (the ones the worker pool
    may run); ``timeout_s``: the limit per call (None: none, TRL's behaviour); ``num_workers``: the pool's size."""

    def __init__(self, standalone_tools: list, timeout_s: float | None, num_workers: int = 0):
        self.timeout_s = timeout_s
        self.pool_index = {}
        self.pool = None
        if num_workers > 0 and standalone_tools:
            from ...user_code.workers import FunctionPool

            self.pool = FunctionPool([_DropRecorders(t) for t in standalone_tools], num_workers, timeout_s)
            self.pool_index = {id(t): i for i, t in enumerate(standalone_tools)}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def run(self, calls: dict[int, list[dict]], tool_dicts: dict[int, dict], counts: ToolCallCounts,
            on_timeout=None) -> dict[int, list[dict]]:
        """The tool messages (``{"role": "tool", "name", "content"}``) answering each row's ``tool_calls``, in order.
        ``tool_dicts[row]``: that row's tools by name; ``on_timeout(row)``: called when a call of the row timed out
        in a thread."""
        results: dict[int, list] = {}
        pending = []
        for row, tool_calls in calls.items():
            results[row] = []
            for tool_call in tool_calls:
                counts.calls += 1
                if tool_call.get("type") != "function":
                    counts.failures += 1
                    results[row].append((tool_call.get("name", "unknown"),
                                         {"error": f"Unsupported tool call type: {tool_call.get('type')}"}))
                    continue
                name, arguments = tool_call["function"]["name"], tool_call["function"].get("arguments") or {}
                tool = tool_dicts[row].get(name)
                slot = len(results[row])
                results[row].append(None)
                if tool is not None and self.pool is not None and id(tool) in self.pool_index:
                    pending.append((row, slot, name, self.pool.submit(self.pool_index[id(tool)], dict(arguments))))
                    continue
                results[row][slot] = (name, self._run_here(row, name, tool, arguments, counts, on_timeout))
        for row, slot, name, call in pending:
            results[row][slot] = (name, self._from_pool(name, call.result(), counts))
        return {row: [{"role": "tool", "name": name,
                       "content": value if isinstance(value, list) else str(value)} for name, value in items]
                for row, items in results.items()}

    def _run_here(self, row, name, tool, arguments, counts: ToolCallCounts, on_timeout):
        try:
            if tool is None:
                raise ValueError(f"Tool {name} not found.")
            if not isinstance(arguments, dict):
                raise TypeError(f"arguments of {name} must be a mapping, got {arguments!r}")
            if self.timeout_s is None:
                return _call_directly(tool, arguments)
            return _call_in_thread(tool, arguments, self.timeout_s)
        except _TimedOut:
            counts.failures += 1
            counts.timeouts += 1
            if on_timeout is not None:
                on_timeout(row)
            return {"error": f"Tool {name} timed out after {self.timeout_s:g} s"}
        except Exception as exc:  # noqa: BLE001 - TRL: the error text goes to the model
            counts.failures += 1
            return {"error": str(exc)}

    def _from_pool(self, name, result, counts: ToolCallCounts):
        if result.status == "ok":
            return result.value
        counts.failures += 1
        if result.status == "timeout":
            counts.timeouts += 1
            return {"error": f"Tool {name} timed out after {self.timeout_s:g} s"}
        first_line = (result.message or "").split("\n", 1)[0]
        return {"error": first_line.split(": ", 1)[1] if ": " in first_line else first_line}
