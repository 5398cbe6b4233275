"""Which engine runs which trainer: DDP, DeepSpeed ZeRO-2, ZeRO-3 and FSDP2, each launched as users launch it
(`accelerate launch --config_file recipes/accelerate/X.yaml`), on this machine's GPUs or, without a GPU, on 2 CPU
processes (the `cpu_*.yaml` configs, as tests/engines does).

One launch of tests/engines/engine_script.py per engine runs, on tiny offline models: reward (ranked data + label
smoothing), DPO (cDPO), PPO (LoRA policy, adaptive KL, joint ptx; checkpoint at update 2) and PPO resumed from
that checkpoint, and the PPO demo recipe with a full policy (PPO only under DDP and DeepSpeed: trl-ext refuses it
under FSDP). Each run passes when every rank saw the engine and all processes, the ranks end with identical weights,
the numbers equal the DDP run's (same seeds and global batch; not for the full-policy recipe, whose gradients
DeepSpeed clips at norm 1 and DDP does not: there the first update's KL must be 0), and a resumed PPO run ends with
the uninterrupted run's weights. Prints a pass/fail table, writes
benchmarks/results/engine_matrix.json, and exits 1 if anything failed.

    python benchmarks/engine_matrix.py                      # all GPUs (1 GPU works too: one process per engine)
    python benchmarks/engine_matrix.py --num-processes 2    # or --cpu: the CPU configs, 2 processes
    python benchmarks/engine_matrix.py --engines zero3      # some engines only (DDP always runs: the reference)

Needs `pip install "trl-ext[deepspeed]"`. On a machine where DeepSpeed has never run, its first launch compiles a
small op (a few minutes on CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import REPO, print_table, write_result

SCRIPT = REPO / "tests" / "engines" / "engine_script.py"
ALL_RUNS = ["reward", "dpo", "ppo", "ppo_resumed", "ppo_recipe"]
# engine -> (GPU config, CPU config, runs, accelerate's distributed type on several processes, sharded?)
ENGINES = {
    "ddp": ("multi_gpu.yaml", "cpu_2proc.yaml", ALL_RUNS, ("MULTI_GPU", "MULTI_CPU"), False),
    "zero2": ("zero2.yaml", "cpu_zero2.yaml", ALL_RUNS, ("DEEPSPEED",), False),
    "zero3": ("zero3.yaml", "cpu_zero3.yaml", ALL_RUNS, ("DEEPSPEED",), True),
    "fsdp": ("fsdp.yaml", "cpu_fsdp.yaml", ["reward", "dpo"], ("FSDP",), True),
}


def launch(engine: str, gpu: bool, n: int, tiny: Path, out: Path, timeout: float) -> tuple[list[dict], str, float]:
    gpu_config, cpu_config, runs = ENGINES[engine][:3]
    config = gpu_config if gpu else cpu_config
    if gpu and engine == "ddp" and n == 1:
        config = "single_gpu.yaml"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "recipes" / "accelerate" /
           config), "--num_processes", str(n), "--mixed_precision", "no", str(SCRIPT), str(tiny), str(out),
           ",".join(runs), *(["--gpu"] if gpu else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "TRL_EXPERIMENTAL_SILENCE": "1", "TRL_EXT_TINY_DIR": str(tiny)}
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
        tail = proc.stderr[-3000:] if proc.returncode else ""
    except subprocess.TimeoutExpired:
        tail = f"timed out after {timeout:.0f} s"
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return ranks, tail, time.monotonic() - start


def close(a, b, rel: float, abs_: float) -> bool:
    a, b = (a if isinstance(a, list) else [a]), (b if isinstance(b, list) else [b])
    return len(a) == len(b) and all(abs(x - y) <= max(abs_, rel * abs(y)) for x, y in zip(a, b))


def check(engine: str, run: str, ranks: list[dict], reference: list[dict] | None, n: int, rel: float) -> str:
    """'' when the run passed, else what failed."""
    results = [r.get(run) for r in ranks]
    if len(ranks) != n or any(r is None for r in results):
        return f"{len(ranks)} of {n} ranks reported this run"
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        return errors[0][:200]
    types, sharded = ENGINES[engine][3], ENGINES[engine][4]
    for rank, r in enumerate(results):
        if r["world_size"] != n or r["rank"] != rank:
            return f"rank {rank} saw world size {r['world_size']} (rank {r['rank']})"
        if n > 1 and r["distributed_type"] not in types:
            return f"accelerate ran {r['distributed_type']}, not {'/'.join(types)}"
        if n > 1 and sharded and r["local_trainable_numel"] >= r["trainable_numel"]:
            return "not sharded: a rank holds all trainable values"
    if len({r["checksum"] for r in results}) != 1:
        return "ranks end with different weights"
    if run == "ppo_recipe":
        kl = results[0]["kl"]
        return "" if abs(kl[0]) < 1e-6 else f"policy and reference differ at the start: KL {kl}"
    if reference is not None and engine != "ddp":
        ref = reference[0].get(run, {})
        keys = ("losses",) if run in ("reward", "dpo") else ("kl", "kl_coef", "ptx", "final_kl_coef")
        for key in keys:
            if key not in ref or not close(results[0][key], ref[key], rel, rel / 10):
                return f"{key} differs from DDP: {results[0][key]} vs {ref.get(key)}"
    if run == "ppo_resumed":
        full = [r.get("ppo", {}) for r in ranks]
        if any(f.get("checksum") != r["checksum"] for f, r in zip(full, results)):
            return "resumed run ends with other weights than the uninterrupted one"
    return ""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="zero2,zero3,fsdp", help="comma-separated, from zero2, zero3, fsdp")
    parser.add_argument("--num-processes", type=int, default=None, help="default: the GPU count, or 2 on CPU")
    parser.add_argument("--cpu", action="store_true", help="use the CPU configs even when there is a GPU")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per engine launch")
    parser.add_argument("--out", default=None, help="JSON result path (default benchmarks/results/engine_matrix.json)")
    args = parser.parse_args(argv)

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import torch

    from trl_ext.testing import build_tiny_models

    gpu = torch.cuda.is_available() and not args.cpu
    n = args.num_processes or (torch.cuda.device_count() if gpu else 2)
    rel = 1e-4 if gpu else 1e-5  # GPU kernels are not bitwise reproducible across engines
    engines = ["ddp"] + [e for e in args.engines.split(",") if e and e != "ddp"]
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        parser.error(f"unknown engine(s) {unknown}; use {list(ENGINES)[1:]}")
    where = f"{n} x {torch.cuda.get_device_name(0)}" if gpu else f"{n} CPU processes"
    print(f"engine matrix on {where}: {', '.join(engines)}", flush=True)

    rows, results, reference = [], {}, None
    with tempfile.TemporaryDirectory(prefix="trl-ext-engines-") as tmp:
        tiny = build_tiny_models(Path(tmp) / "tiny").root
        for engine in engines:
            ranks, tail, seconds = launch(engine, gpu, n, tiny, Path(tmp) / engine, args.timeout)
            if engine == "ddp":
                reference = ranks
            results[engine] = {"seconds": round(seconds, 1), "ranks": ranks, "stderr_tail": tail}
            for run in ENGINES[engine][2]:
                failure = check(engine, run, ranks, reference, n, rel)
                if failure and tail and not any(run in r for r in ranks):
                    failure += f" (launch failed: {tail.strip().splitlines()[-1][:200] if tail.strip() else ''})"
                rows.append([engine, run, "FAIL" if failure else "pass", failure or "", f"{seconds:.0f}"])
            print(f"  {engine}: {seconds:.0f} s", flush=True)
        rows.append(["fsdp", "ppo", "refused", "PPO does not run under FSDP (trl-ext says so before loading)", "-"])
    print_table(["engine", "run", "result", "what failed", "launch s"], rows)
    write_result("engine_matrix", {"gpu": gpu, "num_processes": n, "engines": engines, "rel_tolerance": rel},
                 {"rows": rows, "engines": results}, out=args.out)
    return 1 if any(row[2] == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
