"""A program that a Ctrl-C interrupts at a named point of a FunctionPool's start or call
(tests/user_code/test_worker_interrupts.py runs it): `CTRL_C_POINT=... CTRL_C_PID_FILE=... CTRL_C_LOG=... python
ctrl_c_program.py START_METHOD`.

The Ctrl-C is what a terminal sends: SIGINT to the program's process group (the test starts the program in a session
of its own). The point is reached by code patched into the pool, not by timing; where a worker sends it, the first one
only. The pool's thread appends the pid of each worker it started to CTRL_C_PID_FILE. Python's SIGINT handler is
replaced by one that writes "program" or "worker" to CTRL_C_LOG, then raises KeyboardInterrupt as Python's does.
The patches and the handler are set at import, so that a forked worker inherits them and a spawned worker (which
imports this file, with the environment) sets them too.

`again_while_closing` sends a second Ctrl-C from the pool's close() (after the first, during a call), with the
workers' parent-death signal off, as on a platform without one: no worker may outlive the program all the same.
"""

import os
import signal
import sys
import threading
import time

from trl_ext.user_code import workers

POINT = os.environ["CTRL_C_POINT"]
PROGRAM_GROUP = int(os.environ.setdefault("CTRL_C_GROUP", str(os.getpgid(0))))  # the program's, also in a worker
PROGRAM_PID = int(os.environ.setdefault("CTRL_C_PROGRAM", str(os.getpid())))


def on_sigint(signum, frame):
    with open(os.environ["CTRL_C_LOG"], "a") as log:
        log.write("program\n" if os.getpid() == PROGRAM_PID else "worker\n")
    raise KeyboardInterrupt


def ctrl_c() -> None:
    os.killpg(PROGRAM_GROUP, signal.SIGINT)


def ctrl_c_in_a_starting_worker() -> None:
    """The Ctrl-C as it reaches a worker still in the program's group: to the worker first (raise_signal runs its
    handler before it returns, unless SIGINT is blocked), then to the group, so that the worker's handler has written
    to the log before the program can kill it."""
    try:
        signal.raise_signal(signal.SIGINT)
    finally:
        ctrl_c()


def first_worker() -> bool:
    return os.environ.get("CTRL_C_WORKER") == "1"  # set by the parent before each start


def call_that_hangs(**kwargs):
    if POINT in ("during_a_call", "again_while_closing"):  # the program makes one call
        ctrl_c()  # from the worker, which is in a group of its own by now: only the parent receives it
    time.sleep(60)
    return [0.0]


_start_worker, _hear_ready, _hand_out, _prepare, _kill = (
    workers._PoolCore.start_worker, workers._PoolCore.hear_ready, workers._PoolCore.hand_out,
    workers._prepare_worker_process, workers._kill)
_call_handed_out = threading.Event()
_kills = []


def start_worker(core):
    started = len(core.workers)  # the workers forked so far (the first start fills the list)
    if (POINT, started) in (("before_the_first_worker", 0), ("between_two_workers", 1)):
        ctrl_c()
    os.environ["CTRL_C_WORKER"] = str(started + 1)
    worker = _start_worker(core)
    with open(os.environ["CTRL_C_PID_FILE"], "a") as pids:
        pids.write(f"{worker.process.pid}\n")
    return worker


def hear_ready(core, worker):
    _hear_ready(core, worker)
    if POINT == "when_a_worker_is_ready":
        ctrl_c()


def hand_out(core):
    _hand_out(core)
    if any(w.call is not None for w in core.workers):
        _call_handed_out.set()


def prepare_worker_process(parent_pid, inherited):
    if POINT == "in_a_worker_before_it_ignores_sigint" and first_worker():
        ctrl_c_in_a_starting_worker()
    _prepare(parent_pid, inherited)


def just_forked():
    if POINT == "in_a_worker_just_forked" and first_worker():  # the first Python code a forked worker runs
        ctrl_c_in_a_starting_worker()


def kill(process):
    if POINT == "again_while_closing" and not _kills:  # the first kill comes from close()
        _kills.append(process)
        ctrl_c()
    _kill(process)


def ctrl_c_taken_by_another_thread():
    """A Ctrl-C that the kernel hands to a thread other than the main one, while the main thread waits for a call."""
    _call_handed_out.wait()
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # Python's handler then runs in the main thread


workers._PoolCore.start_worker = start_worker
workers._PoolCore.hear_ready = hear_ready
workers._PoolCore.hand_out = hand_out
workers._prepare_worker_process = prepare_worker_process
workers._kill = kill
if POINT == "again_while_closing":
    workers._set_parent_death_signal = lambda: None
os.register_at_fork(after_in_child=just_forked)
# Also where the test runs as a background job (a shell's `&` starts it with SIGINT ignored, and Python then installs
# no KeyboardInterrupt handler): the program is one run from a terminal.
signal.signal(signal.SIGINT, on_sigint)

if __name__ == "__main__":
    if POINT == "during_a_call_taken_by_another_thread":
        threading.Thread(target=ctrl_c_taken_by_another_thread, daemon=True).start()
    pool = workers.FunctionPool([call_that_hangs], num_workers=2, start_method=sys.argv[1])
    if POINT == "after_the_pool_started":
        ctrl_c()
    pool.submit(0, {}).result()
    print("the call came back: no Ctrl-C")
