"""benchmarks/ranked_reward.py, slow_verifier.py and reward_overlap.py, each run through its ``main`` at the smallest
size: every variant it compares runs once, and its result JSON holds a row per variant with the counts the settings
imply and positive, finite times. No assertion on which variant is faster (the machine is shared)."""

from __future__ import annotations

import json
import math
from itertools import combinations

from benchmark_scripts import loaded_script


def positive(values) -> bool:
    values = list(values)
    return bool(values) and all(math.isfinite(v) and v > 0 for v in values)


def test_ranked_reward_times_ranked_and_pair_data_for_each_k(tmp_path):
    """trl_ext.RewardTrainer on ranked data against trl.RewardTrainer on all its pairs, K = 2 and 3."""
    out = tmp_path / "ranked.json"
    with loaded_script("ranked_reward") as script:
        script.main(["--ks", "2", "3", "--prompts", "4", "--repeats", "1", "--hidden", "32", "--layers", "1",
                     "--words", "3", "--out", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert [r["K"] for r in rows] == [2, 3]
    for r in rows:
        k = r["K"]
        assert r["ranked_sequences"] == 4 * k  # each response scored once
        assert r["pair_sequences"] == 2 * 4 * len(list(combinations(range(k), 2)))  # both sides of every pair
        assert r["limit"] == k - 1 and len(r["ratios"]) == 1
        assert positive([r["ranked_epoch_s"], r["pairs_epoch_s"], r["ratio_median"], *r["ratios"]])


def test_slow_verifier_runs_in_process_and_on_each_pool(tmp_path):
    """Both kinds of verifier in process and on pools of 2 and 1 workers (the script itself checks every reward
    against the expected one), then the pools' per-call overhead."""
    out = tmp_path / "slow.json"
    with loaded_script("slow_verifier") as script:
        script.main(["--completions", "6", "--repeats", "1", "--workers", "2", "1", "--kinds", "sleep", "cpu",
                     "--overhead-calls", "10", "--out", str(out)])
        work = script.PER_COMPLETION_S * 6
    results = json.loads(out.read_text())["results"]
    runs = ["in process (1 call)", "pool, 2 workers (6 calls)", "pool, 1 workers (6 calls)"]
    assert sorted(results) == sorted([f"{kind}/{run}" for kind in ("sleep", "cpu") for run in runs]
                                     + ["overhead/2 workers", "overhead/1 workers"])
    for kind in ("sleep", "cpu"):
        assert results[f"{kind}/in process (1 call)"]["speedup"] == [1.0]
        # in process, the 6 calls of 20 ms run one after the other (a bound that sleeping and the busy loop keep)
        assert results[f"{kind}/in process (1 call)"]["seconds"][0] >= work
        for run in runs[1:]:
            assert positive(results[f"{kind}/{run}"]["seconds"]) and positive(results[f"{kind}/{run}"]["speedup"])
    for workers in (2, 1):
        overhead = results[f"overhead/{workers} workers"]
        assert positive(overhead["calls_per_s"]) and positive([overhead["start_s"]])


def test_reward_overlap_times_every_design(tmp_path):
    """One GRPO update (k = 4) of 8 completions in chunks of 4 per design: instant reward, the slow verifier in
    process, on 2 workers, and the pool alone."""
    out = tmp_path / "overlap.json"
    with loaded_script("reward_overlap") as script:
        script.main(["--workers", "2", "--batch", "8", "--chunk", "4", "--response-length", "4", "--updates", "2",
                     "--repeats", "1", "--workdir", str(tmp_path / "work"), "--out", str(out)])
        serial = 8 * script.PER_COMPLETION_S
    result = json.loads(out.read_text())
    designs = ["generation alone", "in process", "2 workers", "scoring alone"]
    assert sorted(result["results"]) == sorted(designs) and sorted(result["medians"]) == sorted(designs)
    for design in designs:
        assert len(result["results"][design]) == 1 and positive(result["results"][design])
    # in process, the update's scoring waits for all 8 completions' 20 ms, one after the other
    assert result["medians"]["in process"] >= serial
    assert (tmp_path / "work" / "tiny").is_dir()  # the tiny models went to --workdir
