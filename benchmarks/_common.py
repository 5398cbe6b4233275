"""Shared plumbing of the benchmark scripts: environment, machine description, alternating timed runs, peak RSS,
child processes, the study scaffold (command line, fresh work folder, seeds x variants, the RL trainer from an SFT
model, quiet timed training with a held-out curve, logged series, a shipped recipe trained quietly), tables, figures
and JSON results (written to benchmarks/results/, which git ignores).

Not a test module and not part of the package: the scripts import it as a sibling (`from _common import ...`).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"


def setup_env(threads: int = 1) -> None:
    """Offline, quiet, repository on sys.path; torch limited to `threads` intra-op threads (set before use)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("WANDB_MODE", "disabled")
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import warnings

    import torch
    import transformers

    torch.set_num_threads(threads)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")


# ---------------------------------------------------------------- machine and load


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (`uptime`), to read the timings against."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_info() -> dict:
    """What ran the benchmark: CPU, cores, memory, versions, commit, time and load."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    versions = {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - a missing optional package is just not listed
            pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                check=False).stdout.strip()
    except OSError:
        commit = None
    return {
        "cpu": cpu, "cpus": os.cpu_count(), "memory_gib": mem_gib, "python": platform.python_version(),
        "versions": versions, "commit": commit, "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "load_average": load_average(),
    }


# ---------------------------------------------------------------- garbage collector


def gc_collect_seconds() -> float:
    """Time of one full `gc.collect()` in this process now (it grows with the number of live Python objects)."""
    import gc

    t = time.perf_counter()
    gc.collect()
    return time.perf_counter() - t


def freeze_gc() -> dict:
    """Move every object alive now (the ~500k objects of torch/transformers/TRL imports) to the collector's permanent
    generation, so the `gc.collect()` that TRL's PPO loop runs twice per update scans only what training creates.
    Changes no number. Returns one collection's time before and after, in seconds."""
    import gc

    before = gc_collect_seconds()
    gc.freeze()
    return {"gc_collect_s_before_freeze": before, "gc_collect_s_after_freeze": gc_collect_seconds()}


class GcTimer:
    """Within `with GcTimer() as t:`, every `gc.collect()` call (TRL's and trl_ext's PPO call it twice per update) is
    timed; `t.seconds` is the total, `t.calls` the count."""

    def __enter__(self):
        import gc

        self.seconds, self.calls, self._orig = 0.0, 0, gc.collect

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return self._orig(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t
                self.calls += 1

        gc.collect = timed
        return self

    def __exit__(self, *exc):
        import gc

        gc.collect = self._orig


# ---------------------------------------------------------------- timing


def alternate(runs: dict, repeats: int) -> dict[str, list]:
    """Call each of `runs` (name -> zero-argument callable returning a measurement) `repeats` times, rotating the
    order every repeat (A B C, B C A, C A B, ...), so that slow drifts of the machine's load hit every variant
    alike. Returns name -> list of measurements, index = repeat."""
    names = list(runs)
    out = {name: [] for name in names}
    for rep in range(repeats):
        k = rep % len(names)
        for name in names[k:] + names[:k]:
            out[name].append(runs[name]())
    return out


def ratios(numerators: list[float], denominators: list[float]) -> list[float]:
    """Per-repeat ratios (the runs of one repeat ran back to back, under about the same load)."""
    return [n / d for n, d in zip(numerators, denominators)]


def median(values: list[float]) -> float:
    return statistics.median(values)


# ---------------------------------------------------------------- studies


def fresh_workdir(path, create: bool = False) -> Path:
    """A study's work folder, emptied: what an earlier run left there is removed first; created when `create`."""
    import shutil

    work = Path(path)
    if work.exists():
        shutil.rmtree(work)
    if create:
        work.mkdir(parents=True)
    return work


def study_cells(seeds, variants: dict, only=None):
    """(seed, name, overrides) of every run of a study, seeds outermost (a cut-short study still has every variant);
    names not in `only` are left out (`only` None: all)."""
    for seed in seeds:
        for name, overrides in variants.items():
            if only is not None and name not in only:
                continue
            yield seed, name, overrides


def study_parser(doc: str, name: str, *, updates: tuple[int, int], seeds: int = 3, what: str = "variant",
                 updates_flag: str = "--updates", unit: str = "RL"):
    """The command line every seeds x variants study (benchmarks/<name>.py) shares, its sizes read back by
    :func:`study_size`: `--quick`, the updates per run (option `updates_flag`, attribute ``updates``; `updates`: the
    full and the quick study's), `--seeds` (per `what`: `seeds`, quick 1), `--only` (names of `what`s),
    `--workdir` (benchmarks/results/<name>_runs) and `--out` (benchmarks/results/<name>.json). The script adds its
    own options to the returned ``argparse.ArgumentParser``."""
    import argparse

    full, quick = updates
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"{quick} updates, one seed")
    p.add_argument(updates_flag, dest="updates", type=int, default=None,
                   help=f"{unit} updates per run (default {full}, quick {quick})")
    p.add_argument("--seeds", type=int, default=None, help=f"training seeds per {what} (default {seeds}, quick 1)")
    p.add_argument("--only", nargs="*", default=None, help=f"run only these {what}s (names as in the table)")
    p.add_argument("--workdir", default=str(RESULTS / f"{name}_runs"), help="where the runs are written")
    p.add_argument("--out", default=None, help=f"result JSON (default benchmarks/results/{name}.json)")
    return p


