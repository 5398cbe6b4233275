"""benchmarks/critic_luck.py, every variant for one tiny update on the quiz with a die on screen, both horizons, and
the merge of cells run apart.

What must hold: each variant trains the estimator it names, the GAE rows with the value model's settings they name;
a row holds one update's learning-curve point, a held-out score and, with a value model, the critic's explained
variance per turn; merging files of cells gives one study with the seeds in order, per horizon."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import loaded_script

TINY = ["--updates", "1", "--heldout", "4", "--figures", "", "--set", "per_device_train_batch_size=4",
        "local_rollout_forward_batch_size=4", "num_ppo_epochs=1"]


@pytest.fixture(scope="module")
def bench():
    with loaded_script("critic_luck") as script:
        yield script


@pytest.fixture(scope="module")
def sft_work(bench, tmp_path_factory):
    """The dice quiz's data (8 training quizzes per horizon) and sft_dice.yaml for 2 steps."""
    work = tmp_path_factory.mktemp("critic_luck")
    bench.setup_env(threads=1)
    bench.sft(work, train=8, max_steps=2)
    return work


def run(bench, sft_work, out, *extra):
    assert bench.main(["--sft-dir", str(sft_work), "--out", str(out), *TINY, *extra]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", ["GAE, critic settings", "GAE, TRL's settings", "RLOO k=4",
                                  "GRPO k=4 (KL in loss)"])
def test_variant_runs_one_update(bench, sft_work, tmp_path, name):
    result = run(bench, sft_work, tmp_path / "result.json", "--only", name, "--seed-list", "1", "--luck", "0.5")
    variant = bench.VARIANTS[name]
    (cell,) = result["results"]["runs"][bench.cell_key(name, 0.5, 4)]["seeds"]
    settings = cell["settings"]
    assert cell["seed"] == 1 and cell["luck"] == 0.5 and settings["advantage_estimator"] == variant[
        "advantage_estimator"]
    assert {k: settings[k] for k in variant} == variant
    assert (settings["response_length"], settings["max_tool_calling_iterations"]) == (224, 4)
    assert len(cell["rounds_right"]) == 1 and 0.0 <= cell["rounds_right"][0] <= 1.0
    assert 0.0 <= cell["end"]["reward"] <= 1.0
    if name == "GAE, TRL's settings":  # the critic's health, per turn the 2-step SFT model played (with
        assert len(cell["explained_var"]) == 1 and cell["health"]  # critic_lam 1 its returns may have no spread:
        assert sorted(cell["health"], key=int) == [str(k) for k in range(1, len(cell["health"]) + 1)]  # none)
    elif variant["advantage_estimator"] != "gae":
        assert not cell["explained_var"] and not cell["health"]


def test_eight_rounds_and_the_merge(bench, sft_work, tmp_path):
    name = "GRPO k=4 (KL in loss)"
    for seed in (1, 0):
        run(bench, sft_work, tmp_path / f"s{seed}.json", "--only", name, "--seed-list", str(seed), "--luck", "0",
            "--rounds", "8")
    (cell,) = json.loads((tmp_path / "s0.json").read_text())["results"]["runs"][bench.cell_key(name, 0, 8)]["seeds"]
    assert (cell["settings"]["response_length"], cell["settings"]["max_tool_calling_iterations"]) == (400, 8)
    merged = tmp_path / "merged.json"
    assert bench.main(["--merge", str(tmp_path / "s1.json"), str(tmp_path / "s0.json"), "--out", str(merged),
                       "--figures", str(tmp_path)]) == 0
    seeds = json.loads(merged.read_text())["results"]["runs"][bench.cell_key(name, 0, 8)]["seeds"]
    assert [s["seed"] for s in seeds] == [0, 1] and (tmp_path / "critic_luck.png").is_file()
    assert bench.first_reached([0.5, 0.95, 1.0], 32) == 64 and bench.first_reached([0.5], 32) is None
