"""Trained runs for the export/sample/score tests (a few steps each, tiny models), built once per session."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "recipes" / "demo"


def train(recipe, *overrides):
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    return run(resolve_recipe(recipe, [str(o) for o in overrides]))


@pytest.fixture(scope="session")
def run_root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def reward_centred_run(tiny_env, run_root):
    """(output_dir, trainer) of the reward demo, 3 steps, centred after training."""
    out = run_root / "reward"
    return out, train(DEMO / "reward.yaml", "--output_dir", out, "--max_steps", 3,
                      "--center_rewards_after_training", "true")


@pytest.fixture(scope="session")
def reward_lora_run(tiny_env, run_root):
    """(output_dir, trainer) of the LoRA reward demo (adapter + head on the tiny policy's base), 3 steps."""
    out = run_root / "reward_lora"
    return out, train(DEMO / "reward_lora.yaml", "--output_dir", out, "--max_steps", 3)


@pytest.fixture(scope="session")
def ppo_shared_run(reward_lora_run, run_root):
    """(output_dir, trainer) of the shared-base PPO demo, one update."""
    out = run_root / "ppo_shared"
    return out, train(DEMO / "ppo_shared.yaml", "--output_dir", out, "--reward_model_path", reward_lora_run[0],
                      "--total_episodes", 8)


@pytest.fixture(scope="session")
def runs(reward_centred_run, reward_lora_run, ppo_shared_run, run_root):
    """name -> (run or checkpoint directory, trainer), every run type."""
    from trl_ext.testing import tiny_corpus

    out = {"reward_centred": reward_centred_run, "reward_lora": reward_lora_run}
    sft_data = run_root / "sft.jsonl"
    sft_data.write_text("".join(json.dumps({"text": line}) + "\n" for line in tiny_corpus(32)))
    sft_recipe = run_root / "sft.yaml"
    sft_recipe.write_text(
        f"trainer: sft\nmodel_name_or_path: tiny://policy\ndataset_name: {sft_data}\n"
        f"output_dir: {run_root / 'sft4'}\n"
        "load_in_4bit: true\nuse_peft: true\nlora_r: 8\nlora_alpha: 32\nlora_target_modules: all-linear\n"
        "max_steps: 3\nper_device_train_batch_size: 8\nlearning_rate: 1.0e-2\nmax_length: 32\n"
        "save_strategy: 'no'\nuse_cpu: true\nreport_to: none\nseed: 0\n")
    out["sft_4bit"] = (run_root / "sft4", train(sft_recipe))
    out["dpo_8bit"] = (run_root / "dpo8", train(DEMO / "dpo.yaml", "--output_dir", run_root / "dpo8", "--max_steps",
                                                3, "--load_in_8bit", "true", "--use_peft", "true",
                                                "--lora_target_modules", "all-linear", "--learning_rate", "1e-2"))
    trainer = train(DEMO / "ppo.yaml", "--output_dir", run_root / "ppo", "--reward_model_path",
                    reward_centred_run[0], "--total_episodes", 8, "--save_strategy", "steps", "--save_steps", 1)
    out["ppo_checkpoint"] = (run_root / "ppo" / "checkpoint-1", trainer)
    trainer = train(DEMO / "ppo.yaml", "--output_dir", run_root / "ppo_lora", "--reward_model_path",
                    reward_centred_run[0], "--total_episodes", 8, "--save_strategy", "steps", "--save_steps", 1,
                    "--use_peft", "true", "--lora_target_modules", "q_proj", "v_proj", "--value_use_peft", "true",
                    "--value_lora_target_modules", "q_proj", "v_proj", "--learning_rate", "1e-2")
    out["ppo_lora_checkpoint"] = (run_root / "ppo_lora" / "checkpoint-1", trainer)
    out["ppo_shared"] = ppo_shared_run
    return out
