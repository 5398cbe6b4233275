"""Recipes with `reward_funcs` (trl_ext.recipe_loader.loader, trl_ext.rewards.resolve): what `trl-ext check` verifies before
any model loads (one line, exit 2), what the resolved recipe holds, and a short run on the tiny models."""

import json

import pytest
import yaml

from trl_ext.cli import main
from trl_ext.recipe_loader.loader import resolve_recipe

REWARDS_PY = '''
def says_happy(completions, **kwargs):
    return [float("happy" in c) for c in completions]

def matches_topic(completions, topic, **kwargs):
    return [float(t in c) for c, t in zip(completions, topic)]

def topic_length(completions, topic, **kwargs):  # a number the test knows: the mean over the 4 topics is 3.5
    return [float(len(t)) for t in topic]
'''


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch, tiny_models):
    """A recipe folder: prompts with a `topic` column, a rewards file next to the recipe."""
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    (tmp_path / "my_rewards.py").write_text(REWARDS_PY)
    rows = [{"prompt": f"tell me about the {t}", "topic": t} for t in ("cat", "dog", "bird", "fish")]
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


def keys(recipe_dir, **extra):
    out = dict(trainer="ppo", model_name_or_path="tiny://policy", dataset_name=str(recipe_dir / "prompts.jsonl"),
               output_dir=str(recipe_dir / "out"), reward_funcs=[
                   "my_rewards.py:says_happy",
                   {"name": "trl.rewards.get_soft_overlong_punishment",
                    "kwargs": {"max_completion_len": 4, "soft_punish_cache": 2}}],
               total_episodes=8, per_device_train_batch_size=4, num_mini_batches=1, num_ppo_epochs=1,
               response_length=4, num_sample_generations=0, use_cpu=True, report_to="none", save_strategy="no",
               logging_steps=1, seed=0)
    out.update(extra)
    return {k: v for k, v in out.items() if v is not None}


def write(recipe_dir, **extra):
    path = recipe_dir / "recipe.yaml"
    path.write_text(yaml.safe_dump(keys(recipe_dir, **extra), sort_keys=False))
    return path


def check(capsys, path, *overrides):
    rc = main(["check", str(path), *overrides])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()  # the last line: datasets may draw a progress bar before it
    assert not any("Traceback" in line for line in err)
    return rc, captured.out, err[-1] if err else ""


def test_check_resolves_reward_functions_without_a_reward_model(recipe_dir, capsys):
    path = write(recipe_dir)
    rc, out, err = check(capsys, path)
    assert rc == 0, err
    assert "# reward functions: says_happy, soft_overlong_punishment_reward" in out
    resolved = yaml.safe_load(out[out.index("trainer:"):])
    # the resolved recipe names the file by its absolute path (it runs again from the output directory)
    assert resolved["reward_funcs"][0] == f"{(recipe_dir / 'my_rewards.py').resolve()}:says_happy"
    assert resolved["reward_funcs"][1]["kwargs"] == {"max_completion_len": 4, "soft_punish_cache": 2}
    assert "reward_model_path" not in resolved

    recipe = resolve_recipe(path, for_check=True)
    assert recipe.reward_model_args is None and recipe.training_args.reward_model_path is None
    assert recipe.reward_funcs[0](completions=["a happy b", "sad"]) == [1.0, 0.0]
    assert recipe.reward_funcs[1](completion_ids=[[1, 1], [1, 1, 1], [1] * 5]) == [0.0, -0.5, -1.0]
    # GAE without a reward model: the value model starts from the policy's checkpoint (a fresh head)
    assert recipe.value_model_args.model_name_or_path == "tiny://policy"
    # the file entry resolved relative to the recipe's folder, whatever the working directory
    assert recipe.reward_func_entries[0] == "recipe: key 'reward_funcs' entry 1 'my_rewards.py:says_happy'"
    # the entries reach the pipeline as the recipe holds them (a mapping, not text)
    assert recipe.pipeline.reward_funcs == keys(recipe_dir)["reward_funcs"]

    # the resolved recipe is accepted again, from elsewhere
    copy = recipe_dir / "elsewhere" / "copy.yaml"
    copy.parent.mkdir()
    copy.write_text(recipe.to_yaml())
    assert resolve_recipe(copy, for_check=True).reward_funcs[0](completions=["happy"]) == [1.0]
    # on the command line too: `--reward_funcs A B` replaces the list, a mapping as JSON text
    factory = {"name": "trl.rewards.get_soft_overlong_punishment", "kwargs": {"max_completion_len": 8,
                                                                             "soft_punish_cache": 2}}
    overrides = ["--reward_funcs", "my_rewards.py:matches_topic", json.dumps(factory)]
    rc, out, err = check(capsys, path, *overrides)
    assert rc == 0, err
    assert "# reward functions: matches_topic, soft_overlong_punishment_reward" in out
    assert resolve_recipe(path, overrides, for_check=True).pipeline.reward_funcs[1] == factory
    rc, _, err = check(capsys, path, "--reward_funcs", '{"name": "m:f",')
    assert rc == 2 and err.startswith("trl-ext: error: recipe: key 'reward_funcs' entry 1 '{\"name\": \"m:f\",'"
                                      ": not valid JSON ("), err


