"""DeepSpeed ZeRO-2, ZeRO-3 and FSDP2 on CPU, two processes each, launched as users launch them
(`accelerate launch --config_file recipes/accelerate/cpu_{zero2,zero3,fsdp}.yaml`): reward (ranked data + label
smoothing), DPO (cDPO) and, under ZeRO-2/3, PPO (LoRA policy, adaptive KL, joint ptx) with a checkpoint and a resume;
under ZeRO-2 also GRPO with a reward function and PPO with a tool (GAE across the tool's results).

Each engine is one launch of engine_script.py. What proves that the engine really ran, with both ranks: every rank
reports world size 2, accelerate's distributed type and the engine's wrapper and optimizer classes; under ZeRO-3 and
FSDP each rank holds only part of the trainable values; and the logged numbers equal those of the same runs under
DDP (tests/runtime/ddp_script.py, whose global batch needs both ranks). Run alone with `python -m pytest -m engines`.
"""

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest
from launch_commands import accelerate_launch

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "engines" / "engine_script.py"
DS_RUNS = ["reward", "dpo", "ppo", "ppo_resumed"]
# engine -> (accelerate config, runs, accelerate's distributed type, wrapper class, optimizer class, ZeRO stage)
ENGINES = {
    "zero2": ("cpu_zero2.yaml", [*DS_RUNS, "ppo_reward_funcs", "ppo_tools"], "DEEPSPEED", "DeepSpeedEngine",
              "DeepSpeedZeroOptimizer", 2),
    "zero3": ("cpu_zero3.yaml", [*DS_RUNS, "ppo_recipe"], "DEEPSPEED", "DeepSpeedEngine",
              "DeepSpeedZeroOptimizer_Stage3", 3),
    "fsdp": ("cpu_fsdp.yaml", ["reward", "dpo"], "FSDP", "FSDP", "AdamW", None),  # PPO: refused under FSDP
}
SHARDED = {"zero3", "fsdp"}


def require_deepspeed():
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail('DeepSpeed is not installed; the engine tests need it: pip install "trl-ext[deepspeed]"')


