"""A program that a Ctrl-C interrupts at a named point of a FunctionPool's start or call
(tests/user_code/test_worker_interrupts.py runs it): `CTRL_C_POINT=... CTRL_C_PID_FILE=... python ctrl_c_program.py
START_METHOD`.

The Ctrl-C is what a terminal sends: SIGINT to the program's process group (the test starts the program in a session
of its own). The point is reached by code patched into the pool, not by timing. The pool's thread appends the pid of
each worker it started to CTRL_C_PID_FILE. The patches run at import, so that a spawned worker (which imports this
file, with the environment) has them too.
"""

import os
import signal
import sys
import threading
import time

from trl_ext.user_code import workers

POINT = os.environ["CTRL_C_POINT"]
PROGRAM_GROUP = int(os.environ.setdefault("CTRL_C_GROUP", str(os.getpgid(0))))  # the program's, also in a worker


def ctrl_c() -> None:
    os.killpg(PROGRAM_GROUP, signal.SIGINT)


def call_that_hangs(**kwargs):
    if POINT == "during_a_call":
        ctrl_c()  # from the worker, which is in a group of its own by now: only the parent receives it
    time.sleep(60)
    return [0.0]


_start_worker, _hear_ready, _hand_out, _prepare = (workers._PoolCore.start_worker, workers._PoolCore.hear_ready,
                                                   workers._PoolCore.hand_out, workers._prepare_worker_process)
_call_handed_out = threading.Event()


def start_worker(core):
    started = len(core.workers)  # the workers forked so far (the first start fills the list)
    if (POINT, started) in (("before_the_first_worker", 0), ("between_two_workers", 1)):
        ctrl_c()
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
    if POINT == "in_a_worker_before_it_ignores_sigint":  # still in the program's group: the Ctrl-C reaches it too
        ctrl_c()
    _prepare(parent_pid, inherited)


def just_forked():
    if POINT == "in_a_worker_just_forked":  # the first Python code a forked worker runs
        ctrl_c()


def ctrl_c_taken_by_another_thread():
    """A Ctrl-C that the kernel hands to a thread other than the main one, while the main thread waits for a call."""
    _call_handed_out.wait()
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # Python's handler then runs in the main thread


workers._PoolCore.start_worker = start_worker
workers._PoolCore.hear_ready = hear_ready
workers._PoolCore.hand_out = hand_out
workers._prepare_worker_process = prepare_worker_process
os.register_at_fork(after_in_child=just_forked)

if __name__ == "__main__":
    # A program run from a terminal: Python raises KeyboardInterrupt on SIGINT, which it would not do where the test
    # runs as a background job (started by a shell with `&`, which then ignores SIGINT, as does this program).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if POINT == "during_a_call_taken_by_another_thread":
        threading.Thread(target=ctrl_c_taken_by_another_thread, daemon=True).start()
    pool = workers.FunctionPool([call_that_hangs], num_workers=2, start_method=sys.argv[1])
    if POINT == "after_the_pool_started":
        ctrl_c()
    pool.submit(0, {}).result()
    print("the call came back: no Ctrl-C")
