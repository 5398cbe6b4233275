"""Recipe loading and validation: every bad-input case gets one line naming the culprit, before anything loads.

In-process (fast); tests/test_recipe_runs.py runs recipes end to end and through the CLI in subprocesses.
"""

import json
from pathlib import Path

import pytest
import yaml

from trl_ext.cli import main
from trl_ext.errors import UserInputError
from trl_ext.recipe_loader import resolve_recipe, valid_keys

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "recipes" / "demo"
PAIRS = DEMO / "data" / "preferences.jsonl"
PROMPTS = DEMO / "data" / "prompts.jsonl"


def write_recipe(tmp_path, name="recipe.yaml", **keys):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(keys))
    return path


def reward_keys(tmp_path, **extra):
    keys = dict(trainer="reward", model_name_or_path="tiny://reward", dataset_name=str(PAIRS),
                output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    keys.update(extra)
    return keys


def ppo_keys(tmp_path, **extra):
    keys = dict(trainer="ppo", model_name_or_path="tiny://policy", reward_model_path="tiny://reward",
                dataset_name=str(PROMPTS), output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    keys.update(extra)
    return keys


def error_of(path, overrides=()):
    with pytest.raises(UserInputError) as info:
        resolve_recipe(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------------------------------------------
# Resolution


def test_recipe_resolves_into_trl_dataclasses_and_cli_overrides_win(tmp_path):
    path = write_recipe(tmp_path, **ppo_keys(tmp_path, learning_rate="3e-4", lora_target_modules=["q_proj", "v_proj"],
                                             value_load_in_4bit=True, value_use_peft=True, kl_coef=0.1))
    recipe = resolve_recipe(path, ["--learning_rate", "0.5", "--kl_coef=0.25", "--use_peft",
                                   "--per_device_train_batch_size", "3"])
    import trl

    import trl_ext

    assert recipe.trainer == "ppo"
    assert isinstance(recipe.training_args, trl_ext.PPOConfig)
    assert isinstance(recipe.model_args, trl.ModelConfig) and isinstance(recipe.script_args, trl.ScriptArguments)
    assert recipe.training_args.learning_rate == 0.5  # CLI beats the recipe
    assert recipe.training_args.kl_coef == 0.25
    assert recipe.training_args.per_device_train_batch_size == 3
    assert recipe.model_args.use_peft is True and recipe.model_args.lora_target_modules == ["q_proj", "v_proj"]
    # Reward/value models: their own prefixed keys; the value model defaults to the reward model's path.
    assert recipe.value_model_args.model_name_or_path == "tiny://reward"
    assert recipe.value_model_args.load_in_4bit is True and recipe.value_model_args.use_peft is True
    assert recipe.value_model_args.lora_task_type == "SEQ_CLS"
    assert recipe.reward_model_args.load_in_4bit is False and recipe.reward_model_args.use_peft is False
    # The resolved recipe parses back to the same settings.
    again = write_recipe(tmp_path, "again.yaml", **yaml.safe_load(recipe.to_yaml()))
    assert resolve_recipe(again).explicit == recipe.explicit


def test_new_config_fields_are_recipe_keys_automatically():
    import dataclasses

    import trl_ext

    for trainer, cls in (("ppo", trl_ext.PPOConfig), ("reward", trl_ext.RewardConfig), ("dpo", trl_ext.DPOConfig),
                         ("sft", trl_ext.SFTConfig)):
        keys = set(valid_keys(trainer))
        assert {f.name for f in dataclasses.fields(cls) if f.init} - {"world_size", "num_total_batches",
                                                                      "micro_batch_size", "local_batch_size",
                                                                      "batch_size", "local_mini_batch_size",
                                                                      "mini_batch_size"} <= keys
        assert {"dataset_name", "model_name_or_path", "load_in_4bit", "lora_r", "trainer"} <= keys
    assert "value_load_in_4bit" in valid_keys("ppo") and "value_load_in_4bit" not in valid_keys("dpo")


def test_env_and_wandb_keys(tmp_path, monkeypatch):
    from trl_ext.recipe_loader.pipeline import apply_environment

    for var in ("WANDB_PROJECT", "WANDB_TAGS", "TRL_EXT_TEST_VAR"):
        monkeypatch.delenv(var, raising=False)
    path = write_recipe(tmp_path, **reward_keys(tmp_path, env={"TRL_EXT_TEST_VAR": 7}, wandb_project="proj",
                                                wandb_tags=["demo", "tiny"], run_name="r1"))
    recipe = resolve_recipe(path)
    apply_environment(recipe)
    import os

    assert os.environ["WANDB_PROJECT"] == "proj" and os.environ["WANDB_TAGS"] == "demo,tiny"
    assert os.environ["TRL_EXT_TEST_VAR"] == "7" and recipe.training_args.run_name == "r1"


# ---------------------------------------------------------------------------------------------------------------
# One-line errors


def test_unknown_key_suggests_the_closest(tmp_path):
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path, learning_rat=1e-4)))
    assert "unknown key 'learning_rat'" in msg and "did you mean 'learning_rate'" in msg
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path)), ["--lora_rr", "8"])
    assert "'lora_rr'" in msg and "'lora_r'" in msg
    # PPO-only keys are unknown to other trainers.
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path, value_load_in_4bit=True)))
    assert "unknown key 'value_load_in_4bit'" in msg


