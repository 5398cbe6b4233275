"""trl-ext plan: a PPO recipe's memory budget from config.json only; its numbers are memory_budget's, and it names
the keys to change when a recipe does not fit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from trl_ext.errors import UserInputError
from trl_ext.ppo.memory.budget import GIB, LLAMA_3_8B, ModelShape, PPOShape, ppo_memory_budget
from trl_ext.cli import main
from trl_ext.recipe_loader.plan import make_plan, split_plan_options

SHARED = "tests/data/recipes/ppo_shared_0.5b.yaml"  # fixed settings, whatever the shipped recipes become


@pytest.fixture(scope="module")
def llama_8b(tmp_path_factory):
    """A folder holding only a Llama-3-8B config.json (meta-llama/Meta-Llama-3-8B's sizes; no weights)."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("llama-3-8b")
    LlamaConfig(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192, rope_theta=500_000.0,
                tie_word_embeddings=False).save_pretrained(path)
    assert sorted(p.name for p in path.iterdir()) == ["config.json"]
    return path


def recipe_run(**changes):
    """ppo_shared.yaml's settings: 8 x 8 episodes, TRL's chunk 64, nf4 with nested quantization, LoRA r 32, bf16."""
    run = PPOShape(batch=64, micro_batch=8, rollout_chunk=64, prompt_length=512, response_length=64, lora_r=32,
                   quantization="nf4-nested", dtype_bytes=2)
    return replace(run, **changes)


def test_plan_numbers_are_memory_budgets(llama_8b):
    plan = make_plan(SHARED, ["--model_name_or_path", str(llama_8b)], gpu_memory=18)
    assert replace(plan.shape, name="") == replace(LLAMA_3_8B, name="")
    expected = ppo_memory_budget(LLAMA_3_8B, recipe_run(), shared=True)
    assert plan.budget.parts == expected.parts and plan.budget.peak == expected.peak
    assert not plan.fits and plan.budget.peak / GIB == pytest.approx(19.83, abs=0.01)
    # micro-batch 8 does not fit 18 GiB at any chunk (training alone: 9.46 + 9.37 + 1 GiB); micro-batch 4 with chunk
    # 51 does, chunk 52 does not
    assert ppo_memory_budget(LLAMA_3_8B, recipe_run(rollout_chunk=1), shared=True).peak > 18 * GIB
    assert plan.fastest == {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 16,
                            "local_rollout_forward_batch_size": 51}
    assert plan.changes_results
    fits = ppo_memory_budget(LLAMA_3_8B, recipe_run(micro_batch=4, rollout_chunk=51), shared=True)
    assert plan.fastest_budget.peak == fits.peak <= 18 * GIB
    assert ppo_memory_budget(LLAMA_3_8B, recipe_run(micro_batch=4, rollout_chunk=52), shared=True).peak > 18 * GIB


def test_cli_says_the_8b_does_not_fit_and_names_the_keys(llama_8b, capsys):
    code = main(["plan", SHARED, "--gpu-memory", "18", "--model_name_or_path", str(llama_8b)])
    out = capsys.readouterr().out
    assert code == 1
    assert "As written the run does NOT fit in 18 GiB (peak 19.83 GiB, training phase largest)." in out
    assert ("Keys to change: per_device_train_batch_size (8 -> 4), gradient_accumulation_steps (8 -> 16), "
            "local_rollout_forward_batch_size (64 -> 51)") in out
    assert "This CHANGES the results" in out
    budget = ppo_memory_budget(LLAMA_3_8B, recipe_run(), shared=True)
    for name, value in budget.parts.items():  # every component, as memory_budget gives it
        assert f"| {name} | {value / GIB:.2f} |" in out
    # the options may come before the recipe too
    assert main(["plan", "--gpu-memory", "18", SHARED, "--model_name_or_path", str(llama_8b)]) == 1


def test_what_fits_as_written_and_larger_micro_batches(llama_8b, capsys):
    code = main(["plan", SHARED, "--gpu-memory=80", "--model_name_or_path", str(llama_8b)])
    out = capsys.readouterr().out
    assert code == 0 and "As written the run fits in 80 GiB" in out and "Nothing to change." in out
    plan = make_plan(SHARED, ["--model_name_or_path", str(llama_8b)], gpu_memory=80)
    assert plan.fastest == {"local_rollout_forward_batch_size": 64}
    # larger micro-batches that fit are offered as a choice that changes results, never applied
    for m, acc, chunk, peak in plan.larger_micro_batches:
        assert m * acc == 64 and m > 8
        assert peak == ppo_memory_budget(LLAMA_3_8B, recipe_run(micro_batch=m, rollout_chunk=chunk), shared=True).peak
        assert peak <= 80 * GIB
        assert f"per_device_train_batch_size: {m}, gradient_accumulation_steps: {acc}" in out
    assert plan.larger_micro_batches and "changes results" in out


def test_nothing_fits_names_the_keys_that_shrink_the_weights(llama_8b, capsys):
    overrides = ["--model_name_or_path", str(llama_8b), "--shared_base", "false"]
    plan = make_plan(SHARED, overrides, gpu_memory=16)
    assert plan.fastest is None
    keys = {key: peak for key, _value, peak in plan.remedies}
    assert set(keys) == {"shared_base", "upcast_non_quantized"}
    one = recipe_run(micro_batch=1, rollout_chunk=1)
    assert ppo_memory_budget(LLAMA_3_8B, one, shared=False).peak > 16 * GIB  # separate models: 17.9 GiB of weights
    # shared base fits at micro-batch 1 with the largest chunk that fits
    assert keys["shared_base"] <= 16 * GIB
    assert keys["upcast_non_quantized"] == ppo_memory_budget(
        LLAMA_3_8B, replace(one, upcast_non_quantized=False), shared=False).peak
    assert any("reward_model_path" in note for note in plan.notes)  # not trained yet: planned anyway
    assert main(["plan", SHARED, "--gpu-memory", "16", *overrides]) == 1
    out = capsys.readouterr().out
    assert "No rollout chunk or micro-batch fits 16 GiB" in out and "shared_base: true" in out


def test_auto_chunk_is_planned_as_the_trainer_would_choose(llama_8b, capsys):
    from trl_ext.ppo.memory.chunk import largest_fitting_chunk

    overrides = ["--model_name_or_path", str(llama_8b), "--local_rollout_forward_batch_size", "auto"]
    plan = make_plan(SHARED, overrides + ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "16"],
                     gpu_memory=18)
    chosen = largest_fitting_chunk(LLAMA_3_8B, recipe_run(micro_batch=4), 18 * GIB, shared=True)
    assert plan.fits and plan.run.rollout_chunk == plan.fastest_chunk == chosen.chunk == 51
    assert plan.budget.peak == chosen.budget.peak
    assert plan.fastest == {"local_rollout_forward_batch_size": "auto"}
    # at micro-batch 8 auto finds no chunk: the plan says so and keeps `auto` in its suggestion
    assert main(["plan", SHARED, "--gpu-memory", "18", *overrides]) == 1
    out = capsys.readouterr().out
    assert "local_rollout_forward_batch_size: auto (chooses 51 at max_memory_gib: 18)" in out
    assert "Keys to change: per_device_train_batch_size (8 -> 4), gradient_accumulation_steps (8 -> 16)\n" in out


