"""FunctionPool: results, async functions, timeouts, errors, crashes, recorders, concurrency, close (Ctrl-C:
test_worker_interrupts.py).

Every test is bounded: a call that would hang has a timeout, and the tests never assert on timing.
"""

import asyncio
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trl_ext.user_code.workers import CallResult, FunctionPool


# Reward functions (module level, so that the spawn test can pickle them by reference)
def lengths(prompts, completions, completion_ids, scale, **kwargs):
    return [len(c) * s for c, s in zip(completions, scale)]


async def async_lengths(prompts, completions, **kwargs):
    await asyncio.sleep(0.01)
    return [float(len(c)) for c in completions]


def worker_pid(**kwargs):
    return [os.getpid()]


def sleep_then_answer(completions, **kwargs):
    time.sleep(float(completions[0]))
    return [1.0]


def _cannot_rebuild():
    with open(os.environ["TRL_EXT_TEST_STARTS"], "a") as starts:  # one line per worker that tried
        starts.write("start\n")
    raise RuntimeError("this reward cannot be rebuilt in a worker")


class DiesInTheWorker:
    """A reward that pickles but whose copy cannot be rebuilt: a spawned worker dies while starting."""

    def __call__(self, **kwargs):
        return [0.0]

    def __reduce__(self):
        return _cannot_rebuild, ()


def exits_cleanly(**kwargs):
    os._exit(0)


def raises(completions, **kwargs):
    raise ValueError(f"cannot check {completions[0]!r}")


def exits(**kwargs):
    os._exit(3)


def segfaults(**kwargs):
    import ctypes
    import faulthandler

    faulthandler.disable()  # pytest's, inherited through fork: keeps its dump out of the test output
    ctypes.string_at(0)


def records(completions, log_extra, log_metric, **kwargs):
    log_extra("verdict", ["pass" if c == "4" else "fail" for c in completions])
    log_metric("checker/calls", 1)
    log_metric("checker/calls", 2.5)
    return [1.0 if c == "4" else 0.0 for c in completions]


def returns_generator(**kwargs):
    return (x for x in [1.0])


def torch_matmul(**kwargs):
    import torch

    a = torch.ones(500, 500)
    return [float((a @ a)[0, 0]), torch.get_num_threads(), os.environ["CUDA_VISIBLE_DEVICES"],
            os.environ["OMP_NUM_THREADS"]]


def starts_subprocess(completions, **kwargs):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    Path(completions[0]).write_text(str(child.pid))
    child.wait()
    return [0.0]