@pytest.mark.parametrize(
    "key, value, expected",
    [
        ("learning_rate", "fast", "key 'learning_rate': invalid float value: 'fast'"),
        ("per_device_train_batch_size", 2.5, "key 'per_device_train_batch_size': invalid int value: '2.5'"),
        ("use_peft", "maybe", "key 'use_peft'"),
        ("learning_rate", [1, 2], "key 'learning_rate' takes one value"),
    ],
)
def test_wrong_type(tmp_path, key, value, expected):
    assert expected in error_of(write_recipe(tmp_path, **reward_keys(tmp_path, **{key: value})))


@pytest.mark.parametrize(
    "key, value",
    [("trainer", "grpo"), ("lr_scheduler_type", "sometimes"), ("bnb_4bit_quant_type", "int3"), ("dtype", "float7")],
)
def test_value_outside_its_choices(tmp_path, key, value):
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path, **{key: value})))
    assert key in msg and "invalid choice" in msg and value in msg


@pytest.mark.parametrize(
    "key, value",
    [
        ("dataset_name", "./no/such/data.jsonl"),
        ("model_name_or_path", "/no/such/model"),
        ("reward_model_path", "outputs/no-such-dir/reward"),
        ("value_model_path", "./no-such-value"),
        ("model_name_or_path", "recipes/no-such-model"),  # one slash, but under an existing ./recipes
    ],
)
def test_local_path_that_does_not_exist(tmp_path, key, value, monkeypatch):
    monkeypatch.chdir(ROOT)
    msg = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, **{key: value})))
    assert f"key '{key}'" in msg and value in msg and "does not exist" in msg


def test_hub_names_are_not_checked_offline(tmp_path):
    recipe = resolve_recipe(write_recipe(tmp_path, **reward_keys(
        tmp_path, model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", dataset_name="trl-lib/ultrafeedback_binarized")))
    assert recipe.model_args.model_name_or_path == "Qwen/Qwen2.5-0.5B-Instruct"


def test_unknown_tiny_model(tmp_path):
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path, model_name_or_path="tiny://giant")))
    assert "model_name_or_path" in msg and "tiny://policy" in msg


@pytest.mark.parametrize("prefix", ["", "value_", "reward_"])
def test_4bit_and_8bit_together(tmp_path, prefix):
    keys = ppo_keys(tmp_path, **{f"{prefix}load_in_4bit": True, f"{prefix}load_in_8bit": True})
    msg = error_of(write_recipe(tmp_path, **keys))
    assert f"'{prefix}load_in_4bit'" in msg and f"'{prefix}load_in_8bit'" in msg


def test_missing_required_keys(tmp_path):
    keys = reward_keys(tmp_path)
    del keys["dataset_name"]
    assert "missing key 'dataset_name'" in error_of(write_recipe(tmp_path, **keys))
    keys = ppo_keys(tmp_path)
    del keys["reward_model_path"]
    assert "missing key 'reward_model_path'" in error_of(write_recipe(tmp_path, **keys))
    assert "missing key 'trainer'" in error_of(write_recipe(tmp_path, model_name_or_path="x"))