def study_work(a, train_sft) -> tuple[Path, float]:
    """(work folder, seconds of SFT) of a task study: the finished run's folder ``a.sft_dir`` as it is (0 s), else
    ``a.workdir`` emptied and ``train_sft(work)`` run in it (it returns its seconds)."""
    if a.sft_dir:
        return Path(a.sft_dir), 0.0
    work = fresh_workdir(a.workdir, create=True)
    return work, train_sft(work)


def key_values(pairs) -> dict:
    """``--set KEY=VALUE ...`` as a dict, each value read as YAML (``3`` an int, ``true`` a bool, ``1.0e-4`` a
    float; YAML reads ``1e-4`` as text)."""
    import yaml

    return {kv.split("=", 1)[0]: yaml.safe_load(kv.split("=", 1)[1]) for kv in pairs}


def study_size(a, updates: tuple[int, int], seeds: int = 3) -> tuple[int, list[int]]:
    """(updates per run, training seeds) of a study whose command line :func:`study_parser` read: those given, else
    the full study's (`updates[0]`, `seeds` seeds) or with `--quick` the quick one's (`updates[1]`, one seed)."""
    full, quick = updates
    return a.updates or (quick if a.quick else full), list(range(a.seeds or (1 if a.quick else seeds)))


def quiet_timed(fn, log_path):
    """Call `fn()` with its console output in `log_path` and every object alive before it frozen out of the garbage
    collector (TRL's PPO loop calls gc.collect() twice per update: scan only what training creates). Returns
    (fn's result, seconds). Objects a caller froze before stay frozen (``gc.unfreeze`` thaws every frozen object)."""
    import gc
    from contextlib import redirect_stderr, redirect_stdout

    frozen_before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    with open(log_path, "w") as log, redirect_stdout(log), redirect_stderr(log):
        result = fn()
    seconds = time.perf_counter() - start
    if not frozen_before:
        gc.unfreeze()
    return result, seconds


class HeldOutCurve:
    """A TrainerCallback: held-out accuracy of the verifiable task (recipes/verifiable/evaluate.py, on sys.path)
    appended to ``curve`` every ``every`` updates and after the last."""

    def __init__(self, trainer, tokenizer, rows, curve, every, last):
        self.trainer, self.tokenizer, self.rows, self.curve, self.every, self.last = (trainer, tokenizer, rows, curve,
                                                                                      every, last)

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == self.last:
            import torch
            from evaluate import accuracy

            # evaluate.py seeds torch for its sampled answers: without the fork every training seed would continue
            # from that one RNG state after the first evaluation
            with torch.random.fork_rng():
                self.curve.append({"update": state.global_step,
                                   **accuracy(self.trainer.model.policy, self.tokenizer, self.rows)})