def test_bf16_residual_key_is_planned(llama_8b):
    plan = make_plan(SHARED, ["--model_name_or_path", str(llama_8b), "--upcast_non_quantized", "false"],
                     gpu_memory=24)
    assert plan.budget.peak == ppo_memory_budget(LLAMA_3_8B, recipe_run(upcast_non_quantized=False), shared=True).peak


def test_hub_ids_and_other_recipes_are_refused_in_one_line(capsys):
    assert main(["plan", SHARED]) == 2  # Qwen/Qwen2.5-0.5B-Instruct: a Hub id, and the tests are offline
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'Qwen/Qwen2.5-0.5B-Instruct' is a Hub id whose config.json could not be fetched" \
        in err and "--model_name_or_path path/to/config.json" in err
    assert main(["plan", SHARED, "--model_name_or_path", "no/such/folder/config.json"]) == 2
    assert "is not a local directory or config.json" in capsys.readouterr().err
    assert main(["plan", "recipes/demo/reward.yaml"]) == 2
    assert "the planner plans PPO recipes" in capsys.readouterr().err
    with pytest.raises(UserInputError, match="--gpu-memory takes a number"):
        split_plan_options(["--gpu-memory", "lots"])
    assert split_plan_options(["--lora_r", "8", "--prompt-length=128"]) == ({"prompt_length": 128}, ["--lora_r", "8"])