def test_bad_yaml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: reward\n  learning_rate: [1\n")
    assert "bad.yaml" in error_of(bad)
    assert "does not exist" in error_of(tmp_path / "nope.yaml")
    listy = tmp_path / "list.yaml"
    listy.write_text("- a\n- b\n")
    assert "mapping" in error_of(listy)


def test_trl_config_errors_become_one_line(tmp_path):
    # A check in transformers' TrainingArguments.__post_init__ surfaces as one line.
    keys = reward_keys(tmp_path, load_best_model_at_end=True, eval_strategy="steps", save_strategy="epoch")
    msg = error_of(write_recipe(tmp_path, **keys))
    assert "load_best_model_at_end" in msg


def test_bf16_without_a_gpu_names_the_key_and_the_fix(tmp_path):
    import torch

    keys = reward_keys(tmp_path)
    del keys["use_cpu"]  # TRL's configs default to bf16: true
    path = write_recipe(tmp_path, **keys)
    if torch.cuda.is_available():  # a bf16-capable GPU runs it; CI and these machines have none
        assert resolve_recipe(path).training_args.bf16
        return
    msg = error_of(path)
    assert msg.startswith("recipe: key 'bf16'/'fp16'") and "use_cpu: true" in msg
    assert resolve_recipe(path, ["--use_cpu", "true"]).training_args.use_cpu


def test_ptx_keys_are_consistent(tmp_path):
    import dataclasses

    import trl_ext

    if "ptx_coef" not in {f.name for f in dataclasses.fields(trl_ext.PPOConfig)}:
        msg = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, ptx_dataset_name=str(PAIRS))))
        assert "ptx_dataset_name" in msg
        return
    msg = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, ptx_coef=0.5)))
    assert "ptx_coef" in msg and "ptx_dataset_name" in msg
    msg = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, ptx_dataset_name=str(PAIRS))))
    assert "ptx_coef" in msg
    msg = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, ptx_coef=0.5, ptx_dataset_name="./nope.jsonl")))
    assert "ptx_dataset_name" in msg and "does not exist" in msg


def test_ppo_only_keys_are_refused_elsewhere(tmp_path):
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path, value_model_path="tiny://reward")))
    assert "'value_model_path' is for PPO recipes only" in msg
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path, shared_base=True)))
    assert "'shared_base' is for PPO recipes only" in msg
    msg = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, dataset_streaming=True)))
    assert "'dataset_streaming'" in msg
    msg = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, sft_model_path="tiny://policy")))
    assert "'sft_model_path'" in msg and "model_name_or_path" in msg


def test_non_empty_output_dir_is_kept_unless_overwrite(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    msg = error_of(write_recipe(tmp_path, **reward_keys(tmp_path)))
    assert "output_dir" in msg and "overwrite_output_dir" in msg
    assert resolve_recipe(write_recipe(tmp_path, **reward_keys(tmp_path, overwrite_output_dir=True)))
    assert resolve_recipe(write_recipe(tmp_path, **reward_keys(tmp_path)), ["--overwrite_output_dir", "true"])
    assert (out / "precious.txt").read_text() == "keep me"


# ---------------------------------------------------------------------------------------------------------------
# Dataset columns: checked as soon as the dataset is opened, before any model loads


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    "trainer, rows, column",
    [
        ("reward", [{"prompt": "p", "chosen": "a"}], "rejected"),
        ("reward", [{"prompt": "p", "answer": "a"}], "chosen"),
        ("dpo", [{"prompt": "p", "rejected": "a"}], "chosen"),
        ("ppo", [{"question": "p"}], "prompt"),
    ],
)
def test_missing_dataset_columns(tmp_path, trainer, rows, column):
    from trl_ext.recipe_loader.pipeline import open_datasets

    data = _jsonl(tmp_path / "data.jsonl", rows)
    keys = ppo_keys(tmp_path) if trainer == "ppo" else reward_keys(tmp_path, trainer=trainer)
    if trainer == "dpo":
        keys["model_name_or_path"] = "tiny://policy"
    recipe = resolve_recipe(write_recipe(tmp_path, **dict(keys, dataset_name=str(data))))
    with pytest.raises(UserInputError) as info:
        open_datasets(recipe)
    assert f"no column '{column}'" in str(info.value) and "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def sft_keys(tmp_path, data, **extra):
    keys = dict(trainer="sft", model_name_or_path="tiny://policy", dataset_name=str(data),
                output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none")
    keys.update(extra)
    return keys


@pytest.mark.parametrize(
    "rows, extra, ok",
    [
        ([{"text": "the cat"}], {}, True),
        ([{"body": "the cat"}], {"dataset_text_field": "body"}, True),
        ([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}], {}, True),
        ([{"prompt": "the", "completion": " cat"}], {}, True),
        ([{"input_ids": [1, 2, 3]}], {}, True),
        ([{"body": "the cat"}], {}, "no column 'text' (columns: body); SFT needs 'text' (the dataset_text_field)"),
        ([{"prompt": "the cat"}], {}, "has 'prompt' but no column 'completion'"),
    ],
)
def test_sft_dataset_formats(tmp_path, rows, extra, ok):
    """SFT accepts TRL's formats (text, messages, prompt/completion, input_ids) and names what is missing."""
    from trl_ext.recipe_loader.pipeline import open_datasets

    data = _jsonl(tmp_path / "data.jsonl", rows)
    recipe = resolve_recipe(write_recipe(tmp_path, **sft_keys(tmp_path, data, **extra)))
    assert type(recipe.training_args).__name__ == "SFTConfig" and recipe.trainer == "sft"
    if ok is True:
        assert len(open_datasets(recipe)[0]) == 1
        return
    with pytest.raises(UserInputError) as info:
        open_datasets(recipe)
    assert ok in str(info.value) and "\n" not in str(info.value)


