"""Shared fixtures: tiny offline models built once per test session."""

import os

# Nothing in the tests may reach a hub or the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models: one thread is as fast as two and keeps runs reproducible and the machine responsive.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of a tiny tokenizer, causal LM and scalar-headed model (see `trl_ext.testing`)."""
    from trl_ext.testing import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models.tokenizer)


@pytest.fixture(scope="session")
def reward_adapter(tiny_models, tmp_path_factory):
    """A LoRA reward adapter (random LoRA weights and score head) on the tiny *policy*'s base, saved as a reward
    recipe with use_peft writes it: what a shared base (trl_ext.models.shared_base) loads as reward/value model."""
    from trl_ext.testing import save_scalar_adapter

    return save_scalar_adapter(tiny_models.policy, tmp_path_factory.mktemp("reward_adapter") / "adapter")


def once_per_run(tmp_path_factory, worker_id: str, name: str, build):
    """``build(folder)``'s JSON-able result, computed once per test run: under pytest-xdist the first worker to ask
    builds it (the others wait on a file lock and read it back; the recipe of pytest-xdist's docs, "Making
    session-scoped fixtures execute only once"), so that a fixture two test modules on different workers use is not
    built twice. Without xdist (``-n 0``), simply ``build``."""
    import json

    from filelock import FileLock

    if worker_id == "master":
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent  # this run's folder, above each worker's own
    done = shared / f"{name}.json"
    with FileLock(str(done) + ".lock"):
        if not done.is_file():
            (shared / name).mkdir()
            done.write_text(json.dumps(build(shared / name)))
        return json.loads(done.read_text())


@pytest.fixture(scope="session")
def ddp_reference(tiny_models, tmp_path_factory, worker_id):
    """Per-rank results of tests/runtime/ddp_script.py under 2 CPU processes (DDP over gloo): reward, DPO, PPO and
    PPO resumed, with LoRA and the extensions on. The reference numbers of the DDP and the engine tests (on two
    workers, launched once: see `once_per_run`; the tiny models are the same on every worker)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]

    def launch(out):
        env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(root / "tests" / "runtime" / "ddp_script.py"), str(tiny_models.root), str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]

    return once_per_run(tmp_path_factory, worker_id, "ddp", launch)
