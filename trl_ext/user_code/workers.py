"""Worker processes for the user's functions (reward functions, tools), with a per-call timeout: a call that runs
past ``timeout_s``, raises, or kills its worker comes back as a :class:`CallResult` with status ``"timeout"`` or
``"error"``, and the pool replaces the worker. How the workers are started, isolated and stopped:
docs/reward-workers.md, "What a worker is"."""

from __future__ import annotations

import asyncio
import collections
import inspect
import multiprocessing
import multiprocessing.util
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from dataclasses import dataclass, field
from typing import Any
from multiprocessing.connection import wait as wait_ready

# Keys the worker supplies itself; a caller that passes the trainer's own recorders has them dropped (they would
# pickle the trainer).
RECORDER_KEYS = ("log_extra", "log_metric")
# A worker that dies before it has run a single call this many times in a row means workers cannot start (e.g. a
# function that cannot be unpickled under spawn): the pool stops replacing them and fails its calls instead.
MAX_START_FAILURES = 3
# The main thread waits for a call (or the pool's start) in slices this long, so that a Ctrl-C the kernel handed to
# another thread raises its KeyboardInterrupt within one slice (see _wait).
INTERRUPT_CHECK_S = 0.1


@dataclass
class CallResult:
    """The outcome of one call.

    ``status`` is ``"ok"``, ``"timeout"`` or ``"error"``. ``value`` is what the function returned (not validated),
    for ``"ok"`` only. ``message``: for an error the exception type, message and traceback text (or how the worker
    died); for a timeout ``"timed out after X s"``. ``extras`` holds ``{column: [values]}`` from ``log_extra`` calls
    and ``metrics`` ``{name: [floats]}`` from ``log_metric`` calls in the worker (empty when the worker was killed).
    ``seconds``: the call's wall time in the worker (for a timeout, the time until it was killed).
    """

    status: str
    value: Any
    message: str | None
    extras: dict = field(default_factory=dict)
    metrics: dict = field(default_factory=dict)
    seconds: float = 0.0


class PendingCall:
    """A submitted call. :meth:`result` blocks until it finished, failed or timed out (or the pool closed)."""

    __slots__ = ("func_index", "_event", "_result")

    def __init__(self, func_index: int):
        self.func_index = func_index
        self._event = threading.Event()
        self._result: CallResult | None = None

    def done(self) -> bool:
        """Whether :meth:`result` would return without waiting."""
        return self._event.is_set()

    def result(self) -> CallResult:
        _wait(self._event)
        return self._result

    def _resolve(self, result: CallResult) -> None:
        if not self._event.is_set():
            self._result = result
            self._event.set()


def _wait(event: threading.Event) -> None:
    """``event.wait()`` that Ctrl-C interrupts. Python runs signal handlers in the main thread, but the kernel may
    hand SIGINT to any thread that does not block it; a main thread blocked on a lock then waits on, its
    KeyboardInterrupt pending, until the lock is released. Waking every INTERRUPT_CHECK_S lets the handler run."""
    if threading.current_thread() is threading.main_thread():
        while not event.wait(INTERRUPT_CHECK_S):
            pass
    else:
        event.wait()


def _block_sigint(start_method: str) -> None:
    """Block SIGINT in the calling thread (the pool's dispatcher, before it starts a worker): Ctrl-C goes to another
    thread, and the worker starts with SIGINT blocked, so that a Ctrl-C during its start stays pending until
    _prepare_worker_process has made the worker ignore it (which discards it)."""
    if not hasattr(signal, "pthread_sigmask"):
        return
    if start_method != "fork":  # the first spawn launches multiprocessing's resource tracker, which then unblocks
        from multiprocessing import resource_tracker  # SIGINT in the launching thread (CPython 3.11): launch it first

        resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


# --------------------------------------------------------------------------------------------------------------
# The worker process


