"""benchmarks/critic_luck.py, every variant for one tiny update on the quiz with a die on screen, both horizons, and
the merge of cells run apart.

What must hold: each variant trains the estimator it names, the GAE rows with the value model's settings they name;
a row holds one update's learning-curve point, a held-out score and, with a value model, the critic's explained
variance per turn; merging files of cells gives one study with the seeds in order, per horizon."""

from __future__ import annotations

import json

import pytest
from benchmark_scripts import run_study, study_fixtures

TINY = ["--updates", "1", "--pretrain-updates", "1", "--heldout", "4", "--figures", "", "--set",
        "per_device_train_batch_size=4", "local_rollout_forward_batch_size=4", "num_ppo_epochs=1"]


bench, sft_work = study_fixtures("critic_luck")


def run(bench, sft_work, out, *extra):
    return run_study(bench, sft_work, out, *TINY, *extra)


@pytest.fixture(scope="module")
def every_variant(bench, sft_work, tmp_path_factory):
    """Every variant, seed 1, luck 0.5, 4 rounds, one update each, in one run of the script."""
    out = tmp_path_factory.mktemp("variants") / "result.json"
    return out, run(bench, sft_work, out, "--only", *bench.VARIANTS, "--seed-list", "1", "--luck", "0.5")


@pytest.mark.parametrize("name", ["GAE, pretrained value model", "GAE, own value pretraining, charged",
                                  "GAE, critic settings", "GAE, critic warm-up 10",
                                  "GAE, TRL's settings", "GAE, TRL's settings, lam 0.8", "RLOO k=4",
                                  "GRPO k=4 (KL in loss)", "RLOO k=4, per turn", "GRPO k=4 (KL in loss), per turn",
                                  "GRPO k=4 (KL in loss), per turn, gamma 0.5",
                                  "GRPO k=4 (KL in loss), per turn, gamma 0"])
def test_variant_runs_one_update(bench, sft_work, every_variant, name):
    variant = dict(bench.VARIANTS[name])
    how = variant.pop("value_pretraining", None)
    pretraining = 1 if how else 0  # --pretrain-updates 1
    (cell,) = every_variant[1]["results"]["runs"][bench.cell_key(name, 0.5, 4, episodes=(1 + pretraining) * 4)]["seeds"]
    settings = cell["settings"]
    assert cell["seed"] == 1 and cell["luck"] == 0.5 and cell["value_pretraining"] == pretraining
    # the seed's own pretraining is charged: its CPU seconds inside the run's; a shared one's are not
    assert (cell["pretraining_cpu_seconds"] > 0) == (how == "own")
    assert cell["cpu_seconds"] > cell["pretraining_cpu_seconds"]
    if how == "own":  # its value model pretrained from seed 1 + PRETRAIN_SEED, apart from the shared one
        assert list(sft_work.glob(f"value-luck0.5-seed{1 + bench.PRETRAIN_SEED}-r4-1-*/config.json"))
    assert {k: settings[k] for k in variant} == variant  # the estimator and the value model's settings it names
    assert (settings["response_length"], settings["max_tool_calling_iterations"]) == (224, 4)
    assert len(cell["rounds_right"]) == 1 and 0.0 <= cell["rounds_right"][0] <= 1.0
    assert 0.0 <= cell["end"]["reward"] <= 1.0
    if name == "GAE, TRL's settings":  # the critic's health, per turn the 2-step SFT model played (with
        assert len(cell["explained_var"]) == 1 and cell["health"]  # critic_lam 1 its returns may have no spread:
        assert sorted(cell["health"], key=int) == [str(k) for k in range(1, len(cell["health"]) + 1)]  # none)
        assert len(cell["credit_gain"]) <= 1  # its gain over per-turn RLOO's: none while the tiny SFT earns nothing
    elif variant["advantage_estimator"] != "gae":
        assert not cell["explained_var"] and not cell["health"] and not cell["credit_gain"]
    assert settings.get("turn_credit", "episode") == ("turn" if "per turn" in name else "episode")


