"""The `sft` recipe stage end to end: recipes/gold/sft.yaml through the CLI (SIGTERM and resume in subprocesses,
one-line errors in this process: tests/cli_in_process.py) and with wandb offline.

The data and base model are the gold task's (recipes/gold/make_data.py), written small into a temporary folder.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_in_process import run_cli

ROOT = Path(__file__).resolve().parents[2]
GOLD = ROOT / "recipes" / "gold"


@pytest.fixture(scope="module")
def gold_data(tmp_path_factory):
    from recipe_modules import recipe_module

    return recipe_module("gold", "make_data").make_data(tmp_path_factory.mktemp("gold"), sft_examples=256,
                                                        test_examples=32)


def paths(gold_data, out):
    return ["--model_name_or_path", str(gold_data / "base"), "--dataset_name", str(gold_data / "data" / "sft"),
            "--output_dir", str(out)]


def env():
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OMP_NUM_THREADS": "1"}


def history(out_dir):
    return {h["step"]: h for h in json.loads((Path(out_dir) / "trainer_state.json").read_text())["log_history"]
            if "loss" in h}


SHORT = ["--max_steps", "6", "--logging_steps", "1", "--eval_strategy", "no", "--disable_tqdm", "true"]


def test_cli_sigterm_then_resume(gold_data, tmp_path):
    """`trl-ext train` of an SFT recipe: SIGTERM after the first checkpoint exits 143 naming it; the resumed run
    finishes with the same numbers as an uninterrupted one and writes its output folder."""
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    reference = tmp_path / "reference"
    run(resolve_recipe(GOLD / "sft.yaml", paths(gold_data, reference) + SHORT))

    out = tmp_path / "run"
    command = [sys.executable, "-m", "trl_ext", "train", str(GOLD / "sft.yaml"), *paths(gold_data, out), *SHORT,
               "--save_strategy", "steps", "--save_steps", "1"]
    with open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env(), cwd=ROOT)
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-1" / "trainer_state.json").exists():
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=300) == 143, (tmp_path / "stderr").read_text()[-3000:]
    line = [x for x in (tmp_path / "stderr").read_text().splitlines() if x.startswith("trl-ext: training interrupted")]
    assert line and "by SIGTERM" in line[0] and f"checkpoint saved to {out}/checkpoint-" in line[0]
    assert not (out / "trl_ext_recipe.yaml").exists()

    resumed = subprocess.run(command + ["--resume_from_checkpoint", "true"], capture_output=True, text=True,
                             env=env(), cwd=ROOT, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = history(reference), history(out)
    assert sorted(got) == sorted(expected) == list(range(1, 7))
    for step in expected:
        for key in ("loss", "grad_norm", "mean_token_accuracy"):
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-5), (step, key)
    assert expected[6]["loss"] < expected[1]["loss"]
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "tokenizer.json", "trl_ext_recipe.yaml", "trainer_state.json"} <= names


def test_cli_missing_column_is_one_line_before_any_model_loads(gold_data, tmp_path, capfd):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "write three words about the cat", "answer": " cat"}) + "\n")
    out = tmp_path / "out"
    proc = run_cli(capfd, "train", GOLD / "sft.yaml", *paths(gold_data, out), "--dataset_name", bad)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [x for x in proc.stderr.splitlines() if x.startswith("trl-ext: error:")]
    assert len(errors) == 1 and "has 'prompt' but no column 'completion'" in errors[0] and str(bad) in errors[0]
    assert not out.exists()


def test_wandb_offline_run_holds_the_sft_metrics(gold_data, tmp_path, monkeypatch):
    import wandb
    from test_recipe_runs import wandb_run

    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    wandb.teardown()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    for var in ("WANDB_PROJECT", "WANDB_TAGS"):
        monkeypatch.delenv(var, raising=False)
    trainer = run(resolve_recipe(GOLD / "sft.yaml", paths(gold_data, tmp_path / "out") + [
        "--max_steps", "3", "--logging_steps", "1", "--eval_strategy", "steps", "--eval_steps", "3",
        "--report_to", "wandb", "--run_name", "gold-sft", "--wandb_project", "trl-ext-tests"]))
    wrun, keys = wandb_run(tmp_path)
    assert wrun.display_name == "gold-sft" and wrun.project == "trl-ext-tests"
    assert {"train/loss", "train/mean_token_accuracy", "train/entropy", "eval/loss"} <= keys
    per_step = {k for h in trainer.state.log_history if "train_runtime" not in h for k in h
                if k not in ("step", "epoch") and not k.startswith("eval_")}
    assert per_step and {f"train/{k}" for k in per_step} <= keys
