"""`trl-ext train` killed with SIGTERM after its first checkpoint, then resumed from the command line; and two
failures of the command, exit code and one line (run in this process: tests/cli_in_process.py)."""

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
UPDATES = 6
EXCLUDED_PREFIXES = ("eps", "time/", "train_runtime", "train_samples", "train_steps", "total_flos")


def history(out_dir):
    return json.loads((Path(out_dir) / "trainer_state.json").read_text())["log_history"]


def update_logs(out_dir):
    return {h["step"]: h for h in history(out_dir) if "objective/kl" in h}


def test_sigterm_then_resume_from_the_command_line(tiny_models, tmp_path, capfd, monkeypatch):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "TRL_EXT_TINY_DIR": str(tiny_models.root)}
    # the PPO demo recipe as shipped, against the tiny reward model, for 6 updates with a checkpoint after each
    args = ["train", str(ROOT / "recipes" / "demo" / "ppo.yaml"), "--reward_model_path", "tiny://reward",
            "--total_episodes", str(8 * UPDATES), "--save_strategy", "steps", "--save_steps", "1"]
    command = [sys.executable, "-m", "trl_ext", *args]

    def run(out, *extra):
        return subprocess.run([*command, "--output_dir", str(out), *extra], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=600)

    # the uninterrupted reference in this process (the same command: tests/cli_in_process.py); the interrupted and
    # the resumed run below are real processes, signalled and restarted
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    monkeypatch.chdir(ROOT)
    reference = run_cli(capfd, *args, "--output_dir", tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr[-3000:]

    out = tmp_path / "run"
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        proc = subprocess.Popen([*command, "--output_dir", str(out)], stdout=stdout, stderr=stderr, env=env, cwd=ROOT)
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-1" / "trainer_state.json").exists():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        returncode = proc.wait(timeout=300)
    err = (tmp_path / "stderr").read_text()
    assert returncode == 143, err[-3000:]
    line = [x for x in err.splitlines() if x.startswith("trl-ext: training interrupted by SIGTERM")]
    assert line, err[-3000:]
    stopped_at = int(line[0].split(" at step ")[1].split(";")[0])
    assert 1 <= stopped_at < UPDATES
    assert f"checkpoint saved to {out / f'checkpoint-{stopped_at}'}" in line[0]
    assert "--resume_from_checkpoint true" in line[0]
    assert not (out / "trl_ext_recipe.yaml").exists()  # the run did not finish: no final model

    resumed = run(out, "--resume_from_checkpoint", "true")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    expected, got = update_logs(tmp_path / "reference"), update_logs(out)
    assert sorted(got) == sorted(expected) == list(range(1, UPDATES + 1))
    for step, entry in expected.items():
        for key, value in entry.items():
            if not key.startswith(EXCLUDED_PREFIXES):
                assert got[step][key] == pytest.approx(value, abs=1e-5, rel=1e-5), (step, key)
    assert expected[UPDATES]["objective/scores"] != pytest.approx(expected[1]["objective/scores"])


def test_nan_reward_model_exits_with_code_3_and_one_line(tiny_models, tmp_path, capfd, monkeypatch):
    import torch
    from transformers import AutoModelForSequenceClassification

    broken = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    with torch.no_grad():
        broken.score.weight[0, 0] = float("nan")
    broken.save_pretrained(tmp_path / "nan_reward")
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    proc = run_cli(capfd, "train", ROOT / "recipes" / "demo" / "ppo.yaml", "--reward_model_path",
                   tmp_path / "nan_reward", "--value_model_path", "tiny://reward", "--total_episodes", "16",
                   "--output_dir", out)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert (f"trl-ext: error: update 1: objective/scores contains NaN (8 of 8 rollouts); the state before this "
            f"update is saved in {out / 'checkpoint-0'}") in proc.stderr


def test_resume_without_a_checkpoint_fails_before_loading_models(tiny_models, tmp_path, capfd, monkeypatch):
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    monkeypatch.chdir(ROOT)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tmp-checkpoint-3" / "checkpoint-3").mkdir(parents=True)  # a save that never finished
    proc = run_cli(capfd, "check", ROOT / "recipes" / "demo" / "ppo.yaml", "--reward_model_path", "tiny://reward",
                   "--output_dir", tmp_path / "out", "--resume_from_checkpoint", "true")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "trl-ext: error: resume_from_checkpoint: no complete checkpoint-N folder in output_dir")
