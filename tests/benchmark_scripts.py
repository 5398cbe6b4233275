"""Import a benchmarks/ script the way it runs as a command, and leave the test process as it was afterwards.

The scripts put benchmarks/ (and recipe folders such as recipes/gold) on ``sys.path`` and import their siblings and
the recipes' modules by plain names (``_common``, ``make_data``, ``evaluate``; the gold and verifiable tasks both
have a ``make_data``), and ``setup_env`` lowers the transformers verbosity, silences warnings and sets torch's thread
count, all process-wide. :func:`loaded_script` imports a script with every such module fresh and puts back
``sys.path``, ``sys.modules``, the warning filters, the verbosity and the thread count when it ends.

While a script runs, the objects alive before it are frozen out of the garbage collector (as the scripts' own
``quiet_timed`` and ``freeze_gc`` do around their runs, and tests/recipes/test_gold_pipeline.py): TRL's PPO loop
calls ``gc.collect()`` twice per update, and in a test process each call would otherwise scan every object pytest,
torch and transformers hold (most of a tiny update's time)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import json
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _script_modules() -> dict:
    """The loaded modules of benchmarks/ and recipes/."""
    folders = (str(BENCH), str(ROOT / "recipes"))
    return {name: m for name, m in list(sys.modules.items()) if str(getattr(m, "__file__", "")).startswith(folders)}


@contextlib.contextmanager
def loaded_script(name: str):
    """``benchmarks/<name>.py`` imported as a module (its imports of benchmarks/ and recipe modules fresh)."""
    import torch
    import transformers

    saved_path, saved_modules = list(sys.path), _script_modules()
    saved_filters, verbosity = list(warnings.filters), transformers.logging.get_verbosity()
    threads, frozen = torch.get_num_threads(), gc.get_freeze_count()
    for module in saved_modules:
        del sys.modules[module]
    sys.path.insert(0, str(BENCH))
    gc.collect()
    gc.freeze()
    try:
        yield importlib.import_module(name)
    finally:
        sys.path[:] = saved_path
        for module in _script_modules():
            del sys.modules[module]
        sys.modules.update(saved_modules)
        warnings.filters[:] = saved_filters
        transformers.logging.set_verbosity(verbosity)
        torch.set_num_threads(threads)
        if not frozen:  # also what ppo_overhead and ppo_scaling froze after their setup (_common.freeze_gc)
            gc.unfreeze()


def in_process_children(script):
    """A stand-in for ``_common.run_child`` that runs the child's code (``script.main(args)``: its ``--child`` path)
    in this process and reads its result line as run_child does (a fresh interpreter per child only adds its
    imports, several seconds each). What a child measures of the process (peak RSS) is then this process's."""
    calls = []

    def run_child(path, args, **kwargs):
        assert Path(path).resolve() == Path(script.__file__).resolve()
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            script.main(list(args))
        calls.append(list(args))
        return json.loads([line for line in out.getvalue().splitlines() if line.startswith("{")][-1])

    run_child.calls = calls
    return run_child


def study_fixtures(name: str):
    """Module fixtures ``(bench, sft_work)`` of a quiz study's tests: ``benchmarks/<name>.py`` loaded, and its data
    (8 training quizzes) with its SFT recipe for 2 steps in a folder (the study's ``--sft-dir``)."""
    import pytest

    @pytest.fixture(scope="module")
    def bench():
        with loaded_script(name) as script:
            yield script

    @pytest.fixture(scope="module")
    def sft_work(bench, tmp_path_factory):
        folder = tmp_path_factory.mktemp(name)
        bench.setup_env(threads=1)
        bench.sft(folder, train=8, max_steps=2)
        return folder

    return bench, sft_work


def run_study(bench, sft_dir: Path, out: Path, *argv) -> dict:
    """``main(--sft-dir sft_dir --out out *argv)`` of a study script, which must succeed; its result file."""
    assert bench.main(["--sft-dir", str(sft_dir), "--out", str(out), *argv]) == 0
    return json.loads(out.read_text())