def test_sft_recipe_keys(tmp_path):
    data = _jsonl(tmp_path / "data.jsonl", [{"text": "the cat"}])
    recipe = resolve_recipe(write_recipe(tmp_path, **sft_keys(tmp_path, data, packing=True, max_length=16)),
                            ["--completion_only_loss", "false"])
    args = recipe.training_args
    assert args.packing is True and args.max_length == 16 and args.completion_only_loss is False
    assert recipe.model_args.model_name_or_path == "tiny://policy" and recipe.reward_model_args is None
    msg = error_of(write_recipe(tmp_path, **sft_keys(tmp_path, data, beta=0.1)))
    assert "unknown key 'beta'" in msg and "sft recipe" in msg
    keys = sft_keys(tmp_path, data)
    del keys["dataset_name"]
    assert "missing key 'dataset_name'" in error_of(write_recipe(tmp_path, **keys))


def test_dataset_formats_and_splits(tmp_path):
    import datasets

    from trl_ext.recipe_loader.data import open_split

    rows = [{"prompt": "p", "chosen": "a", "rejected": "b"}] * 3
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    ds.to_csv(str(tmp_path / "d.csv"))
    ds.save_to_disk(str(tmp_path / "single"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0])}).save_to_disk(str(tmp_path / "dict"))
    from trl_ext.recipe_loader.data import check_columns

    streamed = ds.to_iterable_dataset().map(lambda x: x)  # features unknown after map: columns read from row 1
    check_columns(streamed, "dpo", name="streamed", split="train")
    with pytest.raises(UserInputError, match="no column 'prompt'"):
        check_columns(streamed.remove_columns(["prompt"]), "ppo", name="streamed", split="train")
    for name in ("d.parquet", "d.csv", "single"):
        assert open_split(str(tmp_path / name), "train").column_names == ["prompt", "chosen", "rejected"]
    assert len(open_split(str(tmp_path / "dict"), "test")) == 1
    with pytest.raises(UserInputError, match="dataset_test_split: .* has no split 'validation' .*splits: test, train"):
        open_split(str(tmp_path / "dict"), "validation", split_key="dataset_test_split")
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(UserInputError, match="unsupported file type '.txt'"):
        open_split(str(tmp_path / "d.txt"), "train")


# ---------------------------------------------------------------------------------------------------------------
# `trl-ext check`


REAL_RECIPES = sorted((ROOT / "recipes").glob("*/*.yaml"))
# recipes/gold, recipes/verifiable and recipes/tool_use read what their scripts generate: their recipes run end to end
# in tests/recipes/test_gold_pipeline.py, tests/rewards/test_verifiable_task.py and tests/tool_use/
REAL_RECIPES = [p for p in REAL_RECIPES
                if p.parent.name not in ("accelerate", "demo", "gold", "verifiable", "tool_use")]


