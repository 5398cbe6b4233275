"""One rule for relative paths in a recipe (docs/recipes.md, "Paths"): the recipe's folder first, then the current
directory, for data, models and reward-function files; an error names both places and, for a path that a shipped
script or recipe makes, the command that makes it. `check` says which Hub names it could not check.

In process, no model loads (tiny:// names and `check`)."""

import shutil
from pathlib import Path

import pytest
import yaml

from trl_ext.cli import main
from trl_ext.errors import UserInputError
from trl_ext.recipe_loader import resolve_recipe

ROOT = Path(__file__).resolve().parents[2]
PAIRS = ROOT / "recipes" / "demo" / "data" / "preferences.jsonl"
PROMPTS = ROOT / "recipes" / "demo" / "data" / "prompts.jsonl"
REWARD_FILE = "def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"


@pytest.fixture
def places(tmp_path, monkeypatch):
    """A recipe folder and another current directory."""
    recipe_dir, cwd = tmp_path / "recipe", tmp_path / "cwd"
    (recipe_dir / "data").mkdir(parents=True)
    (cwd / "data").mkdir(parents=True)
    monkeypatch.chdir(cwd)
    return recipe_dir, cwd


def recipe(recipe_dir, **keys):
    base = dict(trainer="reward", model_name_or_path="tiny://reward", output_dir="out", use_cpu=True,
                report_to="none")
    path = recipe_dir / "recipe.yaml"
    path.write_text(yaml.safe_dump({**base, **keys}))
    return path


def test_data_in_the_recipe_folder_wins_and_becomes_absolute(places):
    recipe_dir, cwd = places
    shutil.copy(PAIRS, recipe_dir / "data" / "pairs.jsonl")
    shutil.copy(PAIRS, cwd / "data" / "pairs.jsonl")  # the same name in both places: the recipe's folder first
    resolved = resolve_recipe(recipe(recipe_dir, dataset_name="data/pairs.jsonl"))
    assert resolved.script_args.dataset_name == str(recipe_dir / "data" / "pairs.jsonl")
    assert yaml.safe_load(resolved.to_yaml())["dataset_name"] == str(recipe_dir / "data" / "pairs.jsonl")
    assert resolved.training_args.output_dir == "out"  # output_dir: where the run writes, relative to the cwd


def test_data_only_in_the_current_directory_is_kept_as_written(places):
    recipe_dir, cwd = places
    shutil.copy(PAIRS, cwd / "data" / "pairs.jsonl")
    resolved = resolve_recipe(recipe(recipe_dir, dataset_name="data/pairs.jsonl"))
    assert resolved.script_args.dataset_name == "data/pairs.jsonl" and Path("data/pairs.jsonl").is_file()


def test_models_follow_the_same_rule(places, tiny_models):
    recipe_dir, _ = places
    shutil.copytree(tiny_models.reward, recipe_dir / "models" / "reward")
    shutil.copy(PAIRS, recipe_dir / "data" / "pairs.jsonl")
    resolved = resolve_recipe(recipe(recipe_dir, model_name_or_path="models/reward", dataset_name="data/pairs.jsonl"))
    assert resolved.model_args.model_name_or_path == str(recipe_dir / "models" / "reward")


@pytest.mark.parametrize("where", ["recipe", "cwd"])
def test_reward_function_files_follow_the_same_rule(places, where):
    recipe_dir, cwd = places
    (recipe_dir if where == "recipe" else cwd).joinpath("my_rewards.py").write_text(REWARD_FILE)
    resolved = resolve_recipe(recipe(recipe_dir, trainer="ppo", model_name_or_path="tiny://policy",
                                     dataset_name=str(PROMPTS), reward_funcs=["my_rewards.py:length_reward"]))
    assert [f(completions=["ab", "abcd"]) for f in resolved.reward_funcs] == [[2.0, 4.0]]
    folder = recipe_dir if where == "recipe" else cwd
    assert resolved.explicit["reward_funcs"] == [f"{(folder / 'my_rewards.py').resolve()}:length_reward"]


