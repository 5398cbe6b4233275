"""benchmarks/turn_credit.py, every variant for one tiny update on the counting quiz, the merge of cells run apart,
and the shipped gae_quiz.yaml.

What must hold: each variant trains the estimator it names with the environment it names (per-turn rewards logged
exactly when the environment gives them), its row holds one update's learning-curve point (the share of rounds
right, the prize left out) and a held-out score; merging two files of cells gives one study with the seeds in order
and refuses files from another SFT start; gae_quiz.yaml resolves to the benchmark's GAE row and trains one update
on the per-turn rewards."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import run_study, study_fixtures

TINY = ["--updates", "1", "--figures", "", "--set", "per_device_train_batch_size=4",
        "local_rollout_forward_batch_size=4", "num_ppo_epochs=1"]


bench, sft_work = study_fixtures("turn_credit")


def run(bench, sft_work, out, *extra):
    return run_study(bench, sft_work, out, *TINY, *extra)


@pytest.mark.parametrize("name", ["GAE, per-turn rewards", "GAE, per-turn rewards, critic warm-up 3",
                                  "GAE, per-turn rewards, critic settings",
                                  "GAE, end reward only", "RLOO k=4", "GRPO k=4 (KL in loss)"])
def test_variant_runs_one_update(bench, sft_work, tmp_path, name):
    result = run(bench, sft_work, tmp_path / "result.json", "--only", name, "--seed-list", "1")
    variant = bench.VARIANTS[name]
    (cell,) = result["results"]["runs"][name]["seeds"]
    settings = cell["settings"]
    assert cell["seed"] == 1 and settings["advantage_estimator"] == variant["advantage_estimator"]
    assert (settings["response_length"], settings["max_tool_calling_iterations"]) == (224, 4)
    assert len(cell["reward"]) == len(cell["rounds_right"]) == 1 and 0.0 <= cell["rounds_right"][0] <= 1.0
    assert 0.0 <= cell["end"]["reward"] <= 1.0 and result["results"]["sft"]["finished"] >= 0.0
    # the value loss is logged only with a value model
    assert bool(cell["value_loss"]) == (variant["advantage_estimator"] == "gae")
    assert settings.get("critic_warmup", 0) == variant.get("critic_warmup", 0)
    assert all(settings[k] == v for k, v in variant.items() if k != "environment")  # e.g. the critic settings
    if variant["advantage_estimator"] == "gae":  # what the critic learned, per turn (this 2-step SFT model plays
        turns = sorted(cell["critic"], key=int)   # fewer than the 4 answers and the final message)
        assert turns == [str(k) for k in range(1, len(turns) + 1)] and len(turns) <= 5
        assert cell["critic"]["1"]["n"] == 64  # every one of the 64 quizzes played has a first turn
        assert all(v["rmse"] >= 0 and v["return_sd"] >= 0 for v in cell["critic"].values())
    else:
        assert cell["critic"] is None


def test_merge_joins_cells_in_seed_order_and_refuses_another_start(bench, sft_work, tmp_path):
    name = "GRPO k=4 (KL in loss)"
    for seed in (1, 0):
        run(bench, sft_work, tmp_path / f"s{seed}.json", "--only", name, "--seed-list", str(seed))
    merged = tmp_path / "merged.json"
    assert bench.main(["--merge", str(tmp_path / "s1.json"), str(tmp_path / "s0.json"), "--out", str(merged),
                       "--figures", ""]) == 0
    seeds = json.loads(merged.read_text())["results"]["runs"][name]["seeds"]
    assert [s["seed"] for s in seeds] == [0, 1]
    other = json.loads((tmp_path / "s0.json").read_text())
    other["results"]["sft"]["reward"] += 0.5
    (tmp_path / "other.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="another SFT start"):
        bench.main(["--merge", str(tmp_path / "s1.json"), str(tmp_path / "other.json"), "--out", str(merged)])


def test_shipped_gae_quiz_recipe_is_the_benchmarks_gae_row_and_trains_on_turn_rewards(bench, sft_work, tmp_path):
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run as run_recipe

    keys = ["--model_name_or_path", str(sft_work / "sft_quiz"), "--dataset_name",
            str(sft_work / "data" / "quiz_train.jsonl"), "--output_dir", str(tmp_path / "gae")]
    recipe = resolve_recipe(bench.TASK / "gae_quiz.yaml", keys)
    variant = dict(bench.VARIANTS["GAE, per-turn rewards"])
    assert recipe.environment_factory.__name__ == variant.pop("environment") and not recipe.reward_funcs
    expected = {**bench.RL_SETTINGS, **bench.QUIZ_RL, **variant,
                "total_episodes": bench.UPDATES[0] * bench.RL_SETTINGS["per_device_train_batch_size"]}
    assert {key: getattr(recipe.training_args, key) for key in expected} == expected
    trainer = run_recipe(resolve_recipe(bench.TASK / "gae_quiz.yaml", [
        *keys, "--total_episodes", "4", "--per_device_train_batch_size", "4", "--local_rollout_forward_batch_size",
        "4", "--num_ppo_epochs", "1", "--disable_tqdm", "true"]))
    (log,) = [h for h in trainer.state.log_history if "episodes/turn_reward_mean" in h]
    environments = trainer.multi_turn.toolbox.environments
    shares = [sum(e.right) / 4 for e in environments]
    assert log["episodes/turn_reward_mean"] == pytest.approx(sum(shares) / 4)  # the rounds' rewards, summed
    assert log["rewards/QuizTurnEnv/mean"] == pytest.approx(sum(e.prize for e in environments) / 4)  # the prize