def launch(config: str, args: list, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file recipes/accelerate/CONFIG ARGS...` (the first DeepSpeed launch on a machine
    compiles DeepSpeed's shared-memory op, a few minutes; hence the long timeout)."""
    cmd = [*accelerate_launch(config), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def launch_env(tiny_models, tool_models=None) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "TRL_EXT_TINY_DIR": str(tiny_models.root)}
    if tool_models is not None:  # the `ppo_tools` run's models (tests/conftest.py `tool_models`)
        env["TRL_EXT_TOOL_MODELS_DIR"] = str(tool_models)
    return env


def launch_engine(name: str, tiny_models, tool_models, out) -> tuple[str, list]:
    """(name, per-rank results) of one launch of engine_script.py under the engine's CPU config."""
    config, runs = ENGINES[name][:2]
    if ENGINES[name][2] == "DEEPSPEED":
        require_deepspeed()
    proc = launch(config, [SCRIPT, tiny_models.root, out, ",".join(runs)], launch_env(tiny_models, tool_models))
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    errors = {r["rank"]: {run: r[run]["error"] for run in runs if "error" in r.get(run, {})} for r in ranks}
    assert proc.returncode == 0 and len(ranks) == 2, (errors, proc.stderr[-4000:])
    return name, ranks


@pytest.fixture(scope="session")
def launched(tiny_models, tool_models, tmp_path_factory):
    """`launched(name)`: the engine's launch, run once per session whichever test asks first (a parametrized
    module-scoped fixture launches again whenever the test order leaves an engine and comes back to it)."""
    results: dict[str, tuple] = {}

    def get(name: str):
        if name not in results:
            try:
                results[name] = ("ok", launch_engine(name, tiny_models, tool_models, tmp_path_factory.mktemp(name)))
            except BaseException as e:  # a failed launch fails every test of that engine, without relaunching
                results[name] = ("failed", e)
        status, value = results[name]
        if status == "failed":
            raise value
        return value

    return get


@pytest.fixture(params=list(ENGINES))
def engine(request, launched):
    return launched(request.param)


def runs_of(engine):
    name, ranks = engine
    return [(run, [r[run] for r in ranks]) for run in ENGINES[name][1]]


def test_the_engine_ran_on_both_ranks(engine):
    name = engine[0]
    _, _, distributed_type, wrapper, optimizer, stage = ENGINES[name]
    for run, (a, b) in runs_of(engine):
        assert "error" not in a and "error" not in b, (run, a.get("error"), b.get("error"))
        for rank, r in enumerate((a, b)):
            assert (r["world_size"], r["rank"], r["distributed_type"]) == (2, rank, distributed_type), run
            assert r["wrapper"].startswith(wrapper) and r["optimizer"] == optimizer, (run, r["wrapper"], r["optimizer"])
            assert r["zero_stage"] == stage
        if name in SHARDED:  # each rank holds a part of the trainable values, together all of them
            assert a["local_trainable_numel"] < a["trainable_numel"], run
            assert a["local_trainable_numel"] + b["local_trainable_numel"] >= a["trainable_numel"], run
        else:
            assert a["local_trainable_numel"] == a["trainable_numel"], run


def test_ranks_end_with_identical_weights(engine):
    for run, (a, b) in runs_of(engine):
        assert a["checksum"] == b["checksum"], run
        assert a["trainable_numel"] == b["trainable_numel"]


def test_the_numbers_are_those_of_ddp(engine, ddp_reference):
    """Same seeds and global batch as the DDP runs: the engine changes where values live, not the numbers."""
    close = dict(rel=1e-5, abs=1e-6)
    # the KL is a mean of differences of float32 log-probs of magnitude 1-10 (rounding about 1e-6 each): the engines
    # reduce in another order, and with torch's default kernels (ATEN_CPU_CAPABILITY=default) the ZeRO-2 tools run's
    # KL moved by 1.9e-6 (-0.0617542 vs -0.0617523); its episodes and logged metrics stay identical
    close_kl = dict(rel=1e-5, abs=1e-5)
    ddp = ddp_reference[0]
    for run, (a, _) in runs_of(engine):
        if run in ("reward", "dpo"):
            assert len(a["losses"]) == 3
            assert a["losses"] == pytest.approx(ddp[run]["losses"], **close), run
        elif run == "ppo_recipe":
            continue  # the DDP launch has no recipe run to compare with
        elif run == "ppo_reward_funcs":  # reward functions, no reward model (a stand-in goes through DeepSpeed)
            assert a["reward_mean"] == pytest.approx(ddp[run]["reward_mean"], **close)
            # gradient accumulation 2 x 2 mini-batches: the engine steps once per mini-batch, as DDP does
            assert a["optimizer_steps"] == ddp[run]["optimizer_steps"] == 2 * 2 * 2, run
        elif run == "ppo_tools":  # the DDP launch's `tools` run: the same episodes, metrics and KL
            reference = ddp["ppo_ddp"]["tools"]
            assert a["episodes"] == reference["episodes"] and a["logged"] == reference["logged"]
            assert a["logged"][0]["tools/call_frequency"] > 0
            # critic_learning_rate: the engine keeps the value model's groups at their own rate (update 2's
            # episodes above depend on the values it trained)
            assert a["learning_rates"] == reference["learning_rates"] == [1e-3, 3e-3]
            for key in ("kl", "kl_coef"):
                assert a[key] == pytest.approx(reference[key], **close_kl), (run, key)
        else:
            for key in ("kl", "kl_coef", "ptx"):
                assert a[key] == pytest.approx(ddp[run][key], **close_kl), (run, key)
            assert a["final_kl_coef"] == pytest.approx(ddp[run]["final_kl_coef"], **close_kl)
    if "dpo" in dict(runs_of(engine)):
        assert dict(runs_of(engine))["dpo"][0]["loss_types"] == ["robust"]  # cDPO through TRL's robust loss


@pytest.mark.parametrize("name", ["zero2", "zero3"])  # PPO is refused under FSDP
def test_ppo_checkpoint_is_complete_and_resume_reproduces_the_run(launched, name):
    results = dict(runs_of(launched(name)))
    for rank, (full, resumed) in enumerate(zip(results["ppo"], results["ppo_resumed"])):
        files = set(full["checkpoint_files"])
        assert {"adapter_model.safetensors", "value_model", "scheduler.pt", "trainer_state.json", "latest",
                "rng_state_0.pth", "rng_state_1.pth", "trl_ext_ppo_state_0.pt", "trl_ext_ppo_state_1.pt"} <= files
        assert any(f.startswith("global_step") for f in files)  # DeepSpeed's own (sharded) optimizer state
        # whole tensors in the saved adapter and value model (not ZeRO-3 shards): together all trainable values
        assert full["saved_adapter_numel"] + full["saved_value_numel"] == full["trainable_numel"]
        # a fresh trainer resumed from checkpoint-2 ends where the uninterrupted run ended
        assert resumed["checksum"] == full["checksum"], rank
        assert resumed["kl"] == pytest.approx(full["kl"], abs=1e-6)
        assert resumed["final_kl_coef"] == pytest.approx(full["final_kl_coef"], rel=1e-9)


def test_ppo_recipe_with_a_full_policy_under_zero3(launched):
    """TRL copies a full policy for its reference, which ZeRO-3 refuses (`create_reference_model`); the recipe
    pipeline loads the reference from the policy's checkpoint instead. Policy and reference start equal: KL 0."""
    a, b = dict(runs_of(launched("zero3")))["ppo_recipe"]
    assert a["ref_model"] != "NoneType" and a["episodes"] == [16, 32]  # 2 ranks x 8 prompts per update
    assert abs(a["kl"][0]) < 1e-6 and a["kl"][1] > 1e-3
    assert a["kl"] == b["kl"] and a["scores"] == b["scores"]
    # max_grad_norm 1.0 (HF's default) on the command line: the engine clips at it and its global pre-clip norm is logged
    assert a["gradient_clipping"] == 1.0 and len(a["grad_norm"]) == 2 and all(n > 0 for n in a["grad_norm"])
    assert a["grad_norm"] == b["grad_norm"]