def test_a_path_found_nowhere_names_both_places(places):
    recipe_dir, cwd = places
    with pytest.raises(UserInputError) as info:
        resolve_recipe(recipe(recipe_dir, dataset_name="data/missing.jsonl"))
    msg = str(info.value)
    assert msg.startswith("recipe: key 'dataset_name': local path 'data/missing.jsonl' does not exist")
    assert f"'{recipe_dir / 'data' / 'missing.jsonl'}' (the recipe's folder)" in msg
    assert "'data/missing.jsonl' (the current directory)" in msg
    with pytest.raises(UserInputError) as info:
        resolve_recipe(recipe(recipe_dir, trainer="ppo", model_name_or_path="tiny://policy", dataset_name=str(PROMPTS),
                              reward_funcs=["gone.py:f"]))
    assert f"file 'gone.py' does not exist (looked in '{recipe_dir / 'gone.py'}' (the recipe's folder) and " \
           "'gone.py' (the current directory))" in str(info.value)


def test_command_line_paths_are_the_shells(places):
    recipe_dir, _ = places
    shutil.copy(PAIRS, recipe_dir / "data" / "pairs.jsonl")  # in the recipe's folder only
    path = recipe(recipe_dir, dataset_name=str(PAIRS))
    with pytest.raises(UserInputError, match="'data/pairs.jsonl' does not exist"):
        resolve_recipe(path, ["--dataset_name", "data/pairs.jsonl"])


@pytest.mark.parametrize("name, key, missing, maker", [
    ("qwen2.5-0.5b/grpo_gsm8k.yaml", "dataset_name", "outputs/qwen2.5-0.5b/gsm8k",
     "python {root}/recipes/qwen2.5-0.5b/make_gsm8k.py"),
    ("verifiable/sft.yaml", "model_name_or_path", "outputs/verifiable/base",
     "python {root}/recipes/verifiable/make_data.py"),
    ("verifiable/grpo.yaml", "model_name_or_path", "outputs/verifiable/sft",
     "trl-ext train {root}/recipes/verifiable/sft.yaml"),
    ("gold/dpo.yaml", "dataset_name", "outputs/gold/data/pairs", "python {root}/recipes/gold/make_pairs.py"),
    ("demo/ppo.yaml", "reward_model_path", "outputs/demo/reward", "trl-ext train {root}/recipes/demo/reward.yaml"),
])
def test_a_missing_path_names_what_makes_it(tmp_path, monkeypatch, name, key, missing, maker):
    monkeypatch.chdir(tmp_path)  # nothing made here
    shutil.copytree(ROOT / "recipes" / "demo" / "data", tmp_path / "recipes" / "demo" / "data")
    overrides = ["--model_name_or_path", "tiny://policy"] if key != "model_name_or_path" else []
    if key != "dataset_name" and name.startswith("gold"):
        overrides += ["--dataset_name", str(PAIRS)]
    with pytest.raises(UserInputError) as info:
        resolve_recipe(ROOT / "recipes" / name, overrides)
    msg = str(info.value)
    assert msg.startswith(f"recipe: key '{key}': local path '{missing}' does not exist"), msg
    assert msg.endswith(f"; it is made by `{maker.format(root=ROOT)}`"), msg


def test_check_says_which_hub_names_it_did_not_check(capsys, tmp_path):
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump(dict(trainer="dpo", model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct",
                                        dataset_name="trl-lib/ultrafeedback_binarized", output_dir=str(tmp_path / "o"),
                                        use_cpu=True, report_to="none")))
    assert main(["check", str(path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("# not checked:")]
    assert lines == [
        "# not checked: dataset 'trl-lib/ultrafeedback_binarized' is a Hub name (check works offline; train "
        "downloads it and checks it then)",
        "# not checked: model 'Qwen/Qwen2.5-0.5B-Instruct' is a Hub name (check works offline; train downloads it "
        "and checks it then)"]
    local = tmp_path / "local.yaml"
    local.write_text(yaml.safe_dump(dict(trainer="reward", model_name_or_path="tiny://reward",
                                         dataset_name=str(PAIRS), output_dir=str(tmp_path / "o2"), use_cpu=True,
                                         report_to="none")))
    assert main(["check", str(local)]) == 0
    assert "not checked" not in capsys.readouterr().out
