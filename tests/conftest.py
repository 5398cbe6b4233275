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

# Tiny models: one thread is as fast as two and keeps the machine responsive. TRL_EXT_TEST_THREADS=2 runs each test
# on two (the suite must pass either way: no assertion may rest on the order of a float reduction).
torch.set_num_threads(int(os.environ.get("TRL_EXT_TEST_THREADS", "1")))


# The slowest test modules, longest first (seconds on the 2 CPU cores with 2 workers, from `pytest --durations=0`,
# November 26, 2026, TRL 1.16). They run before the others: pytest-xdist hands out whole modules (`--dist loadfile`)
# in collection order (`--no-loadscope-reorder`, pyproject.toml), so the long ones start first and the many short
# ones fill in until both workers finish together. (xdist's own order, by number of tests, left single long tests
# such as the gold pipeline to the end, with one worker idle meanwhile.) A module missing here runs in collection
# order after them; keep the list to the measured long ones (tests/test_package.py checks that each exists).
LONGEST_FIRST = [
    "tests/engines/test_engines.py",  # 3 DeepSpeed/FSDP launches (the first on a machine compiles an op, ~2 min)
    "tests/recipes/test_recipe_runs.py",  # demo recipes learning, three 2-process CLI launches
    "tests/recipes/test_gold_pipeline.py",  # SFT -> reward -> PPO on the gold task: one test
    "tests/benchmarks/test_gold_benchmarks.py",  # the four gold studies' scripts, each its own tiny pipeline
    "tests/engines/test_engine_cli.py",  # 2 ZeRO-2 CLI launches
    "tests/benchmarks/test_engine_matrix_benchmark.py",  # one 2-process DDP launch of engine_script
    "tests/recipes/test_every_key.py",
    "tests/recipes/test_real_model_recipes.py",  # each real-model recipe: check and two updates at tiny size
    "tests/test_gpu_ppo_benchmark.py",
    "tests/recipes/test_sft_recipe.py",
    "tests/recipes/test_cli_interruption.py",
    "tests/ppo/test_ppo_ddp.py",
    "tests/runtime/test_ddp.py",
    "tests/ppo/test_ppo_reliability.py",
    "tests/recipes/test_tool_recipes.py",  # fits a tiny model to call a tool, then trl-ext train with tools
    "tests/ppo/test_tools_trainer.py",  # the same, then PPO with tools and environments
    "tests/models/test_dtypes.py",
    "tests/export/test_export.py",
    "tests/preference/test_dpo_trainer.py",
    "tests/ppo/test_ppo_shared_base.py",
    "tests/recipes/test_console.py",
]


def pytest_collection_modifyitems(config, items):
    """Modules of LONGEST_FIRST first, in its order; the rest after them as collected (a stable sort: each module's
    tests stay together and in their order)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}

    def key(item):
        try:
            return rank.get(item.path.relative_to(config.rootpath).as_posix(), len(rank))
        except ValueError:  # outside the repository
            return len(rank)

    items.sort(key=key)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of a tiny tokenizer, causal LM and scalar-headed model (see `trl_ext.testing`)."""
    from trl_ext.testing import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def tiny_env(tiny_models):
    """tiny:// points at the session's tiny models (in this process and in subprocesses) and the working directory
    is the repository's; yields the environment of a subprocess that imports this checkout."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    mp = pytest.MonkeyPatch()
    mp.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    mp.chdir(root)
    yield {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    mp.undo()


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
def tool_models(tmp_path_factory, worker_id):
    """The folder of the tool tests' models (`trl_ext.testing.tools.save_tool_models`: a tiny Llama fitted to call
    `add`, the same untrained, a value model, the tokenizer), built once per run (~10 s): the tool tests and the DDP
    launch use the same."""
    from pathlib import Path

    from trl_ext.testing.tools import save_tool_models

    return Path(once_per_run(tmp_path_factory, worker_id, "tool_models", lambda root: str(save_tool_models(root))))


@pytest.fixture(scope="session")
def ppo_run(tiny_models, tmp_path_factory, worker_id):
    """A real trl-ext PPO run's output folder, trained once per test run (`once_per_run`; a few seconds): the "lora"
    scenario of tests/ppo_reference.py (LoRA policy, separate value model, 3 updates of 4 episodes) with the
    pretraining mix on and a checkpoint after every update. Its policy's base is a copy of the tiny policy in a
    temporary folder, deleted after training, as a script that trains from a temporary folder leaves its run.

    A dict: ``run`` (the output_dir: ``checkpoint-1`` to ``checkpoint-3``), ``base`` (the deleted base's path) and
    ``updates`` (each update's ``step`` and ``objective/scores``, as the trainer logged them)."""
    import dataclasses
    import shutil
    from pathlib import Path

    def train(root):
        import trl_ext
        from ppo_helpers import left_tokenizer, ptx_dataset
        from ppo_reference import run_scenario, scenario_data

        base = root / "base"
        shutil.copytree(tiny_models.policy, base)
        tok = left_tokenizer(tiny_models)
        _, logs = run_scenario(trl_ext.PPOTrainer, trl_ext.PPOConfig, "lora",
                               dataclasses.replace(tiny_models, policy=base), tok, scenario_data(tok), root / "ppo",
                               overrides=dict(save_steps=1, ptx_coef=0.5, ptx_max_length=16, num_sample_generations=0),
                               ptx_dataset=ptx_dataset())
        shutil.rmtree(base)
        updates = [{"step": e["step"], "objective/scores": e["objective/scores"]} for e in logs]
        return {"run": str(root / "ppo"), "base": str(base), "updates": updates}

    run = once_per_run(tmp_path_factory, worker_id, "ppo_run", train)
    return {**run, "run": Path(run["run"]), "base": Path(run["base"])}


@pytest.fixture(scope="session")
def ddp_reference(tiny_models, reward_adapter, tool_models, tmp_path_factory, worker_id):
    """Per-rank results of tests/runtime/ddp_script.py under 2 CPU processes (DDP over gloo): reward, DPO, PPO and
    PPO resumed, with LoRA and the extensions on; then, in the same launch, the PPO runs of test_ppo_ddp.py (key
    "ppo_ddp"; its tools run uses `tool_models`). The reference numbers of the DDP and the engine tests (on two
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
               str(root / "tests" / "runtime" / "ddp_script.py"), str(tiny_models.root), str(out), str(reward_adapter),
               str(tool_models)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return [json.loads((out / f"rank{i}.json").read_text()) for i in range(2)]

    return once_per_run(tmp_path_factory, worker_id, "ddp", launch)
