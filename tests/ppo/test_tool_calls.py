"""Running tool calls (trl_ext/ppo/episodes/tool_calls.py): TRL's result and error texts, the time limit in a thread
and in the worker pool, and the counts behind tools/failure_frequency and tools/timeout_frequency."""

import asyncio
import os
import time

from trl_ext.ppo.episodes.tool_calls import ToolCallCounts, ToolExecutor


def add(a: int, b: int) -> int:
    return a + b


def boom(x: int) -> int:
    raise ValueError(f"bad x: {x}")


def pid() -> int:
    return os.getpid()


def sleepy(seconds: float) -> str:
    time.sleep(seconds)
    return "woke"


async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


TOOLS = {f.__name__: f for f in (add, boom, sleepy, async_add, pid)}


def test_results_and_errors_as_trl_gives_them_to_the_model():
    executor, counts = ToolExecutor(list(TOOLS.values()), timeout_s=None), ToolCallCounts()
    assert executor.pool is None  # in the training process by default
    out = executor.run({0: [call("add", a=2, b=3), call("boom", x=7)], 3: [call("nope"), {"type": "code"}],
                        5: [call("async_add", a=1, b=1), call("pid")]}, {0: TOOLS, 3: TOOLS, 5: TOOLS}, counts)
    assert out[0] == [{"role": "tool", "name": "add", "content": "5"},
                      {"role": "tool", "name": "boom", "content": "{'error': 'bad x: 7'}"}]
    assert out[3] == [{"role": "tool", "name": "nope", "content": "{'error': 'Tool nope not found.'}"},
                      {"role": "tool", "name": "unknown", "content": "{'error': 'Unsupported tool call type: code'}"}]
    assert out[5] == [{"role": "tool", "name": "async_add", "content": "2"},
                      {"role": "tool", "name": "pid", "content": str(os.getpid())}]
    assert (counts.calls, counts.failures, counts.timeouts) == (6, 3, 0)


def test_a_hung_call_in_a_thread_comes_back_as_a_timeout_and_the_row_is_reported():
    executor, counts, timed_out = ToolExecutor([], timeout_s=0.2), ToolCallCounts(), []
    out = executor.run({4: [call("sleepy", seconds=3.0), call("add", a=1, b=2)]}, {4: TOOLS}, counts,
                       on_timeout=timed_out.append)
    assert out[4][0]["content"] == "{'error': 'Tool sleepy timed out after 0.2 s'}"
    assert out[4][1]["content"] == "3"  # the next call of the same turn still runs
    assert (counts.calls, counts.failures, counts.timeouts) == (2, 1, 1)
    assert timed_out == [4]


def test_in_worker_processes_a_hung_call_is_killed_and_errors_keep_trls_text():
    executor, counts = ToolExecutor([add, boom, sleepy, pid], timeout_s=0.5, num_workers=1), ToolCallCounts()
    pool = executor.pool
    try:
        out = executor.run({0: [call("sleepy", seconds=30.0)], 1: [call("boom", x=1), call("add", a=20, b=22)],
                            2: [call("pid"), call("async_add", a=1, b=2)]}, {0: TOOLS, 1: TOOLS, 2: TOOLS}, counts)
    finally:
        executor.close()
    assert pool.closed and executor.pool is None
    assert out[0][0]["content"] == "{'error': 'Tool sleepy timed out after 0.5 s'}"
    assert [m["content"] for m in out[1]] == ["{'error': 'bad x: 1'}", "42"]
    assert out[2][0]["content"] != str(os.getpid())  # ran in a worker process
    assert out[2][1]["content"] == "3"  # not one of the executor's standalone tools: in the training process
    assert (counts.calls, counts.failures, counts.timeouts) == (5, 2, 1)