def test_real_model_recipes_exist_for_each_trainer():
    kinds = {yaml.safe_load(p.read_text())["trainer"] for p in REAL_RECIPES}
    assert kinds == {"sft", "reward", "dpo", "ppo"}


@pytest.mark.parametrize("path", REAL_RECIPES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_model_recipes_pass_check(path, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    # accuracy_reward runs: math_verify is in the `dev` extra (without it: tests/recipes/test_grpo_gsm8k_recipe.py)
    # PPO recipes point at the reward model their reward recipe writes: `check` needs that path to exist.
    assert main(["check", str(path), "--output_dir", "/tmp/trl-ext-check-never-written",
                 *_reward_output_override(path, tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and yaml.safe_load(out[out.index("trainer:"):])["trainer"] in ("sft", "reward", "dpo", "ppo")
    assert not Path("/tmp/trl-ext-check-never-written").exists()


def fake_reward_adapter(directory, base, hidden=8):
    """An adapter directory as a LoRA reward recipe writes it on `base` (tiny tensors: `check` reads headers only)."""
    import safetensors.torch
    import torch

    directory.mkdir(parents=True)
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "task_type": "SEQ_CLS", "base_model_name_or_path": base, "r": 2,
         "target_modules": ["q_proj"], "modules_to_save": ["classifier", "score"]}))
    lora = "base_model.model.model.layers.0.self_attn.q_proj.lora_"
    safetensors.torch.save_file({lora + "A.weight": torch.zeros(2, hidden), lora + "B.weight": torch.zeros(hidden, 2),
                                 "base_model.model.score.weight": torch.zeros(1, hidden)},
                                directory / "adapter_model.safetensors")
    return directory


def _reward_output_override(path, tmp_path):
    keys = yaml.safe_load(path.read_text())
    data_override = []
    if keys.get("dataset_name", "").startswith("outputs/"):  # data a script of the recipe writes: a stand-in
        standin = tmp_path / "standin"  # with the columns its reward functions read
        standin.mkdir()
        row = {"prompt": [{"role": "user", "content": "What is 1+1?"}], "solution": "2"}
        for split in (keys.get("dataset_train_split", "train"), keys.get("dataset_test_split", "test")):
            (standin / f"{split}.jsonl").write_text(json.dumps(row) + "\n")
        data_override = ["--dataset_name", str(standin)]
    if keys.get("shared_base") and keys.get("reward_model_path"):  # a LoRA reward adapter trained on the policy's base
        adapter = fake_reward_adapter(tmp_path / "adapter", keys["model_name_or_path"])
        return data_override + ["--reward_model_path", str(adapter)]
    overrides = data_override
    for key in ("reward_model_path", "value_model_path"):
        if keys.get(key, "").startswith(("outputs/", "./")):
            overrides += [f"--{key}", "tiny://reward"]
    return overrides


@pytest.fixture
def shared(tmp_path, monkeypatch, tiny_models, reward_adapter):
    """PPO recipe keys with shared_base (tiny:// resolves to the session's tiny models, where the adapter sits)."""
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    return lambda **extra: write_recipe(tmp_path, **ppo_keys(
        tmp_path, **{"use_peft": True, "shared_base": True, "reward_model_path": str(reward_adapter), **extra}))


def test_shared_base_recipe_resolves(shared, tiny_models):
    recipe = resolve_recipe(shared(value_lora_r=8, value_model_path="tiny://policy"))
    assert recipe.pipeline.shared_base and recipe.value_model_args.lora_r == 8
    from trl_ext.recipe_loader.loader import shared_value_is_fresh

    assert shared_value_is_fresh(recipe.value_model_args.model_name_or_path, "tiny://policy")
    assert not shared_value_is_fresh(str(tiny_models.reward), "tiny://policy")


@pytest.mark.parametrize("extra, needle", [
    (dict(use_peft=False), "key 'shared_base' needs use_peft: true"),
    (dict(reward_model_path="tiny://reward"), "'reward_model_path': 'tiny://reward' is not a LoRA adapter directory"),
    (dict(reward_load_in_4bit=True), "key 'reward_load_in_4bit' does not apply with shared_base: true"),
    (dict(value_load_in_8bit=True), "key 'value_load_in_8bit' does not apply with shared_base: true"),
    (dict(value_use_peft=False), "key 'value_use_peft' is false"),
])
def test_shared_base_impossible_combinations(shared, extra, needle):
    assert needle in error_of(shared(**extra))


def test_shared_base_refuses_an_adapter_of_another_base(shared, tmp_path, reward_adapter):
    other = fake_reward_adapter(tmp_path / "other", "Qwen/Qwen2.5-0.5B-Instruct")
    message = error_of(shared(reward_model_path=str(other)))
    assert message.startswith("recipe: key 'reward_model_path':")
    assert "trained on base 'Qwen/Qwen2.5-0.5B-Instruct'" in message
    message = error_of(shared(value_model_path=str(other)))
    assert message.startswith("recipe: key 'value_model_path':") and "but the policy's base is" in message


def test_demo_recipes_pass_check(capsys, monkeypatch, tmp_path, tiny_models, reward_adapter):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    for name in ("reward", "reward_lora", "dpo", "ppo", "ppo_shared", "ppo_rloo"):
        extra = {"ppo": ["--reward_model_path", "tiny://reward"], "ppo_rloo": ["--reward_model_path", "tiny://reward"],
                 "ppo_shared": ["--reward_model_path", str(reward_adapter)]}.get(name, [])
        assert main(["check", str(DEMO / f"{name}.yaml"), "--output_dir", str(tmp_path / name), *extra]) == 0
    out = capsys.readouterr().out
    assert "trainer: ppo" in out and "# value model: tiny://reward (float32, trained in full)" in out
    assert f"# shared base tiny://policy: policy adapter; reward: adapter {reward_adapter} (frozen)" in out


def test_critic_free_recipe_has_no_value_model_and_refuses_value_keys(tmp_path):
    keys = ppo_keys(tmp_path, advantage_estimator="grpo", num_samples_per_prompt=2)
    recipe = resolve_recipe(write_recipe(tmp_path, **keys))
    assert recipe.value_model_args is None and recipe.training_args.kl_in == "loss"
    message = error_of(write_recipe(tmp_path, **keys, value_model_path="tiny://reward"))
    assert message == ("recipe: key 'value_model_path' configures the value model, but advantage_estimator 'grpo' "
                       "uses none; remove the key (or use advantage_estimator: gae)")
    assert error_of(write_recipe(tmp_path, **keys), ["--value_load_in_4bit", "true"]).startswith(
        "recipe: key 'value_load_in_4bit' configures the value model")
    message = error_of(write_recipe(tmp_path, **ppo_keys(tmp_path, advantage_estimator="rloo")))
    assert message.startswith("recipe: key 'num_samples_per_prompt': advantage_estimator 'rloo' compares the samples")


def test_critic_free_shared_base_recipe_builds_no_value_adapter(shared, tiny_models):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_ext.recipe_loader.pipeline import shared_base_scalar_models

    recipe = resolve_recipe(shared(advantage_estimator="rloo", num_samples_per_prompt=2))
    assert recipe.value_model_args is None

    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_models.policy),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    reward, value = shared_base_scalar_models(recipe, policy)
    assert value is None and sorted(policy.peft_config) == ["default", "reward"]


def test_grpo_config_keys_in_a_recipe(tmp_path):
    """chat_template_kwargs is a recipe key (a mapping, also as JSON on the command line); model_init_kwargs, for
    model ids given to PPOTrainer in Python, is refused by `train` before any model loads."""
    from trl_ext.recipe_loader.pipeline import train_ppo

    path = write_recipe(tmp_path, **ppo_keys(tmp_path, chat_template_kwargs={"enable_thinking": False}))
    assert resolve_recipe(path).training_args.chat_template_kwargs == {"enable_thinking": False}
    again = resolve_recipe(path, ["--chat_template_kwargs", '{"enable_thinking": true}'])
    assert again.training_args.chat_template_kwargs == {"enable_thinking": True}
    recipe = resolve_recipe(write_recipe(tmp_path, "ids.yaml", **ppo_keys(tmp_path,
                                                                           model_init_kwargs={"dtype": "bfloat16"})))
    with pytest.raises(UserInputError, match="^recipe: key 'model_init_kwargs' is for model ids given to PPOTrainer"):
        train_ppo(recipe)
