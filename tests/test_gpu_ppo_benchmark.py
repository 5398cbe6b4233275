"""benchmarks/gpu_ppo.py --smoke: the GPU benchmark's code on CPU with a tiny model, so that the script cannot rot.

The variants run in this process here (the script runs each in a child of its own, through the same functions);
`--budget-only` runs as the command."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def gpu_ppo():
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_ppo

        yield gpu_ppo
    finally:
        sys.path.remove(str(BENCH))


def test_smoke_variants_on_cpu(gpu_ppo, tmp_path):
    from trl_ext.ppo.rollout.memory_budget import GIB

    a = gpu_ppo.parse_args(["--smoke", "--workdir", str(tmp_path)])
    built = gpu_ppo.build_child(a)
    gpu_ppo.write_prompts(a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", "prompts.jsonl", "reward"]
    assert built["parameters"] > 0
    results = {}
    for variant in ("shared", "fast"):
        a.variant = variant
        results[variant] = gpu_ppo.variant_child(a)
    shared, fast = results["shared"], results["fast"]
    smoke = gpu_ppo.SHAPES["smoke"]
    for r in (shared, fast):
        assert len(r["seconds_per_update"]) == smoke["updates"] and r["peak_rss_growth_mib"] > 0
        assert all(math.isfinite(r["first_update"][k]) for k in ("objective/scores", "objective/kl", "loss/value_avg"))
        assert r["rollout_tokens_per_s"] and r["phases"][0]["time/rollout"] > 0
    # shared runs the recipe's chunk; fast lets `auto` pick the largest chunk that fits its 2 GiB target: the whole
    # per-device batch of the tiny run, and its predicted peak (memory_budget at that chunk) is within the target
    assert shared["rollout_chunk"] == smoke["chunk"]
    assert fast["rollout_chunk"] == smoke["micro"] * smoke["accumulation"]
    assert fast["predicted"]["peak_gib"] <= 2.0 and fast["lora_dropout"] == 0.0
    assert fast["predicted"]["peak_gib"] * GIB > 1 * GIB  # the budget's assumed 1 GiB device overhead included
    md = gpu_ppo.table([{"variant": "trl112", "error": "skipped"}, shared, fast], smoke=True)
    assert md.count("\n") == 4 and "| fast (TRL " in md and "| trl112 | skipped |" in md


def test_budget_only_prints_the_8b_table():
    out = subprocess.run([sys.executable, str(BENCH / "gpu_ppo.py"), "--budget-only"], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    assert "| **peak** = all run + largest phase + overhead | **26.3** (training) | **20.7** (training) | " \
           "**15.7** (training) | **12.0** (training) |" in out
    assert "| `auto` chunk at 24 GiB | none fits | 32 | 32 | 64 |" in out