@pytest.mark.parametrize("extra, expected", [
    (dict(reward_funcs=["no_such_module_xyz:f"]),
     "recipe: key 'reward_funcs' entry 1 'no_such_module_xyz:f': no module named 'no_such_module_xyz'"),
    (dict(reward_funcs=["my_rewards.py:says_sad"]),
     "recipe: key 'reward_funcs' entry 1 'my_rewards.py:says_sad': file 'my_rewards.py' has no function 'says_sad' "
     "(did you mean 'says_happy'?)"),
    (dict(reward_funcs=["trl.rewards:think_format_reward", "missing.py:f"]),
     "recipe: key 'reward_funcs' entry 2 'missing.py:f': file 'missing.py' does not exist"),
    (dict(reward_funcs=["my_rewards.py:matches_topic"], dataset_name="PROMPTS_ONLY"),
     "recipe: key 'reward_funcs' entry 1 'my_rewards.py:matches_topic': function 'matches_topic' needs 'topic', which "
     "is neither an argument the trainer passes nor a column of the dataset (the dataset's columns: prompt)"),
    (dict(reward_funcs=[{"name": "trl.rewards.get_soft_overlong_punishment", "kwargs": {"max_len": 4}}]),
     "recipe: key 'reward_funcs' entry 1 'trl.rewards.get_soft_overlong_punishment': its kwargs do not fit the "
     "factory"),
    (dict(reward_funcs=[{"url": "ftp://x"}]), "recipe: key 'reward_funcs' entry 1 'ftp://x': 'url' must be"),
    (dict(reward_funcs=None), "recipe: missing key 'reward_model_path' (the reward model PPO optimises) or "
     "'reward_funcs' (reward functions)"),
    (dict(reward_load_in_4bit=True), "recipe: key 'reward_load_in_4bit' configures the reward model, but the recipe "
     "has none (no reward_model_path)"),
    (dict(shared_base=True, use_peft=True, advantage_estimator="rloo", num_samples_per_prompt=2),
     "recipe: key 'shared_base' has nothing to share"),
    (dict(trainer="reward", model_name_or_path="tiny://reward", dataset_name="recipes/demo/data/preferences.jsonl",
          total_episodes=None, num_mini_batches=None, num_ppo_epochs=None, response_length=None,
          num_sample_generations=None), "recipe: key 'reward_funcs' is for PPO recipes only"),
])
def test_each_problem_is_one_line_exit_2_before_any_model_loads(recipe_dir, capsys, monkeypatch, extra, expected):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    if extra.get("dataset_name") == "PROMPTS_ONLY":
        (recipe_dir / "plain.jsonl").write_text(json.dumps({"prompt": "tell me about the cat"}) + "\n")
        extra["dataset_name"] = str(recipe_dir / "plain.jsonl")
    rc, _, err = check(capsys, write(recipe_dir, **extra))
    assert rc == 2 and err.startswith(f"trl-ext: error: {expected}"), err
    assert not (recipe_dir / "out").exists()


def test_reward_weights_need_one_weight_per_reward(recipe_dir, capsys):
    rc, _, err = check(capsys, write(recipe_dir, reward_weights=[1.0, 0.5, 2.0], reward_model_path="tiny://reward"))
    assert rc == 0, err  # the reward model first, then the two functions
    rc, _, err = check(capsys, write(recipe_dir, reward_weights=[1.0, 0.5, 2.0]))
    assert rc == 2 and err == ("trl-ext: error: recipe: key 'reward_weights' has 3 weights for 2 rewards "
                               "(says_happy, soft_overlong_punishment_reward); give one per reward, the reward model "
                               "first"), err


