"""A slow verifier in process vs in `FunctionPool` workers.

The verifier takes 20 ms per completion, over 256 completions. In process it gets one call on the whole list, as
TRL's GRPOTrainer calls a reward function; in the pool it gets one call per completion, on 8 and on 2 workers.
Two kinds of 20 ms: `sleep` (waiting: a sandbox, a subprocess, a server) and `cpu` (a busy loop in Python: a math
checker). Waiting parallelises beyond the machine's cores; computing cannot. Variants alternate within each repeat
(see benchmarks/README.md); the speed-up is the median of the per-repeat ratios. Also: the pool's per-call overhead
(calls per second of a function that returns at once, one call per completion: pickling, the pipe, the
worker's wake-up) and its start-up time.

    python benchmarks/slow_verifier.py            # 256 completions, 3 repeats: about 1-2 min on 2 busy cores
    python benchmarks/slow_verifier.py --quick    # 64 completions, 2 repeats, sleep only: about 10 s

Prints tables and writes benchmarks/results/slow_verifier.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import alternate, load_average, print_table, ratios, setup_env, write_result  # noqa: E402

PER_COMPLETION_S = 0.020


def sleep_verifier(prompts, completions, **kwargs):
    out = []
    for completion in completions:
        time.sleep(PER_COMPLETION_S)
        out.append(float(len(completion) % 2))
    return out


def cpu_verifier(prompts, completions, **kwargs):
    out = []
    for completion in completions:
        end = time.perf_counter() + PER_COMPLETION_S
        while time.perf_counter() < end:
            pass
        out.append(float(len(completion) % 2))
    return out


def trivial(prompts, completions, **kwargs):
    return [0.0] * len(completions)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--completions", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, nargs="+", default=[8, 2])
    p.add_argument("--kinds", nargs="+", default=["sleep", "cpu"], choices=["sleep", "cpu"])
    p.add_argument("--overhead-calls", type=int, default=2000)
    p.add_argument("--quick", action="store_true", help="64 completions, 2 repeats, sleep only, 500 overhead calls")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.completions, args.repeats, args.kinds, args.overhead_calls = 64, 2, ["sleep"], 500

    setup_env(threads=1)  # a trainer's process: torch and transformers loaded before the pool forks
    from trl_ext.user_code.workers import FunctionPool

    n = args.completions
    prompts = [f"prompt {i}: " for i in range(n)]
    completions = [f"answer {'x' * (i % 7)}" for i in range(n)]
    expected = [float(len(c) % 2) for c in completions]
    funcs = {"sleep": sleep_verifier, "cpu": cpu_verifier}
    order = list(funcs)

    pools, startup = {}, {}
    for workers in args.workers:
        t = time.perf_counter()
        pool = FunctionPool([funcs[k] for k in order] + [trivial], num_workers=workers)
        [call.result() for call in [pool.submit(len(order), {"prompts": ["p"], "completions": ["c"]})
                                    for _ in range(workers)]]
        startup[workers] = time.perf_counter() - t
        pools[workers] = pool

    def in_process(kind):
        def run():
            t = time.perf_counter()
            out = funcs[kind](prompts=prompts, completions=completions)
            seconds = time.perf_counter() - t
            assert out == expected
            return seconds
        return run

    def in_pool(kind, workers):
        def run():
            pool = pools[workers]
            t = time.perf_counter()
            calls = [pool.submit(order.index(kind), {"prompts": [p], "completions": [c], "completion_ids": [[1, 2]],
                                                     "trainer_state": {"global_step": 1}})
                     for p, c in zip(prompts, completions)]
            results = [call.result() for call in calls]
            seconds = time.perf_counter() - t
            assert all(r.status == "ok" for r in results), [r.message for r in results if r.status != "ok"][:1]
            assert [r.value[0] for r in results] == expected
            return seconds
        return run

    rows, results = [], {}
    for kind in args.kinds:
        runs = {"in process (1 call)": in_process(kind)}
        for workers in args.workers:
            runs[f"pool, {workers} workers ({n} calls)"] = in_pool(kind, workers)
        times = alternate(runs, args.repeats)
        base = times["in process (1 call)"]
        for name, secs in times.items():
            speedups = ratios(base, secs)
            workers = None if name.startswith("in process") else int(name.split()[1])
            ideal = "" if workers is None else f"{workers if kind == 'sleep' else min(workers, os.cpu_count())}x"
            rows.append([kind, name, statistics.median(secs), statistics.median(speedups),
                         f"{min(speedups):.2f}-{max(speedups):.2f}", ideal])
            results[f"{kind}/{name}"] = {"seconds": secs, "speedup": speedups}
        print(f"[{kind}] done, load {load_average()}", flush=True)

    print(f"\n{n} completions, {PER_COMPLETION_S * 1e3:.0f} ms each ({n * PER_COMPLETION_S:.2f} s of work), "
          f"{args.repeats} repeats, load (1/5/15 min) {load_average()}")
    print_table(["verifier", "how", "s (median)", "speed-up (median)", "per repeat", "ideal"], rows)

    overhead_rows = []
    for workers, pool in pools.items():
        rates = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            calls = [pool.submit(len(order), {"prompts": ["p"], "completions": ["c"], "completion_ids": [[1, 2]],
                                              "trainer_state": {"global_step": 1}})
                     for _ in range(args.overhead_calls)]
            [call.result() for call in calls]
            rates.append(args.overhead_calls / (time.perf_counter() - t))
        rate = statistics.median(rates)
        overhead_rows.append([workers, rate, f"{min(rates):.0f}-{max(rates):.0f}", 1e6 / rate, startup[workers]])
        results[f"overhead/{workers} workers"] = {"calls_per_s": rates, "start_s": startup[workers]}
        pool.close()
    print(f"\nPer-call overhead: {args.overhead_calls} calls of a function that returns at once, {args.repeats} "
          f"repeats, load {load_average()}")
    print_table(["workers", "calls/s (median)", "per repeat", "us per call", "pool start + first calls (s)"],
                overhead_rows)
    write_result("slow_verifier", vars(args), results, out=args.out)


if __name__ == "__main__":
    main()