def _gone(pid: int) -> bool:
    """The process has exited (reaped, or a zombie whose parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if _gone(pid):
            return True
        time.sleep(0.02)
    return _gone(pid)


@pytest.fixture(scope="module")
def pool():
    """Two forked workers over every function above, 2 s per call (the tests' calls take milliseconds)."""
    with FunctionPool([lengths, async_lengths, worker_pid, raises, exits, segfaults, records,
                           returns_generator], num_workers=2, timeout_s=2.0) as p:
        yield p


def test_results_right_and_collected_in_any_order(pool):
    calls = [pool.submit(0, {"prompts": ["q"] * 2, "completions": ["ab" * i, "c"], "completion_ids": [[1], [2]],
                             "scale": [1, i], "trainer_state": {"global_step": i}}) for i in range(40)]
    results = {i: calls[i].result() for i in reversed(range(40))}  # collected last-first
    for i in range(40):
        assert results[i].status == "ok", results[i].message
        assert results[i].value == [2 * i, i]
        assert results[i].message is None


def test_async_function(pool):
    result = pool.submit(1, {"prompts": ["q", "q"], "completions": ["abc", "de"]}).result()
    assert (result.status, result.value) == ("ok", [3.0, 2.0])


def test_exception_is_an_error_with_its_traceback(pool):
    result = pool.submit(3, {"completions": ["x = 1"]}).result()
    assert result.status == "error" and result.value is None
    assert result.message.startswith("ValueError: cannot check 'x = 1'\n")
    assert "Traceback (most recent call last)" in result.message and "in raises" in result.message
    assert pool.submit(1, {"prompts": ["q"], "completions": ["abcd"]}).result().value == [4.0]


def test_worker_that_exits_or_segfaults_is_an_error_and_replaced(pool):
    before = {pool.submit(2, {}).result().value[0] for _ in range(8)}
    exited, crashed = pool.submit(4, {}).result(), pool.submit(5, {}).result()
    assert (exited.status, exited.message) == ("error", "the worker process exited with code 3 during the call")
    assert (crashed.status, crashed.message) == ("error", "the worker process was killed by SIGSEGV during the call")
    after = [pool.submit(2, {}).result() for _ in range(8)]
    assert all(r.status == "ok" for r in after)
    assert len(pool._core.workers) == 2 and not {r.value[0] for r in after} & before  # both workers replaced


def test_log_extra_and_log_metric_come_back(pool):
    recorders = {"log_extra": print, "log_metric": print}  # the trainer's own: dropped, not pickled
    result = pool.submit(6, {"completions": ["4", "5"], **recorders}).result()
    assert (result.status, result.value) == ("ok", [1.0, 0.0])
    assert result.extras == {"verdict": ["pass", "fail"]}
    assert result.metrics == {"checker/calls": [1.0, 2.5]}


def test_unpicklable_input_raises_at_submit_and_unpicklable_output_is_an_error(pool):
    with pytest.raises(Exception, match="pickle"):
        pool.submit(0, {"completions": [lambda: 1]})
    result = pool.submit(7, {}).result()
    assert result.status == "error" and "could not be pickled" in result.message
    with pytest.raises(IndexError):
        pool.submit(8, {})


def test_timeout_kills_the_call_and_its_subprocesses_and_the_pool_goes_on(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    with FunctionPool([sleep_then_answer, worker_pid, starts_subprocess], num_workers=1, timeout_s=1.0) as pool:
        first_pid = pool.submit(1, {}).result().value[0]
        hung = pool.submit(0, {"completions": ["30"]})
        queued = pool.submit(0, {"completions": ["0.01"]})  # waits behind the hung call, then runs in the new worker
        result = hung.result()
        assert result.status == "timeout" and result.value is None
        assert result.message == "timed out after 1 s" and result.seconds >= 1.0
        assert (queued.result().status, queued.result().value) == ("ok", [1.0])
        assert pool.submit(1, {}).result().value[0] != first_pid and _wait_gone(first_pid)

        result = pool.submit(2, {"completions": [str(pid_file)]}).result()  # a verifier's own subprocess
        assert result.status == "timeout"
        assert _wait_gone(int(pid_file.read_text()))  # killed with the worker's process group
        assert pool.submit(0, {"completions": ["0"]}).result().status == "ok"


def test_a_timeout_fires_before_a_call_three_times_as_long_could_finish():
    """Calls that sleep 3 s, then would answer [1.0], against a 1 s timeout must come back as "timeout": a deadline
    firing 3x late or later would let them finish "ok". That bounds how late a timeout fires without timing anything.
    The second call runs in the worker that replaced the killed one; a call within the timeout is not cut."""
    with FunctionPool([sleep_then_answer], num_workers=1, timeout_s=1.0) as pool:
        hung = [pool.submit(0, {"completions": ["3"]}).result() for _ in range(2)]
        quick = pool.submit(0, {"completions": ["0.2"]}).result()
    assert [(r.status, r.value) for r in hung] == [("timeout", None)] * 2
    assert (quick.status, quick.value) == ("ok", [1.0])


def test_two_calls_run_at_once_on_two_workers():
    """A barrier of 2 lets a call through only when the other one is inside it too (no timing involved)."""
    barrier = multiprocessing.get_context("fork").Barrier(2, timeout=10)

    def meet(**kwargs):
        return [barrier.wait()]  # the index it got: 0 and 1

    with FunctionPool([meet], num_workers=2, timeout_s=20) as pool:
        calls = [pool.submit(0, {}) for _ in range(2)]
        results = [call.result() for call in calls]
    assert [r.status for r in results] == ["ok", "ok"], [r.message for r in results]
    assert sorted(r.value[0] for r in results) == [0, 1]


def test_closures_work_and_torch_in_a_forked_worker_does_not_hang():
    """The parent ran torch on 2 threads before the pool forked: the worker's torch op runs (on one thread; the
    timeout would turn a hang into a failed assert), and a closure reaches the worker as it is."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        float((torch.ones(500, 500) @ torch.ones(500, 500)).sum())
        offset = 0.5
        with FunctionPool([torch_matmul, lambda **kw: [offset]], num_workers=1, timeout_s=10) as pool:
            result, closure = pool.submit(0, {}).result(), pool.submit(1, {}).result()
    finally:
        torch.set_num_threads(threads)
    assert (result.status, result.value) == ("ok", [500.0, 1, "", "1"]), result.message  # one thread, no GPU
    assert closure.value == [0.5]


def test_close_resolves_every_pending_call_and_refuses_new_ones():
    pool = FunctionPool([sleep_then_answer], num_workers=1)
    running = pool.submit(0, {"completions": ["30"]})
    queued = [pool.submit(0, {"completions": ["0"]}) for _ in range(3)]
    time.sleep(0.1)  # lets the first call reach the worker (either way, every call must resolve)
    worker = pool._core.workers[0].process.pid
    pool.close()
    assert running.result().status == "error" and "closed" in running.result().message
    assert all(call.result().status == "error" for call in queued)
    assert _wait_gone(worker)
    with pytest.raises(RuntimeError, match="closed"):
        pool.submit(0, {"completions": ["0"]})
    pool.close()  # idempotent


def test_spawn_start_method_pickles_functions_by_reference():
    with pytest.raises(TypeError, match="importable module-level"):
        FunctionPool([lambda **kw: [0]], num_workers=1, start_method="spawn")
    with FunctionPool([lengths], num_workers=1, timeout_s=30, start_method="spawn") as pool:
        result = pool.submit(0, {"prompts": ["q"], "completions": ["abc"], "completion_ids": [[1]], "scale": [2]})
        assert (result.result().status, result.result().value) == ("ok", [6])


def test_workers_that_die_before_their_first_call_break_the_pool_in_one_line(tmp_path, monkeypatch):
    """Workers that die while starting are started 3 times in all, then the calls fail with the reason (a worker
    that ran a call and died is replaced for good: test_worker_that_exits_or_segfaults...)."""
    monkeypatch.setenv("TRL_EXT_TEST_STARTS", str(tmp_path / "starts"))
    with FunctionPool([DiesInTheWorker()], num_workers=1, timeout_s=30, start_method="spawn") as pool:
        result = pool.submit(0, {}).result()
    assert result.status == "error" and result.message.startswith(
        "worker processes keep dying before their first call (3 in a row; the last: the worker process "
        ), result.message  # exited, or killed by the pool first: a race
    assert (tmp_path / "starts").read_text() == "start\n" * 3


def test_a_worker_exiting_with_code_0_during_a_call_is_an_error():
    with FunctionPool([exits_cleanly, worker_pid], num_workers=1, timeout_s=30) as pool:
        result = pool.submit(0, {}).result()
        assert (result.status, result.message) == ("error", "the worker process exited with code 0 during the call")
        assert pool.submit(1, {}).result().status == "ok"


def test_a_dispatcher_failure_resolves_the_running_call_with_its_reason(monkeypatch):
    """The safety net of a bug in the dispatcher thread (here: reading a reply fails): the call being run comes back
    as an error naming the failure instead of leaving result() waiting forever."""
    from trl_ext.user_code import workers as pool_module

    def broken_collect(self, worker):
        raise RuntimeError("boom")

    monkeypatch.setattr(pool_module._PoolCore, "collect", broken_collect)
    with FunctionPool([sleep_then_answer], num_workers=1, timeout_s=30) as pool:
        result = pool.submit(0, {"completions": ["0.1"]}).result()
    assert (result.status, result.message) == ("error", "the worker pool's dispatcher failed: RuntimeError: boom")


def test_bad_arguments():
    with pytest.raises(TypeError):
        FunctionPool([], num_workers=1)
    with pytest.raises(ValueError, match="num_workers"):
        FunctionPool([worker_pid], num_workers=0)
    with pytest.raises(ValueError, match="timeout_s"):
        FunctionPool([worker_pid], num_workers=1, timeout_s=0)
    assert CallResult("ok", [1.0], None).extras == {}


def test_a_pool_nobody_closed_is_closed_when_garbage_collected():
    import gc

    pool = FunctionPool([worker_pid], num_workers=1)
    pid = pool.submit(0, {}).result().value[0]
    del pool
    gc.collect()
    assert _wait_gone(pid)


def test_a_forked_copy_of_the_parent_does_not_close_the_parents_workers():
    with FunctionPool([worker_pid], num_workers=1) as pool:
        pid = pool.submit(0, {}).result().value[0]
        child = os.fork()
        if child == 0:  # what an exiting fork of the trainer does at interpreter exit (the finalizer runs there too)
            pool.close()
            os._exit(0)
        os.waitpid(child, 0)
        assert pool.submit(0, {}).result().value == [pid]