def test_demo_recipe_on_the_tiny_policy(tiny_models):
    """The demo's shared-base recipe on the tiny policy's config.json: fits, and the budget is memory_budget's."""
    from transformers import AutoConfig

    plan = make_plan("recipes/demo/ppo_shared.yaml", ["--model_name_or_path", str(tiny_models.policy)],
                     gpu_memory=24, prompt_length=16)
    shape = ModelShape.from_config(AutoConfig.from_pretrained(tiny_models.policy))
    assert replace(plan.shape, name="") == replace(shape, name="")
    assert plan.fits and plan.budget.peak == ppo_memory_budget(plan.shape, plan.run, shared=True).peak
    assert plan.fastest == {"local_rollout_forward_batch_size": plan.run.batch}


def test_critic_free_recipe_is_planned_without_a_value_model(llama_8b):
    """An advantage_estimator without a critic holds no value adapter: the plan's budget is memory_budget's with
    value_model=False, smaller than the GAE plan's."""
    overrides = ["--model_name_or_path", str(llama_8b)]
    gae = make_plan(SHARED, overrides, gpu_memory=24)
    rloo = make_plan(SHARED, overrides + ["--advantage_estimator", "rloo", "--num_samples_per_prompt", "4"],
                     gpu_memory=24)
    expected = ppo_memory_budget(LLAMA_3_8B, recipe_run(), shared=True, value_model=False)
    assert rloo.budget.parts == expected.parts and rloo.budget.peak == expected.peak
    assert rloo.budget.peak < gae.budget.peak


SHIPPED_PPO = sorted(str(p.relative_to(Path(__file__).resolve().parents[2])) for p in
                     (Path(__file__).resolve().parents[2] / "recipes").glob("**/*.yaml")
                     if (yaml.safe_load(p.read_text()) or {}).get("trainer") == "ppo")


def test_every_shipped_ppo_recipe_is_planned(tiny_models, capsys):
    """Every PPO and GRPO recipe, LoRA or trained in full (recipes/demo/ppo.yaml was refused: 'models LoRA policies'),
    with its policy replaced by the tiny one (plan never downloads)."""
    assert {"recipes/demo/ppo.yaml", "recipes/qwen2.5-0.5b/grpo_gsm8k.yaml", "recipes/verifiable/grpo.yaml"} <= set(
        SHIPPED_PPO)
    for recipe in SHIPPED_PPO:
        assert main(["plan", recipe, "--model_name_or_path", str(tiny_models.policy)]) == 0, recipe
        out = capsys.readouterr().out
        assert "train_micro_batch_size: auto would take" in out and "margin x" in out, recipe
    full = make_plan("recipes/demo/ppo.yaml", ["--model_name_or_path", str(tiny_models.policy)])
    lora = make_plan("recipes/demo/ppo.yaml", ["--model_name_or_path", str(tiny_models.policy), "--use_peft", "true"])
    assert full.run.full_finetune and not lora.run.full_finetune
    # trained in full: a reference copy and AdamW moments of every parameter, more than the LoRA run holds
    assert full.budget.persistent > lora.budget.persistent > 0
    params = full.shape.parameters
    assert full.budget.parts["AdamW moments (policy and value adapters, value head)"] >= 2 * 4 * params


def test_the_chunk_line_says_why(llama_8b, capsys):
    """'larger chunks are faster' next to 'Keys to change: local_rollout_forward_batch_size (64 -> 51)' read as a
    contradiction: the line says the written chunk does not fit the target."""
    main(["plan", SHARED, "--gpu-memory", "18", "--model_name_or_path", str(llama_8b),
          "--local_rollout_forward_batch_size", "64", "--per_device_train_batch_size", "2",
          "--gradient_accumulation_steps", "32"])
    out = capsys.readouterr().out
    assert "Keys to change: local_rollout_forward_batch_size (64 -> 51)" in out
    assert ("  local_rollout_forward_batch_size: 51 (or `auto` with max_memory_gib: 18): larger chunks are faster, but "
            "64 does not fit 18 GiB: 51 is the largest that does;") in out
    margin = next(x for x in out.splitlines() if x.startswith("On CUDA"))
    assert "margin x1.33 at chunk 64" not in margin and "x1.58 at chunk 64" in margin  # 1.077 + 0.0079 * 64
    assert "x1.05 with expandable_segments" in margin