def _set_parent_death_signal() -> None:
    """Linux: SIGKILL this process when the thread that forked it ends (the pool's dispatcher thread forks them all)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - a safety net only; the parent-pid check still applies
        pass


def _prepare_worker_process(parent_pid: int, inherited: list) -> None:
    # SIGINT is blocked from the fork (or exec) until here, so no Ctrl-C has reached Python code yet: ignore it
    # (which also drops one pending), leave the terminal's process group, and only then unblock it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.setpgid(0, 0)  # own process group: a kill on timeout also reaches the verifier's subprocesses
    except OSError:
        pass
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # the verifier's subprocesses get the usual mask
    for conn in inherited:  # the parent's ends of the other workers' pipes, inherited through fork
        try:
            conn.close()
        except OSError:
            pass
    _set_parent_death_signal()
    if os.getppid() != parent_pid:
        os._exit(0)
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


async def _await(awaitable):
    return await awaitable


def _run_call(func, kwargs: dict) -> bytes:
    """Run one call and return its pickled reply: (status, value, message, extras, metrics, seconds)."""
    extras: dict = {}
    metrics: dict = {}

    def log_extra(column: str, values: list) -> None:
        extras.setdefault(column, []).extend(values)

    def log_metric(name: str, value: float) -> None:
        metrics.setdefault(name, []).append(float(value))

    start = time.perf_counter()
    try:
        out = func(**kwargs, log_extra=log_extra, log_metric=log_metric)
        if inspect.isawaitable(out):
            out = asyncio.run(_await(out))
        reply = ("ok", out, None, extras, metrics, time.perf_counter() - start)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and KeyboardInterrupt in a verifier are its errors too
        text = "".join(traceback.format_exception(exc))
        reply = ("error", None, f"{type(exc).__name__}: {exc}\n{text}", extras, metrics, time.perf_counter() - start)
    try:
        return pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001
        message = f"the function's result could not be pickled: {type(exc).__name__}: {exc}"
        return pickle.dumps(("error", None, message, {}, {}, reply[5]), protocol=pickle.HIGHEST_PROTOCOL)


def _worker_main(conn, funcs, parent_pid: int, inherited: list) -> None:
    _prepare_worker_process(parent_pid, inherited)
    if isinstance(funcs, bytes):  # spawn: unpickled after the environment above is set
        funcs = pickle.loads(funcs)
    conn.send_bytes(b"")  # ready: the parent hands out calls (and starts their clocks) only from here on
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent_pid:
                return
            continue
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        func_index, kwargs = pickle.loads(data)
        conn.send_bytes(_run_call(funcs[func_index], kwargs))


# --------------------------------------------------------------------------------------------------------------
# The parent side


class _Worker:
    __slots__ = ("call", "conn", "deadline", "process", "ran_a_call", "ready", "started")

    def __init__(self, process, conn):
        self.process = process
        self.conn = conn
        self.ready = False  # until the worker says so (after its start-up: imports under spawn)
        self.call: PendingCall | None = None
        self.deadline: float | None = None
        self.started = 0.0
        self.ran_a_call = False


def _kill(process) -> None:
    if process.exitcode is None:  # not yet reaped: its pid (and process group) cannot have been reused
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (OSError, AttributeError):
            pass
        try:
            process.kill()
        except (OSError, AttributeError):
            pass


def _how_it_died(process) -> str:
    process.join(timeout=5)
    code = process.exitcode
    if code is None:
        return "the worker process closed its pipe"
    if code < 0:
        try:
            return f"the worker process was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the worker process was killed by signal {-code}"
    return f"the worker process exited with code {code}"


class _PoolCore:
    """Everything the dispatcher thread and :meth:`FunctionPool.close` share (kept apart from the pool object so
    that the thread does not keep the pool alive, and garbage collection can close it)."""

    def __init__(self, ctx, funcs, funcs_payload, num_workers: int, timeout_s: float | None):
        self.ctx = ctx
        self.owner_pid = os.getpid()
        self.funcs = funcs  # fork: inherited by the children as they are
        self.funcs_payload = funcs_payload  # spawn: pickled by reference
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        # Held while a worker is forked and entered in self.workers, and while close() marks the pool closed: no
        # worker starts after close() has marked it, so close() kills every worker there is. Reentrant: garbage
        # collection may close the pool in the dispatcher thread itself.
        self.start_lock = threading.RLock()
        self.queue: collections.deque = collections.deque()
        self.closed = False  # no more calls, no more workers
        self.stopped = False  # closed, and the workers killed
        self.broken: str | None = None
        self.wake_pending = False
        self.start_failures = 0
        self.wake_r, self.wake_w = ctx.Pipe(duplex=False)
        self.workers: list[_Worker] = []
        # The dispatcher thread forks every worker (the first ones too), so that the workers' parent-death signal
        # fires when the pool's thread ends (close, or the process dying), not when whichever thread built the pool
        # exits.
        self.started = threading.Event()
        self.start_error: BaseException | None = None
        self.num_workers = num_workers
        self.thread = threading.Thread(target=self.dispatch_forever, name="FunctionPool", daemon=True)
        # Closed at interpreter exit before multiprocessing joins its children (it would wait forever on workers),
        # also when a Ctrl-C lands before the FunctionPool owning this core exists.
        self.exit_hook = multiprocessing.util.Finalize(None, self.close, exitpriority=100)
        try:
            self.thread.start()
            _wait(self.started)
        except BaseException:  # Ctrl-C while the workers start: none may outlive it
            self.close()
            raise
        if self.start_error is not None:
            self.close()
            raise self.start_error

    # -- workers
    def start_worker(self) -> _Worker:
        parent_conn, child_conn = self.ctx.Pipe(duplex=True)
        if self.funcs_payload is None:
            inherited = [w.conn for w in self.workers] + [self.wake_r, self.wake_w, parent_conn]
            funcs = self.funcs
        else:
            inherited, funcs = [], self.funcs_payload
        process = self.ctx.Process(
            target=_worker_main, args=(child_conn, funcs, os.getpid(), inherited), name="function-worker", daemon=False
        )
        _block_sigint(self.ctx.get_start_method())
        process.start()
        child_conn.close()
        return _Worker(process, parent_conn)

    def add_worker(self, index: int | None = None) -> bool:
        """Start a worker in self.workers[index] (in place of a retired one) or at the end; False if the pool is
        closed (then nothing starts)."""
        with self.start_lock:
            if self.closed:
                return False
            worker = self.start_worker()
            if index is None:
                self.workers.append(worker)
            else:
                self.workers[index] = worker
            return True

    def retire(self, worker: _Worker) -> None:
        """Kill a worker (if still alive), reap it, and put a fresh one in its place unless the pool is closing."""
        _kill(worker.process)
        worker.process.join(timeout=5)
        worker.conn.close()
        if worker.ran_a_call or worker.call is not None:
            self.start_failures = 0
        else:
            self.start_failures += 1
        index = self.workers.index(worker)
        if self.closed or self.start_failures >= MAX_START_FAILURES:
            self.workers.pop(index)
            if not self.closed and self.broken is None:
                self.fail_everything(f"worker processes keep dying before their first call "
                                     f"({MAX_START_FAILURES} in a row; the last: {_how_it_died(worker.process)})")
            return
        if not self.add_worker(index):
            self.workers.pop(index)

    def fail_everything(self, reason: str) -> None:
        with self.lock:
            self.broken = reason
            queued = [call for call, _ in self.queue]
            self.queue.clear()
        for call in queued:
            call._resolve(CallResult("error", None, reason))

    # -- submission
    def submit(self, call: PendingCall, payload: bytes) -> None:
        with self.lock:
            if self.closed:
                raise RuntimeError("FunctionPool.submit: the pool is closed")
            if self.broken is not None:
                call._resolve(CallResult("error", None, self.broken))
                return
            self.queue.append((call, payload))
            wake = not self.wake_pending
            self.wake_pending = True
        if wake:
            self.wake()

    def wake(self) -> None:
        try:
            self.wake_w.send_bytes(b"")
        except OSError:
            pass

    # -- the dispatcher thread
    def dispatch_forever(self) -> None:
        try:
            for _ in range(self.num_workers):
                if not self.add_worker():
                    break
        except BaseException as exc:  # noqa: BLE001 - handed to the constructor
            self.start_error = exc
            return
        finally:
            self.started.set()
        try:
            while not self.closed:
                self.dispatch_once()
        except BaseException as exc:  # noqa: BLE001 - a bug here must not leave result() waiting forever
            if not self.closed:
                reason = f"the worker pool's dispatcher failed: {type(exc).__name__}: {exc}"
                self.fail_everything(reason)
                for worker in self.workers:
                    if worker.call is not None:
                        worker.call._resolve(CallResult("error", None, reason))

    def hand_out(self) -> None:
        for worker in self.workers:
            if worker.call is not None or not worker.ready:
                continue
            with self.lock:
                if not self.queue or self.closed:
                    return
                call, payload = self.queue.popleft()
            worker.call = call
            worker.started = time.monotonic()
            worker.deadline = None if self.timeout_s is None else worker.started + self.timeout_s
            try:
                worker.conn.send_bytes(payload)
            except OSError:  # died while idle: the call goes back to the front, the worker is replaced
                worker.call = None
                with self.lock:
                    self.queue.appendleft((call, payload))
                self.retire(worker)
                return

    def dispatch_once(self) -> None:
        self.hand_out()
        busy = [w for w in self.workers if w.call is not None or not w.ready]
        deadlines = [w.deadline for w in busy if w.deadline is not None]
        wait_s = None if not deadlines else max(0.0, min(deadlines) - time.monotonic())
        objects = [self.wake_r] + [w.conn for w in busy] + [w.process.sentinel for w in self.workers]
        ready = set(wait_ready(objects, wait_s))
        if self.closed:
            return
        if self.wake_r in ready:
            while self.wake_r.poll():
                self.wake_r.recv_bytes()
            with self.lock:
                self.wake_pending = False
        for worker in list(self.workers):
            if not worker.ready and worker.conn in ready:
                self.hear_ready(worker)
            elif worker.call is not None and (worker.conn in ready or worker.process.sentinel in ready):
                self.collect(worker)
            elif worker.process.sentinel in ready:  # died while idle (or after its reply was read)
                self.retire(worker)
        now = time.monotonic()
        for worker in list(self.workers):
            if worker.call is not None and worker.deadline is not None and now >= worker.deadline:
                call, elapsed = worker.call, now - worker.started
                self.retire(worker)
                call._resolve(CallResult("timeout", None, f"timed out after {self.timeout_s:g} s", seconds=elapsed))

    def hear_ready(self, worker: _Worker) -> None:
        try:
            worker.conn.recv_bytes()
        except (EOFError, OSError):  # died while starting
            self.retire(worker)
            return
        worker.ready = True

    def collect(self, worker: _Worker) -> None:
        call = worker.call
        try:
            if not worker.conn.poll(0):  # the process ended and nothing came (a grandchild may hold the pipe open)
                raise EOFError
            data = worker.conn.recv_bytes()
        except (EOFError, OSError):
            elapsed = time.monotonic() - worker.started
            message = f"{_how_it_died(worker.process)} during the call"
            self.retire(worker)
            call._resolve(CallResult("error", None, message, seconds=elapsed))
            return
        worker.call, worker.deadline, worker.ran_a_call = None, None, True
        self.start_failures = 0
        call._resolve(CallResult(*pickle.loads(data)))

    # -- shutdown
    def close(self) -> None:
        if os.getpid() != self.owner_pid:  # a forked copy of the parent exiting: the workers are not its own
            return
        with self.start_lock, self.lock:
            if self.stopped:
                return
            self.closed = True  # a close cut short by a Ctrl-C is redone by the next (the exit hook's at the latest)
        for worker in list(self.workers):
            _kill(worker.process)
        self.wake()
        if threading.current_thread() is not self.thread and self.thread.ident is not None:  # started
            self.thread.join(timeout=10)
        for worker in list(self.workers):
            _kill(worker.process)
            worker.process.join(timeout=5)
            worker.conn.close()
            if worker.call is not None:
                worker.call._resolve(CallResult("error", None, "the worker pool was closed during the call"))
        with self.lock:
            queued = [call for call, _ in self.queue]
            self.queue.clear()
        for call in queued:
            call._resolve(CallResult("error", None, "the worker pool was closed before the call started"))
        self.wake_r.close()
        self.wake_w.close()
        self.stopped = True
        self.exit_hook.cancel()


class FunctionPool:
    """``num_workers`` processes that run calls of ``funcs`` (reward functions, tools; sync or ``async def``), each
    bounded by ``timeout_s`` seconds (None: no limit). See the module docstring for how calls run and fail.

    ``start_method`` (keyword only, default: ``"fork"`` where available, else ``"spawn"``) picks how workers start;
    under ``"spawn"`` the functions must pickle by reference (importable module-level functions).

    Use as a context manager, or call :meth:`close`; a pool that is garbage collected or still open at interpreter
    exit is closed then.
    """

    def __init__(self, funcs: list, num_workers: int, timeout_s: float | None = None, *,
                 start_method: str | None = None):
        funcs = list(funcs)
        if not funcs or not all(callable(f) for f in funcs):
            raise TypeError(f"FunctionPool: funcs must be a non-empty list of callables, got {funcs!r}")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"FunctionPool: num_workers must be an integer >= 1, got {num_workers!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"FunctionPool: timeout_s must be > 0 or None, got {timeout_s!r}")
        if start_method is None:
            start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        ctx = multiprocessing.get_context(start_method)
        payload = None
        if start_method != "fork":
            try:
                payload = pickle.dumps(funcs, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise TypeError(
                    f"FunctionPool: with the {start_method!r} start method the functions are pickled by "
                    f"reference and must be importable module-level functions; this one is not: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        self.num_funcs = len(funcs)
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self.start_method = start_method
        self._core = _PoolCore(ctx, funcs, payload, num_workers, timeout_s)
        self._finalizer = weakref.finalize(self, self._core.close)  # also runs at interpreter exit

    def submit(self, func_index: int, kwargs: dict) -> PendingCall:
        """Queue ``funcs[func_index](**kwargs)`` and return at once. ``kwargs`` must pickle; ``log_extra`` and
        ``log_metric`` in it are dropped (the worker supplies its own)."""
        if not 0 <= func_index < self.num_funcs:
            raise IndexError(f"FunctionPool.submit: func_index {func_index} not in [0, {self.num_funcs})")
        kwargs = {key: value for key, value in kwargs.items() if key not in RECORDER_KEYS}
        payload = pickle.dumps((func_index, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        call = PendingCall(func_index)
        self._core.submit(call, payload)
        return call

    @property
    def closed(self) -> bool:
        return self._core.closed

    def close(self) -> None:
        """Kill the workers. Calls still queued or running resolve with status ``"error"``. Idempotent."""
        self._finalizer()

    def __enter__(self) -> FunctionPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
