"""Ctrl-C and FunctionPool: a program interrupted at any point of its pool's start, or during a call, ends on its
KeyboardInterrupt, no worker handles the Ctrl-C, and no worker is left behind.

Each point is reached by code patched into the pool (tests/user_code/ctrl_c_program.py), not by a delay, so each test
checks the same moment on an idle and on a loaded machine. Who handled a Ctrl-C is written by the program's SIGINT
handler (workers inherit it, or set it at import under spawn). What is left behind is looked up in /proc: every
process whose environment carries the test's token (the program's workers and anything they started).
"""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# (point, start method, workers started by the time of the Ctrl-C at least, Ctrl-Cs sent)
POINTS = [
    ("before_the_first_worker", "fork", 0, 1),
    ("in_a_worker_just_forked", "fork", 1, 1),
    ("in_a_worker_before_it_ignores_sigint", "fork", 1, 1),
    ("between_two_workers", "fork", 1, 1),
    ("after_the_pool_started", "fork", 2, 1),
    ("when_a_worker_is_ready", "fork", 1, 1),
    ("during_a_call", "fork", 2, 1),
    ("during_a_call_taken_by_another_thread", "fork", 2, 1),
    ("again_while_closing", "fork", 2, 2),
    ("in_a_worker_before_it_ignores_sigint", "spawn", 1, 1),
    ("during_a_call", "spawn", 2, 1),
]


def _carrying(token: bytes) -> list[int]:
    """Live processes whose environment holds `token` (a zombie's environment reads empty: it is gone)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if token in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:  # exited meanwhile, or not ours
                pass
    return pids


def _left_behind(token: bytes, seconds: float = 10.0) -> list[int]:
    """The processes carrying `token` once they had `seconds` to die (a worker whose parent is gone gets SIGKILL)."""
    end = time.monotonic() + seconds
    while (left := _carrying(token)) and time.monotonic() < end:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("point, start_method, at_least, ctrl_cs", POINTS, ids=[f"{p}-{m}" for p, m, _, _ in POINTS])
def test_ctrl_c_ends_the_program_and_leaves_no_worker(tmp_path, point, start_method, at_least, ctrl_cs):
    mark = uuid.uuid4().hex
    token = f"TRL_EXT_CTRL_C_TEST={mark}".encode()
    pid_file, log = tmp_path / "workers", tmp_path / "handled"
    pid_file.touch()
    log.touch()
    env = {**os.environ, "TRL_EXT_CTRL_C_TEST": mark, "CTRL_C_POINT": point, "CTRL_C_PID_FILE": str(pid_file),
           "CTRL_C_LOG": str(log), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    try:
        # A session of its own: the program's Ctrl-C (SIGINT to its process group) reaches nothing else. The timeout
        # only bounds a hang; the program ends as soon as its pool is closed.
        proc = subprocess.run([sys.executable, str(HERE / "ctrl_c_program.py"), start_method], capture_output=True,
                              text=True, env=env, timeout=60, check=False, start_new_session=True)
        left = _left_behind(token)
    finally:
        for pid in _carrying(token):  # a failed run's workers: not left to the next tests
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stdout, proc.stderr)
    assert log.read_text().split() == ["program"] * ctrl_cs, proc.stderr  # no worker handled a Ctrl-C
    assert len(pid_file.read_text().split()) >= at_least
    assert left == []