def test_tokenized_prompts_keep_the_other_columns_for_reward_functions(tokenizer):
    import datasets

    from trl_ext.recipe_loader.data import tokenize_prompts

    ds = datasets.Dataset.from_list([{"prompt": "tell me about the cat", "topic": "cat"}])
    kept = tokenize_prompts(ds, tokenizer, keep_columns=True)
    assert kept.column_names == ["prompt", "topic", "input_ids"] and kept[0]["topic"] == "cat"
    assert kept[0]["input_ids"] == tokenizer("tell me about the cat")["input_ids"]
    assert tokenize_prompts(ds, tokenizer).column_names == ["input_ids"]  # as before without reward functions


def test_two_reward_functions_train_two_updates_without_a_reward_model(recipe_dir, tiny_models, tokenizer):
    """A function from a file next to the recipe that reads a dataset column, and trl.rewards' soft overlong
    punishment factory (5 tokens, a cache of 2: 0 up to 3 tokens, -1/2 per token beyond), weighted 1.0 and 0.5; GAE's
    value model starts from the policy (no reward model). Each completion's overlong value is that of its length."""
    from trl_ext.recipe_loader.pipeline import run

    overlong = {"name": "trl.rewards.get_soft_overlong_punishment",
                "kwargs": {"max_completion_len": 5, "soft_punish_cache": 2}}
    recipe = resolve_recipe(write(recipe_dir, reward_funcs=["my_rewards.py:topic_length", overlong],
                                  reward_weights=[1.0, 0.5], log_completions=True))
    trainer = run(recipe)
    logs = [h for h in trainer.state.log_history if "rewards/topic_length/mean" in h]
    rows = [json.loads(line) for line in (recipe_dir / "out" / "completions.jsonl").read_text().splitlines()]
    assert len(logs) == 2 and len(rows) == 8
    for step, log in enumerate(logs, start=1):
        batch = [r for r in rows if r["step"] == step]
        # no stop token: every completion is response_length (4) tokens long, 1 beyond the 3 free ones
        lengths = [len(tokenizer(r["completion"], add_special_tokens=False)["input_ids"]) for r in batch]
        assert lengths == [4] * 4
        assert [r["soft_overlong_punishment_reward"] for r in batch] == [(5 - 2 - n) / 2 for n in lengths]
        # every prompt once per update: the topics' lengths 3, 3, 4, 4 -> 3.5
        assert log["rewards/topic_length/mean"] == pytest.approx(3.5)
        assert log["rewards/soft_overlong_punishment_reward/mean"] == pytest.approx(-0.5)
        assert [r["score"] for r in batch] == [r["topic_length"] + 0.5 * -0.5 for r in batch]
        assert log["reward"] == pytest.approx(3.5 + 0.5 * -0.5, abs=1e-5)
    assert (recipe_dir / "out" / "trl_ext_recipe.yaml").exists()
    # the value model: the tiny policy's checkpoint with a fresh one-output head
    value = trainer.value_model
    assert value.config.num_labels == 1 and value.config._name_or_path == str(tiny_models.policy)


def test_shared_base_without_a_reward_model_shares_only_a_fresh_value_adapter(recipe_dir, capsys):
    """shared_base, GAE, reward functions only: no reward adapter; the value adapter is fresh on the policy's base,
    trains, and is saved beside the policy (one update)."""
    from trl_ext.recipe_loader.pipeline import run

    path = write(recipe_dir, shared_base=True, use_peft=True, lora_r=4, total_episodes=4,
                 reward_funcs=["my_rewards.py:topic_length"])
    rc, out, err = check(capsys, path)
    assert rc == 0, err
    assert "reward: none (reward_funcs only); value: fresh adapter and head" in out
    trainer = run(resolve_recipe(path))
    assert [h["rewards/topic_length/mean"] for h in trainer.state.log_history if "reward" in h] == [3.5]
    assert trainer.reward_model is None or type(trainer.reward_model).__name__ == "NoRewardModel"
    assert (recipe_dir / "out" / "value_model" / "adapter_config.json").exists()


def test_plan_reads_a_recipe_with_factory_entries_and_no_reward_model(recipe_dir):
    from trl_ext.recipe_loader.plan import make_plan

    plan = make_plan(str(write(recipe_dir, use_peft=True, lora_r=4)))
    assert any(note.startswith("no reward model (reward_funcs only)") for note in plan.notes)
    assert not any("reward_model_path" in note for note in plan.notes)  # TRL's default path is not read
