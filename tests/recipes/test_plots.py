"""`trl-ext plot`: the series it reads from real runs' trainer_state.json, the PNG files, its one-line errors.

Real outputs: a short reward-recipe run written here (with evaluations), and the session's PPO run (`ppo_run`,
tests/conftest.py: a real trl-ext PPO run with a checkpoint after each of its 3 updates), whose checkpoints make an
output folder without a final trainer_state.json, as a run that is still going looks.
"""

import json
import shutil
from pathlib import Path

import pytest

from trl_ext.errors import UserInputError
from trl_ext.cli import main
from trl_ext.recipe_loader.plots import load_run, panels_for, series

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reward_run(tiny_models, tmp_path_factory):
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    mp = pytest.MonkeyPatch()
    mp.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    out = tmp_path_factory.mktemp("plots") / "reward"
    pairs = ROOT / "recipes" / "demo" / "data" / "preferences.jsonl"
    run(resolve_recipe(ROOT / "recipes" / "demo" / "reward.yaml", [
        "--output_dir", str(out), "--dataset_name", str(pairs), "--max_steps", "4", "--logging_steps", "1",
        "--eval_strategy", "steps", "--eval_steps", "2", "--dataset_test_split", "train",
        "--per_device_eval_batch_size", "64"]))
    mp.undo()
    return out


def test_series_are_the_logged_values(reward_run):
    history = json.loads((reward_run / "trainer_state.json").read_text())["log_history"]
    run = load_run(reward_run)
    assert run.kind == "reward" and run.finished and run.label == "reward"  # kind from trl_ext_recipe.yaml
    steps, values = series(run.log_history, "accuracy")
    assert steps == [1, 2, 3, 4]
    assert values == [h["accuracy"] for h in history if "accuracy" in h and "train_runtime" not in h]
    steps, values = series(run.log_history, "eval_loss")
    assert steps == [2, 4] and values == [h["eval_loss"] for h in history if "eval_loss" in h]
    assert series(run.log_history, "train_loss") == ([], [])  # the summary entry is not a point
    assert panels_for([run], "reward") == ["loss", "accuracy", "margin", "mean_reward"]


def test_a_running_run_is_read_from_its_latest_checkpoint(ppo_run, tmp_path):
    run_dir = tmp_path / "ppo"
    for step in (1, 2):  # the run's first two checkpoints: it is still going
        shutil.copytree(ppo_run["run"] / f"checkpoint-{step}", run_dir / f"checkpoint-{step}")
    (run_dir / "tmp-checkpoint-3" / "checkpoint-3").mkdir(parents=True)  # a save in progress: ignored
    run = load_run(run_dir)
    assert run.kind == "ppo" and not run.finished and run.label == "ppo (checkpoint-2)"  # kind from its metrics
    assert run.state_file == run_dir / "checkpoint-2" / "trainer_state.json"
    steps, scores = series(run.log_history, "objective/scores")
    expected = ppo_run["updates"]
    assert [u["step"] for u in expected] == [1, 2, 3]
    assert steps == [1, 2] and scores == [u["objective/scores"] for u in expected[:2]]  # the run had 3
    assert panels_for([run], "ppo") == ["objective/scores", "objective/kl", "objective/kl_coef",
                                        "objective/rlhf_reward", "loss/policy_avg", "loss/value_avg", "loss/ptx_avg",
                                        "objective/entropy"]


def test_plot_writes_one_png_per_kind(reward_run, ppo_run, tmp_path, capsys):
    pytest.importorskip("matplotlib")  # the `plot` extra (CI installs it with `dev`)
    second = tmp_path / "again" / "reward"
    shutil.copytree(reward_run, second)
    assert main(["plot", str(reward_run), str(second), str(ppo_run["run"]), "--out", str(tmp_path / "png"),
                 "--smoothing", "0.5"]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tmp_path / "png" / "reward.png"), str(tmp_path / "png" / "ppo.png")]
    for path in map(Path, written):
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_writes_beside_the_run_by_default(reward_run, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")  # the `plot` extra (CI installs it with `dev`)
    run = tmp_path / "run"
    shutil.copytree(reward_run, run)
    monkeypatch.chdir(tmp_path)  # not into the current directory: into OUTPUT_DIR/plots
    assert main(["plot", str(run)]) == 0
    assert capsys.readouterr().out.split() == [str(run / "plots" / "reward.png")]
    assert (run / "plots" / "reward.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "plots").exists()


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trl-ext: error: plot:"), err
    for needle in needles:
        assert needle in err[0]


def test_plot_errors_are_one_line(reward_run, tmp_path, capsys, monkeypatch):
    assert main(["plot", str(tmp_path / "missing")]) == 2
    _one_line_error(capsys, "missing", "does not exist")
    (tmp_path / "empty").mkdir()
    assert main(["plot", str(tmp_path / "empty")]) == 2
    _one_line_error(capsys, "empty", "has no trainer_state.json")
    assert main(["plot", str(reward_run), "--smoothing", "1.5"]) == 2
    _one_line_error(capsys, "--smoothing")
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # as if the extra were not installed
    assert main(["plot", str(reward_run), "--out", str(tmp_path / "png")]) == 2
    _one_line_error(capsys, "matplotlib is not installed", 'pip install "trl-ext[plot]"')
    assert not (tmp_path / "png").exists()
    with pytest.raises(UserInputError):
        load_run(tmp_path / "empty")
