"""The path users take, under DeepSpeed ZeRO-2 on CPU: `accelerate launch --config_file
recipes/accelerate/cpu_zero2.yaml -m trl_ext train recipes/demo/reward.yaml`, as shipped (step counts and paths
overridden), with a checkpoint every step. Then, from the command line too, a run resumed from its checkpoint-2
(DeepSpeed's sharded optimizer state included) and stopped by SIGTERM on one rank: it logs the uninterrupted run's
numbers up to its stop, and saves a complete checkpoint there."""

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launch_commands import accelerate_launch
from test_engines import ROOT, launch_env, require_deepspeed

pytestmark = pytest.mark.engines

STEPS = 6


def history(out_dir):
    return json.loads((Path(out_dir) / "trainer_state.json").read_text())["log_history"]


def losses(out_dir):
    return {h["step"]: h["loss"] for h in history(out_dir) if "loss" in h}


def train_command(out, *extra):
    return [*accelerate_launch("cpu_zero2.yaml"), "-m", "trl_ext", "train",
            str(ROOT / "recipes" / "demo" / "reward.yaml"), "--output_dir", str(out), "--max_steps", str(STEPS),
            "--per_device_train_batch_size", "4", "--logging_steps", "1", "--save_strategy", "steps",
            "--save_steps", "1", *extra]


def workers(launcher_pid):
    """The `-m trl_ext` processes accelerate launch started (one per rank)."""
    import psutil

    return [p for p in psutil.Process(launcher_pid).children(recursive=True) if "trl_ext" in " ".join(p.cmdline())]


def test_cli_under_zero2_resume_then_sigterm(tiny_models, tmp_path):
    require_deepspeed()
    env = launch_env(tiny_models)
    reference = tmp_path / "reference"
    proc = subprocess.run(train_command(reference), capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    expected = losses(reference)
    assert sorted(expected) == list(range(1, STEPS + 1))
    # 2 ranks x 4 pairs of the 256-pair demo data per step: the global batch needs both ranks
    assert [h["epoch"] for h in history(reference) if "loss" in h][-1] == pytest.approx(STEPS * 2 * 4 / 256)
    assert (reference / "model.safetensors").exists() and (reference / "trl_ext_recipe.yaml").exists()
    assert any(p.name.startswith("global_step") for p in (reference / "checkpoint-2").iterdir())

    out = tmp_path / "resumed"
    command = train_command(out, "--resume_from_checkpoint", reference / "checkpoint-2")
    with open(tmp_path / "stderr", "w") as stderr:
        run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=ROOT)
        deadline = time.monotonic() + 600
        while not (out / "checkpoint-3" / "trainer_state.json").exists():
            assert run.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline
            time.sleep(0.05)
        ranks = workers(run.pid)
        assert len(ranks) == 2
        ranks[-1].send_signal(signal.SIGTERM)  # one rank only: the ranks agree to stop together
        returncode = run.wait(timeout=600)
    err = (tmp_path / "stderr").read_text()
    assert returncode != 0, err[-4000:]  # accelerate's launcher reports its ranks' exit code 143 as a failure
    line = [x for x in err.splitlines() if x.startswith("trl-ext: training interrupted by SIGTERM")]
    assert len(line) == 1, err[-4000:]  # printed once, by rank 0, which was not the one signalled
    stopped_at = int(line[0].split(" at step ")[1].split(";")[0])
    assert 3 <= stopped_at < STEPS
    checkpoint = out / f"checkpoint-{stopped_at}"
    assert f"checkpoint saved to {checkpoint}" in line[0]
    names = {p.name for p in checkpoint.iterdir()}
    assert {"trainer_state.json", "latest", "rng_state_0.pth", "rng_state_1.pth", "model.safetensors"} <= names
    assert any(n.startswith("global_step") for n in names)
    assert not list(out.glob("tmp-checkpoint-*"))
    assert not (out / "trl_ext_recipe.yaml").exists()  # no final model: the run did not finish
    # the resumed run's steps, as saved in the checkpoint it wrote at the stop, are the uninterrupted run's
    got = losses(checkpoint)
    assert sorted(got) == list(range(1, stopped_at + 1))
    for step in got:
        assert got[step] == pytest.approx(expected[step], rel=1e-5, abs=1e-6), step