def test_eight_rounds_and_the_merge(bench, sft_work, every_variant, tmp_path):
    """8 rounds (their response length and rounds), two seeds run apart; merged with the 4-round file: one study,
    each cell's seeds in order, both horizons' starts kept."""
    name = "GRPO k=4 (KL in loss)"
    for seed in (1, 0):
        run(bench, sft_work, tmp_path / f"s{seed}.json", "--only", name, "--seed-list", str(seed), "--luck", "0",
            "--rounds", "8")
    runs = json.loads((tmp_path / "s0.json").read_text())["results"]["runs"]
    (cell,) = runs[bench.cell_key(name, 0, 8, episodes=4)]["seeds"]
    assert (cell["settings"]["response_length"], cell["settings"]["max_tool_calling_iterations"]) == (400, 8)
    merged = tmp_path / "merged.json"
    assert bench.main(["--merge", str(tmp_path / "s1.json"), str(tmp_path / "s0.json"), str(every_variant[0]),
                       "--out", str(merged), "--figures", str(tmp_path)]) == 0
    result = json.loads(merged.read_text())["results"]
    assert [s["seed"] for s in result["runs"][bench.cell_key(name, 0, 8, episodes=4)]["seeds"]] == [0, 1]
    assert sorted(result["sft"]) == ["4", "8"] and (tmp_path / "critic_luck.png").is_file()
    assert bench.first_reached([0.5, 0.95, 1.0], 32) == 64 and bench.first_reached([0.5], 32) is None


def test_the_control_runs_with_luck_not_shown(bench, sft_work, tmp_path):
    """--luck-not-shown: its own cell, the run told so, its dice never on screen (dice_quiz_env's control)."""
    name = "GRPO k=4 (KL in loss)"
    result = run(bench, sft_work, tmp_path / "hidden.json", "--only", name, "--seed-list", "0", "--luck", "1",
                 "--luck-not-shown")
    (cell,) = result["results"]["runs"][bench.cell_key(name, 1, 4, shown=False, episodes=4)]["seeds"]
    assert bench.cell_key(name, 1, 4, shown=False) == f"{name} | luck 1 not shown | 4 rounds"
    assert bench.cell_key(name, 1, 4, shown=False, episodes=4) == f"{name} | luck 1 not shown | 4 rounds, 4 episodes"
    assert cell["luck_shown"] is False and result["meta"]["settings"]["luck_shown"] is False
    assert cell["environment_class"] == "dice_quiz_env.DiceQuizEnv"
    assert cell["cpu_seconds"] > 0 and cell["peak_rss_mib"] > 100 and len(cell["rounds_right"]) == 1


def test_the_jackpot_quiz_runs_as_its_own_cell(bench, sft_work, tmp_path):
    """--environment jackpot (jackpot_quiz_env.py): its own cell, the run told so."""
    name = "RLOO k=4, per turn"
    result = run(bench, sft_work, tmp_path / "jackpot.json", "--only", name, "--seed-list", "0", "--luck", "1",
                 "--environment", "jackpot")
    key = bench.cell_key(name, 1, 4, environment="jackpot", episodes=4)
    assert key == f"{name} | luck 1, jackpot quiz | 4 rounds, 4 episodes" and list(result["results"]["runs"]) == [key]
    (cell,) = result["results"]["runs"][key]["seeds"]
    assert cell["environment_class"] == "jackpot_quiz_env.JackpotQuizEnv" and cell["luck_shown"]
    assert len(cell["rounds_right"]) == 1
    assert result["meta"]["settings"]["environment"] == "jackpot"