def train_with_curve(trainer, tokenizer, heldout, start: dict, updates: int, log_path, evals: int = 4,
                     callbacks=()) -> tuple[float, list[dict]]:
    """Train `trainer` (quietly, timed, see :func:`quiet_timed`) while measuring held-out accuracy every
    `updates // evals` updates and at the end (`start`: the accuracy before training, update 0); `callbacks` are
    added after the curve's. Returns (seconds, curve)."""
    from evaluate import accuracy

    curve = [{"update": 0, **start}]
    trainer.add_callback(HeldOutCurve(trainer, tokenizer, heldout, curve, max(1, updates // evals), updates))
    for callback in callbacks:
        trainer.add_callback(callback)
    _, seconds = quiet_timed(trainer.train, log_path)
    if curve[-1]["update"] != trainer.state.global_step:  # stopped early (a budget) or off the evaluation grid
        curve.append({"update": trainer.state.global_step, **accuracy(trainer.model.policy, tokenizer, heldout)})
    return seconds, curve


def train_recipe(recipe, log_path, **keys) -> float:
    """Train the shipped recipe ``recipe`` (a YAML path) in this process with ``keys`` as its command-line overrides
    (``--key value``; a None value is left out) and ``--disable_tqdm true``, its console output in ``log_path``
    (the task studies' SFT warm starts). Returns the seconds the training took."""
    from contextlib import redirect_stderr, redirect_stdout

    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    argv = [token for key, value in keys.items() if value is not None for token in (f"--{key}", str(value))]
    resolved = resolve_recipe(recipe, [*argv, "--disable_tqdm", "true"])
    start = time.perf_counter()
    with open(log_path, "w") as log, redirect_stdout(log), redirect_stderr(log):
        run(resolved)
    return time.perf_counter() - start


def rl_trainer_from_sft(sft_dir, out, *, updates: int, seed: int, settings: dict, dataset, value_model: bool,
                        value_dir=None, **trainer_kwargs):
    """The RL trainer of a task study (benchmarks/verifiable.py, tool_use.py): a ``trl_ext.PPOTrainer`` from the SFT
    model in ``sft_dir``. Its tokenizer pads on the left; the policy is loaded after ``transformers.set_seed(seed)``, the
    reference is a copy of it, the value model (``value_model``: GAE) comes from the same checkpoint with a fresh
    scalar head (or from ``value_dir``, a pretrained one), and there is no reward model. ``settings``: PPOConfig
    keywords, ``updates`` x ``per_device_train_batch_size`` episodes, logged every update, nothing saved. ``dataset(tokenizer)``: the train
    dataset. ``trainer_kwargs``: the rewards and tools (``reward_funcs``, ``tools``, ``environment_factory``)."""
    import copy

    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, set_seed

    import trl_ext

    tokenizer = AutoTokenizer.from_pretrained(sft_dir, padding_side="left")
    set_seed(seed)  # Python's random (environments draw from it), numpy (the PPO epochs' order) and torch, as trl-ext train
    policy = AutoModelForCausalLM.from_pretrained(sft_dir)
    value = (AutoModelForSequenceClassification.from_pretrained(value_dir or sft_dir, num_labels=1) if value_model
             else None)
    args = trl_ext.PPOConfig(output_dir=str(out), total_episodes=updates * settings["per_device_train_batch_size"],
                             seed=seed, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
                             num_sample_generations=0, disable_tqdm=True, **settings)
    return trl_ext.PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=copy.deepcopy(policy),
                              reward_model=None, train_dataset=dataset(tokenizer), value_model=value, **trainer_kwargs)


def logged(trainer, key: str) -> list[float]:
    """The values the trainer logged under ``key``, one per logging step that has it."""
    return [h[key] for h in trainer.state.log_history if key in h]


def seconds_per_update(logged: dict) -> float:
    """Mean wall time of a PPO update from the trainer's logged `time/rollout` + `time/scoring` +
    `time/optimization` (series as `gold_reward.log_series` returns them), the first update (warm-up) left out; NaN
    for a run of one update (a run that a budget of generated responses stops early can have one)."""
    phases = ("time/rollout", "time/scoring", "time/optimization")
    per_update = [sum(logged[k]["value"][i] for k in phases) for i in range(1, len(logged["time/rollout"]["value"]))]
    return sum(per_update) / len(per_update) if per_update else float("nan")


# ---------------------------------------------------------------- memory


def rss_mb() -> float:
    """Current resident set size of this process (MiB)."""
    return _status_kb("VmRSS") / 1024


def rss_parts_mb() -> dict:
    """Current RSS split into anonymous memory (heap, tensors) and file-backed pages (mapped libraries and
    checkpoints: transformers maps safetensors files, and fp32 weights may stay backed by them), MiB."""
    return {"anon": _status_kb("RssAnon") / 1024, "file": _status_kb("RssFile") / 1024}


class AnonPeakSampler:
    """Peak anonymous RSS (heap and tensors, not mapped files) while the `with` block runs, sampled from
    /proc/self/status every `interval` seconds by a background thread (the kernel keeps no peak of it; spikes
    shorter than the interval can be missed). `peak_mb` after the block."""

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self.peak_mb = 0.0

    def __enter__(self):
        import threading

        self._stop = threading.Event()
        self.peak_mb = rss_parts_mb()["anon"]

        def sample():
            while not self._stop.is_set():
                self.peak_mb = max(self.peak_mb, rss_parts_mb()["anon"])
                self._stop.wait(self.interval)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, rss_parts_mb()["anon"])


def peak_rss_mb() -> float:
    """Peak resident set size (VmHWM) of this process since it started or since :func:`reset_peak_rss` (MiB)."""
    return _status_kb("VmHWM") / 1024


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS to its current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs).

    `resource.getrusage().ru_maxrss` can only grow, so without this a peak measured after setup would include the
    setup's own peak. Returns False where the kernel refuses (then the peak counts from process start)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def trim_heap() -> None:
    """Hand the C heap's free memory back to the OS (glibc `malloc_trim(0)`), so that RSS measures live memory rather
    than what earlier, freed allocations (e.g. a checkpoint read while loading) left behind. No-op elsewhere."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def run_child(script: Path, args: list[str], timeout: float = 900, env: dict | None = None,
              stderr_log: Path | None = None) -> dict:
    """Run `python script *args` in a fresh process (own, clean peak RSS); its last stdout line is a JSON dict.
    `env` adds environment variables (e.g. a fixed glibc mmap threshold). `stderr_log`: the child's stderr is
    appended to that file as it is written (what a child killed by a time limit did last stays readable)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}  # `env` may replace PYTHONPATH too
    with open(stderr_log, "a") if stderr_log else contextlib.nullcontext(subprocess.PIPE) as err:
        if stderr_log:
            err.write(f"--- {script.name} {' '.join(args)}\n")
            err.flush()
        proc = subprocess.run([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=err, text=True,
                              env=env, timeout=timeout, check=False)
    stderr = Path(stderr_log).read_text() if stderr_log else proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child {script.name} {' '.join(args)} failed (rc {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{stderr[-4000:]}")
    return json.loads(lines[-1])


def child_result(result: dict) -> None:
    """Print a child's result as the last stdout line (read by :func:`run_child`)."""
    print(json.dumps(result), flush=True)


# ---------------------------------------------------------------- output


#: Two-sided 95 % quantiles of Student's t for 1-30 degrees of freedom (beyond: the normal's 1.96).
T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def paired_interval(differences: list[float]) -> dict:
    """Mean of paired differences with its 95 % t interval (none for one pair) and how many are below zero."""
    n, mean = len(differences), statistics.fmean(differences)
    t = T975[n - 2] if 2 <= n <= len(T975) + 1 else 1.96
    half = t * statistics.stdev(differences) / n ** 0.5 if n > 1 else float("nan")
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half,
            "below_zero": sum(d < 0 for d in differences)}


def seed_spread(values) -> str:
    """A study table's cell for one variant's per-seed results: ``"mean ± sd (a / b / c)"``, three decimals (sd 0
    for a single seed)."""
    values = list(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.3f} ± {sd:.3f} ({' / '.join(f'{v:.3f}' for v in values)})"


def print_table(headers: list[str], rows: list[list]) -> None:
    """A GitHub-markdown table on stdout (paste-able into the benchmark README)."""

    def fmt(value):
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
        return str(value)

    cells = [[fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


def pyplot_into(folder: Path, what: str = "figure"):
    """matplotlib's pyplot (Agg backend) with `folder` created, or None after saying so where matplotlib is not
    installed (it is an optional extra)."""
    try:
        import matplotlib
    except ImportError:
        print(f'matplotlib is not installed (pip install "trl-ext[plot]"): no {what}')
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    return plt


def save_figure(fig, path: Path, dpi: int, announce: bool = True) -> None:
    """Lay out, write and close `fig`; print its path when `announce`."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    if announce:
        print(f"figure: {path}")


def write_result(name: str, settings: dict, results, out: str | None = None, **extra) -> Path:
    """Write `{"meta": machine + argv + settings, "results": ...}` to benchmarks/results/<name>.json (or `out`)."""
    path = Path(out) if out else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {"script": f"benchmarks/{name}.py", "argv": sys.argv[1:], "settings": settings, **machine_info()}
    path.write_text(json.dumps({"meta": meta, "results": results, **extra}, indent=2, default=str))
    print(f"load average (1/5/15 min) at the end: {meta['load_average']}; wrote {path}")
    return path
