"""benchmarks/tool_use.py, every variant for one tiny update: GAE, RLOO and GRPO with the add tool (multi-turn
episodes) and without it, and the guessing-game environment case (environment_factory, the environment's reward).

What must hold: each variant trains the estimator it names, from the SFT model it names, with the tool exactly when
it says so (the trainer logs tool metrics only with tools), and its result row holds one update's reward and a
held-out exact match; the environment case's reward is the environment's (`rewards/GuessEnv/mean`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
TINY = ["--updates", "1", "--seeds", "1", "--set", "per_device_train_batch_size=4", "local_rollout_forward_batch_size=4",
        "num_ppo_epochs=1"]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import tool_use
    finally:
        sys.path.remove(str(BENCH))
    return tool_use


@pytest.fixture(scope="module")
def sft_work(bench, tmp_path_factory):
    """The benchmark's data (8 training problems, 4 held out) and both SFT recipes for 2 steps."""
    work = tmp_path_factory.mktemp("tool_use_bench")
    bench.setup_env(threads=1)
    bench.sft(work, train=8, heldout=4, max_steps=2)
    return work


def run(bench, sft_work, tmp_path, *extra):
    out = tmp_path / "result.json"
    assert bench.main(["--sft-dir", str(sft_work), "--out", str(out), *TINY, *extra]) == 0
    return json.loads(out.read_text())


def test_every_variant_is_named_for_its_settings(bench):
    assert len(bench.VARIANTS) == 6
    for name, variant in bench.VARIANTS.items():
        assert name.endswith(", tools") == variant["tools"] and name.endswith(", no tools") != variant["tools"]
        assert variant["advantage_estimator"] in name.lower().replace("gae (value model)", "gae")


@pytest.mark.parametrize("name", [
    "GAE (value model), tools", "GAE (value model), no tools", "RLOO k=4, tools", "RLOO k=4, no tools",
    "GRPO k=4 (KL in loss), tools", "GRPO k=4 (KL in loss), no tools"])
def test_variant_runs_one_update(bench, sft_work, tmp_path, name):
    result = run(bench, sft_work, tmp_path, "--only", name)
    variant = bench.VARIANTS[name]
    row = result["results"]["runs"][name]
    settings = row["settings"]
    assert settings["advantage_estimator"] == variant["advantage_estimator"]
    assert settings["response_length"] == (72 if variant["tools"] else 16)
    assert settings.get("max_tool_calling_iterations") == (2 if variant["tools"] else None)
    (seed,) = row["seeds"]
    assert len(seed["reward"]) == 1 and 0.0 <= seed["reward"][0] <= 1.0
    assert len(seed["tool_calls"]) == (1 if variant["tools"] else 0)  # tool metrics only when the trainer has tools
    assert 0.0 <= seed["end"]["exact_match"] <= 1.0
    assert seed["start"] == result["results"]["sft"]["tools" if variant["tools"] else "no tools"]


def test_environment_case_runs_one_update(bench, sft_work, tmp_path):
    result = run(bench, sft_work, tmp_path, "--only", "--guess", "1", "--guess-sft-steps", "2")
    guess = result["results"]["guess"]
    assert guess["settings"]["advantage_estimator"] == "grpo" and guess["settings"]["max_tool_calling_iterations"] == 4
    assert len(guess["reward"]) == 1 and 0.0 <= guess["reward"][0] <= 1.0  # the environment's own reward was logged
    assert len(guess["turns"]) == 1 and guess["turns"][0] >= 1.0
    assert result["results"]["runs"] == {}