def test_compare_pairs_seeds_against_grpo_and_charges_pretraining(bench, capsys):
    """Each arm against episode-level GRPO of the same luck, horizon and screen, seed by seed (a seed the baseline
    lacks is left out); the episodes generated count value pretraining's updates."""
    def cell(seed, end, pretraining=0, curve=(0.5, 0.7), peak=None):
        return {"seed": seed, "end": {"reward": end}, "rounds_right": list(curve), "value_pretraining": pretraining,
                "settings": {"per_device_train_batch_size": 32}, "cpu_seconds": 10.0,
                **({} if peak is None else {"peak_rss_mib": peak})}

    grpo, gae = "GRPO k=4 (KL in loss)", "GAE, pretrained value model"
    runs = {bench.cell_key(grpo, 1, 4): {"seeds": [cell(0, 0.7), cell(1, 0.8), cell(2, 0.6)]},
            bench.cell_key(gae, 1, 4): {"seeds": [cell(0, 0.8, 10, (0.6, 0.8), 900.4), cell(1, 0.8, 10, peak=950.6),
                                                  cell(2, 0.9, 10, (0.7, 0.9)), cell(3, 0.1, 10)]},
            bench.cell_key(gae, 1, 4, shown=False): {"seeds": [cell(0, 0.9, 10), cell(1, 0.9, 10)]},
            bench.cell_key(gae, 1, 4, episodes=1920): {"seeds": [cell(0, 0.9, 58), cell(1, 0.9, 58)]}}
    assert bench.episodes_generated(runs[bench.cell_key(gae, 1, 4)]["seeds"][0]) == (2 + 10) * 32
    bench.compare(runs)
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in capsys.readouterr().out.splitlines()
             if "luck" in line]  # the key's three parts, then the columns
    rows = {tuple(c[:2]): c[3:] for c in cells if c[2] == "4 rounds"}
    # held-out differences 0.1, 0.0, 0.3: mean 0.133, sd 0.153, t(2) 4.303: half-width 0.380; the curves' means
    # 0.7 / 0.6 / 0.8 / 0.6 (mean 0.675; seed 3 unpaired) against 0.6: differences 0.1, 0.0, 0.2, half-width 0.248
    assert rows[gae, "luck 1"] == ["384", "10 (4 runs)", "900", "0.675", "+0.133 (-0.246 to +0.513), 3 seeds", "0",
                                   "+0.100 (-0.148 to +0.348)"]
    assert rows[grpo, "luck 1"][2] == "-" and rows[grpo, "luck 1"][4:] == ["-", "-", "-"]  # no peak recorded
    assert rows[gae, "luck 1 not shown"][4:] == ["-", "-", "-"]  # no baseline with its dice off the screen
    (other_budget,) = [c for c in cells if c[2] == "4 rounds, 1920 episodes"]
    assert other_budget[3] == "1920" and other_budget[7:] == ["-", "-", "-"]  # no GRPO at 1,920: not paired
    assert len(cells) == 4


def test_shipped_recipe_is_the_benchmarks_equal_cost_gae_row(bench, sft_work, tmp_path):
    """gae_dice_no_pretraining.yaml is the row "GAE, TRL's settings, lam 0.8": its settings, the benchmark's 960
    episodes, and its value model the SFT model with a fresh head (nothing pretrained before the budget)."""
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.loader import default_value_model_path

    recipe = resolve_recipe(bench.TASK / "gae_dice_no_pretraining.yaml", [
        "--model_name_or_path", str(sft_work / "sft_dice"), "--output_dir", str(tmp_path / "gae"),
        "--dataset_name", str(sft_work / "data" / "dice_train4.jsonl")])
    keys = {**bench.RL_SETTINGS, **bench.QUIZ_RL, **bench.VARIANTS["GAE, TRL's settings, lam 0.8"],
            "total_episodes": bench.EPISODES}
    assert {key: getattr(recipe.training_args, key) for key in keys} == keys
    assert (recipe.training_args.critic_learning_rate, recipe.training_args.critic_lam) == (None, None)
    assert recipe.environment_factory.luck == 1.0 and recipe.pipeline.value_model_path is None
    assert default_value_model_path(recipe.pipeline, recipe.training_args, recipe.model_args) == str(
        sft_work / "sft_dice")


