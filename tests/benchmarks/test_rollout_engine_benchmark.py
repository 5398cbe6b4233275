"""benchmarks/rollout_engine.py through its ``main``, every mode on a Llama of hidden size 32, one layer, a
128-token vocabulary, 4 prompts, responses of at most 8 new tokens, one repeat: the default tokens/s study (both
workloads, with and without LoRA, every engine variant), the fresh-process memory runs (their ``--child`` code, here
in this process), ``--threshold``, ``--tolerance`` and ``--verifiable`` (from a 2-step SFT model of the verifiable
task, two updates per run). Each writes its rows with finite, positive numbers. No assertion on which engine is
faster."""

from __future__ import annotations

import json
import math

import pytest
from benchmark_scripts import in_process_children, loaded_script

MAX_NEW = 8
PROMPTS = 4
TINY = ["--repeats", "1", "--hidden", "32", "--layers", "1", "--vocab", "128", "--prompts", str(PROMPTS),
        "--max-new-tokens", str(MAX_NEW)]
VARIANTS = ["generate (whole batch)", "generate (chunks of 8)", "continuous batching (cache of 32)",
            "continuous batching (cache of 8)"]


def finite_positive(*values) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


def run(argv: list[str], tmp_path, children: bool = False) -> tuple[dict, list]:
    """The result JSON of ``main(TINY + argv)`` and the children's argument lists (run in this process)."""
    out = tmp_path / "result.json"
    with loaded_script("rollout_engine") as script:
        calls = []
        if children:
            script.run_child = in_process_children(script)
            calls = script.run_child.calls
        script.main([*TINY, *argv, "--out", str(out)])
    return json.loads(out.read_text()), calls


def check_lengths(workload: str, mean_length: float) -> None:
    """No stop token (fixed): every response runs to the cap; with EOS (uneven): at most the cap."""
    if workload == "fixed":
        assert mean_length == MAX_NEW
    else:
        assert 0 < mean_length <= MAX_NEW


def test_default_study_every_variant_both_workloads_with_and_without_lora(tmp_path):
    """Tokens/s of every variant, then each variant's memory child; the table joins both."""
    result, calls = run([], tmp_path, children=True)
    assert len(calls) == 16 == len(result["results"]["memory"])
    timings = result["results"]["timings"]
    assert list(timings) == ["uneven, no LoRA", "fixed, no LoRA", "uneven, LoRA", "fixed, LoRA"]
    for key, runs in timings.items():
        assert list(runs) == VARIANTS
        for (measurement,) in runs.values():
            check_lengths(key.split(",")[0], measurement["mean_length"])
            assert measurement["tokens"] == measurement["mean_length"] * PROMPTS
            assert finite_positive(measurement["seconds"], measurement["tokens_per_s"])
    table = result["table"]
    assert [row[:3] for row in table] == [[w, lora, v] for w, lora in (("uneven", "no LoRA"), ("fixed", "no LoRA"),
                                                                        ("uneven", "LoRA"), ("fixed", "LoRA"))
                                          for v in VARIANTS]
    for row in table:
        assert finite_positive(*map(float, row[4:7])) and float(row[8]) >= 0  # peak RSS growth of its child
        if row[2] == VARIANTS[0]:
            assert row[5] == "1.00"  # the reference against itself


def test_memory_only_one_child_per_variant(tmp_path):
    """Every workload (whatever ``--workloads`` says), with and without LoRA, every variant: one child each."""
    result, calls = run(["--memory-only", "--workloads", "fixed"], tmp_path, children=True)
    memory = result["results"]
    keys = [f"{w} / {lora} / {v}" for w in ("uneven", "fixed") for lora in (False, True) for v in VARIANTS]
    assert list(memory) == keys and len(calls) == len(keys)
    for call in calls:  # the sizes reach every child
        assert call[call.index("--hidden") + 1] == "32" and call[call.index("--max-new-tokens") + 1] == str(MAX_NEW)
        assert call[call.index("--prompts") + 1] == str(PROMPTS)
    for key, r in memory.items():
        check_lengths(key.split(" / ")[0], r["mean_length"])
        assert finite_positive(r["tokens_per_s"], r["rss_before_mb"]) and r["peak_growth_mb"] >= 0


def test_threshold_one_row_per_response_length(tmp_path):
    result, _ = run(["--threshold", "--threshold-lengths", "4", "8"], tmp_path)
    rows = result["results"]
    assert [r["response_length"] for r in rows] == [4, 8]
    for r in rows:
        assert finite_positive(r["generate_tokens_per_s"], r["cb_tokens_per_s"], r["ratio"], *r["ratios"])
        assert len(r["ratios"]) == 1 and 0 < r["mean_length"] <= r["response_length"]


def test_tolerance_engine_log_probs_match_teacher_forcing(tmp_path):
    """Every model x LoRA x sampling row; with temperature only, the engine's log-probs are the teacher-forced ones
    within trl_ext's LOGPROB_TOLERANCE (what this mode measures)."""
    from trl_ext.ppo.rollout.engine import LOGPROB_TOLERANCE

    result, _ = run(["--tolerance"], tmp_path)
    rows = result["results"]
    samplings = [("temperature only", 0.7), ("temperature only", 1.0), ("temperature only", 1.3), ("top-k 50", 1.0),
                 ("top-p 0.9", 1.0)]
    models = ["tiny (hidden 64, 2 layers, vocab 384)", "bench (hidden 32, 1 layers, vocab 128)"]
    assert [(r["model"], r["lora"], r["sampling"], r["temperature"]) for r in rows] == [
        (m, lora, s, t) for m in models for lora in (False, True) for s, t in samplings]
    for r in rows:
        assert 0 < r["tokens"] <= min(16, PROMPTS) * MAX_NEW
        assert math.isfinite(r["engine_max_abs_diff"]) and math.isfinite(r["generate_max_abs_diff"])
        if r["sampling"] == "temperature only":
            assert r["engine_max_abs_diff"] <= LOGPROB_TOLERANCE


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    with loaded_script("verifiable") as verifiable:
        sft_dir, _ = verifiable.sft(tmp_path_factory.mktemp("verifiable_sft"), max_steps=2, train=16, heldout=8)
    return sft_dir


def test_verifiable_whole_updates_with_each_engine(sft_dir, tmp_path):
    result, _ = run(["--verifiable", "--sft-dir", str(sft_dir), "--updates", "2", "--response-lengths", "5",
                     "--workdir", str(tmp_path / "work")], tmp_path)
    rows = result["results"]
    assert [(r["response_length"], r["engine"]) for r in rows] == [(5, "generate"), (5, "continuous_batching")]
    for r in rows:
        (measurement,) = r["runs"]
        assert measurement["engine"] == r["engine"] and len(measurement["update_s"]) == 1  # the warm-up left out
        assert finite_positive(r["update_s"], r["time/rollout"], r["time/scoring"], r["time/optimization"])
        assert 0 < r["completions/mean_length"] <= r["max_length_max"] <= 5
    assert finite_positive(rows[1]["speedup_update"], rows[1]["speedup_rollout"])
