"""benchmarks/verifiable.py (also what benchmarks/objectives.py --task verifiable and rollout_engine.py build on),
every estimator for one tiny update after a 2-step SFT on 16 problems (8 held out).

What must hold: each row trains the estimator it names (its settings, one logged reward per update), starting from
the SFT model's held-out accuracy (the curve's update 0) and measured again after the update."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--updates", "1", "--seeds", "1", "--figures", "", "--set", "per_device_train_batch_size=8",
        "local_rollout_forward_batch_size=8", "num_ppo_epochs=1"]


def _script_modules() -> dict:
    """The loaded modules of benchmarks/ and recipes/ (two tasks' `make_data`, `evaluate` share their names)."""
    folders = (str(ROOT / "benchmarks"), str(ROOT / "recipes"))
    return {name: m for name, m in list(sys.modules.items()) if str(getattr(m, "__file__", "")).startswith(folders)}


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """One run of the benchmark's main with every estimator, in this process: the scripts' plain imports (`make_data`,
    `evaluate`) see this task's modules only, and whatever another task's test loaded is back afterwards."""
    saved_path, saved = list(sys.path), _script_modules()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import verifiable

        sft_dir, _ = verifiable.sft(tmp_path_factory.mktemp("verifiable_sft"), max_steps=2, train=16, heldout=8)
        work, out = tmp_path_factory.mktemp("verifiable_runs"), tmp_path_factory.mktemp("result") / "result.json"
        assert verifiable.main(["--sft-dir", str(sft_dir), "--workdir", str(work), "--out", str(out), *TINY]) == 0
        return verifiable.ESTIMATORS, json.loads(out.read_text())
    finally:
        sys.path[:] = saved_path
        for name in _script_modules():
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.mark.parametrize("name", ["GAE (value model)", "RLOO k=4", "GRPO k=4 (KL in loss)", "REINFORCE++"])
def test_every_estimator_runs_one_update_from_the_sft_model(result, name):
    estimators, result = result
    row = result["results"]["runs"][name]
    assert {k: row["settings"][k] for k in estimators[name]} == estimators[name]
    assert row["settings"]["per_device_train_batch_size"] == 8 and row["settings"]["response_length"] == 5
    (seed,) = row["seeds"]
    assert len(seed["reward"]) == 1 and 0.0 <= seed["reward"][0] <= 1.0 and len(seed["kl"]) == 1
    start, end = seed["curve"]
    assert start == {"update": 0, **result["results"]["sft"]}
    assert end["update"] == 1 and 0.0 <= end["greedy"] <= 1.0 and 0.0 <= end["sampled"] <= 1.0