def test_shipped_recipe_is_the_benchmarks_per_turn_grpo_row(bench, sft_work, tmp_path):
    """grpo_turn_dice.yaml is the row "GRPO k=4 (KL in loss), per turn, gamma 0": its settings, the benchmark's 960
    episodes, no value model; one update from it as shipped."""
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run as run_recipe

    data = ["--model_name_or_path", str(sft_work / "sft_dice"), "--output_dir", str(tmp_path / "grpo"),
            "--dataset_name", str(sft_work / "data" / "dice_train4.jsonl")]
    recipe = resolve_recipe(bench.TASK / "grpo_turn_dice.yaml", data)
    keys = {**bench.RL_SETTINGS, **bench.QUIZ_RL, **bench.VARIANTS["GRPO k=4 (KL in loss), per turn, gamma 0"],
            "total_episodes": bench.EPISODES}
    assert {key: getattr(recipe.training_args, key) for key in keys} == keys
    assert recipe.environment_factory.luck == 1.0 and not recipe.reward_funcs
    trainer = run_recipe(resolve_recipe(bench.TASK / "grpo_turn_dice.yaml", [
        *data, "--total_episodes", "8", "--per_device_train_batch_size", "8", "--local_rollout_forward_batch_size",
        "8", "--num_ppo_epochs", "1", "--disable_tqdm", "true"]))
    assert type(trainer.accelerator.unwrap_model(trainer.model).value_model).__name__ == "NoValueModel"
    assert (trainer.args.turn_credit, trainer.args.gamma) == ("turn", 0.0)
    (logged,) = [h for h in trainer.state.log_history if "objective/kl" in h]  # one update, no critic metrics
    assert not [k for k in logged if k.startswith("critic/")]


def test_shipped_recipes_are_the_benchmarks_pretrained_gae_row(bench, sft_work, tmp_path):
    """value_dice.yaml is the benchmark's value pretraining (the GAE row's settings, critic_warmup for every update)
    and leaves its value model in value_model/; gae_dice.yaml is the row itself, starting from that value model
    (its trained head kept: its first values are the pretrained model's, not a fresh head's zeros)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run as run_recipe

    data = ["--model_name_or_path", str(sft_work / "sft_dice"), "--dataset_name",
            str(sft_work / "data" / "dice_train4.jsonl")]
    tiny = ["--per_device_train_batch_size", "4", "--local_rollout_forward_batch_size", "4", "--num_ppo_epochs", "1",
            "--disable_tqdm", "true"]
    variant = dict(bench.VARIANTS["GAE, pretrained value model"])
    assert variant.pop("value_pretraining")
    pretraining = bench.PRETRAIN_UPDATES
    expected = {**bench.RL_SETTINGS, **bench.QUIZ_RL, **variant}
    for name, extra in (("value_dice", {"critic_warmup": pretraining, "seed": bench.PRETRAIN_SEED}),
                        ("gae_dice", {})):
        recipe = resolve_recipe(bench.TASK / f"{name}.yaml", [*data, "--output_dir", str(tmp_path / name),
                                                               "--value_model_path", str(sft_work / "sft_dice")])
        assert recipe.environment_factory.luck == 1.0 and not recipe.reward_funcs
        updates = pretraining if name == "value_dice" else bench.UPDATES[0]
        keys = {**expected, **extra, "total_episodes": updates * bench.RL_SETTINGS["per_device_train_batch_size"]}
        assert {key: getattr(recipe.training_args, key) for key in keys} == keys, name
    pretrain = run_recipe(resolve_recipe(bench.TASK / "value_dice.yaml", [
        *data, "--output_dir", str(tmp_path / "value"), "--total_episodes", "4", *tiny]))
    assert [h["critic/warmup"] for h in pretrain.state.log_history if "critic/warmup" in h] == [1.0]
    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "value" / "value_model")
    head = pretrain.accelerator.unwrap_model(pretrain.model).value_model.score.weight
    assert torch.equal(saved.score.weight, head) and head.abs().sum() > 0
    trainer = run_recipe(resolve_recipe(bench.TASK / "gae_dice.yaml", [
        *data, "--value_model_path", str(tmp_path / "value" / "value_model"), "--output_dir", str(tmp_path / "gae"),
        "--total_episodes", "4", *tiny]))
    assert "critic/warmup" not in trainer.state.log_history[0]
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "value" / "value_model")
    assert not torch.equal(trainer.accelerator.unwrap_model(trainer.model).value_model.score.weight,
                           torch.zeros_like(loaded.score.weight))
