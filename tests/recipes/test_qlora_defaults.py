"""QLoRA-safe defaults: with a quantized LoRA policy, the reward and value models' unset keys follow its quantization
and the value model trains a LoRA adapter; `trl-ext check` names a value model trained in full beside a quantized
policy with the plan's figures; `trl-ext plan` budgets each role as the loader loads it (compared with the loaded
tiny models: quantization, trainable parameters and their bytes, role by role, under the old and the new defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trl_ext.cli import main
from trl_ext.errors import UserInputError
from trl_ext.recipe_loader import resolve_recipe
from trl_ext.recipe_loader.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT / "recipes" / "demo" / "data" / "prompts.jsonl"
QLORA = dict(load_in_4bit=True, use_peft=True, lora_r=4, lora_alpha=8, lora_target_modules="all-linear",
             dtype="bfloat16")
# what the value model got before, unasked: unquantized, no adapter, every parameter trained (now only when asked)
OLD_DEFAULTS = dict(reward_load_in_4bit=False, value_load_in_4bit=False, value_use_peft=False)


def recipe_file(tmp_path, tiny_models, **keys):
    base = dict(trainer="ppo", model_name_or_path=str(tiny_models.policy), reward_model_path=str(tiny_models.reward),
                dataset_name=str(PROMPTS), output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False,
                report_to="none", per_device_train_batch_size=2, gradient_accumulation_steps=1,
                local_rollout_forward_batch_size=2, response_length=4, total_episodes=4)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**base, **keys}))
    return path


def test_unset_keys_follow_a_quantized_lora_policy(tmp_path, tiny_models):
    recipe = resolve_recipe(recipe_file(tmp_path, tiny_models, **QLORA, use_bnb_nested_quant=True))
    reward, value = recipe.reward_model_args, recipe.value_model_args
    assert (reward.load_in_4bit, reward.use_bnb_nested_quant, reward.use_peft) == (True, True, False)  # frozen
    assert (value.load_in_4bit, value.use_bnb_nested_quant, value.use_peft) == (True, True, True)
    assert (value.lora_r, value.lora_alpha, value.lora_target_modules) == (4, 8, "all-linear")
    assert value.lora_task_type == "SEQ_CLS" and value.dtype == "bfloat16"
    # the value model's own keys win; either load_in_* key takes its quantization out of the policy's hands
    recipe = resolve_recipe(recipe_file(tmp_path, tiny_models, **QLORA, value_lora_r=2, value_load_in_8bit=True))
    value = recipe.value_model_args
    assert (value.lora_r, value.lora_alpha, value.load_in_8bit, value.load_in_4bit) == (2, 8, True, False)
    # a policy without quantization (or without LoRA) keeps ModelConfig's defaults: TRL's design, unchanged
    for policy in (dict(use_peft=True, lora_r=4), dict(load_in_4bit=True)):
        recipe = resolve_recipe(recipe_file(tmp_path, tiny_models, **policy))
        for margs in (recipe.reward_model_args, recipe.value_model_args):
            assert (margs.load_in_4bit, margs.use_peft, margs.lora_r) == (False, False, 16)


def test_a_quantized_value_model_without_an_adapter_is_refused(tmp_path, tiny_models):
    with pytest.raises(UserInputError, match="a 4-bit value model .* without a LoRA adapter would train nothing"):
        resolve_recipe(recipe_file(tmp_path, tiny_models, **QLORA, value_use_peft=False))


def loaded_roles(models) -> dict:
    """role -> (quantization as the budget names it, trainable parameters, bytes per trainable parameter)."""
    import bitsandbytes as bnb

    policy, _ref, reward, value = models
    roles = {}
    for role, model in (("policy", policy), ("reward", reward), ("value", value)):
        layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
        quant = None
        if layers:
            state = layers[0].weight.quant_state
            quant = state.quant_type + ("-nested" if state.nested else "")
        trainable = [p for p in model.parameters() if p.requires_grad]
        sizes = {p.element_size() for p in trainable}
        roles[role] = (quant, sum(p.numel() for p in trainable), sizes.pop() if len(sizes) == 1 else sizes)
    return roles


@pytest.mark.parametrize("defaults", ["new", "old"])
def test_the_plan_budgets_what_the_loader_loads_role_by_role(tmp_path, tiny_models, defaults):
    from transformers import AutoTokenizer

    from trl_ext.recipe_loader.pipeline import load_ppo_models

    keys = {**QLORA, **(OLD_DEFAULTS if defaults == "old" else {})}
    path = recipe_file(tmp_path, tiny_models, **keys)
    tokenizer = AutoTokenizer.from_pretrained(tiny_models.policy)
    loaded = loaded_roles(load_ppo_models(resolve_recipe(path), tokenizer))
    plan = make_plan(str(path))
    planned = {role: (load.quantization, trainable) for role, (load, trainable) in plan.roles().items()}
    assert planned == {role: quant_and_count[:2] for role, quant_and_count in loaded.items()}
    # the numbers themselves: LoRA r 4 on all seven linear layers of 2 layers (64 hidden, 128 intermediate, 2 of 4
    # heads for k/v: in+out = 64+64, 64+32, 64+32, 64+64, 64+128, 64+128, 128+64), plus the value's 64-weight head
    lora = 2 * 4 * (128 + 96 + 96 + 128 + 192 + 192 + 192)
    assert loaded["policy"] == ("nf4", lora, 4)
    if defaults == "new":
        assert loaded["reward"][:2] == ("nf4", 0) and loaded["value"] == ("nf4", lora + 64, 4)
    else:  # the whole value model trains, in its bfloat16, beside a 4-bit policy
        vocab = plan.shape.vocab_size
        full = vocab * 64 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64) + 64 + 64
        assert loaded["reward"][:2] == (None, 0) and loaded["value"] == (None, full, 2)
        assert plan.run.dtype_bytes == 2
    moments = plan.budget.parts["AdamW moments (policy and value adapters, value head)"]
    assert moments == (lora * 8 + (lora + 64) * 8 if defaults == "new" else lora * 8 + full * 2 * 2)


def test_check_names_a_value_model_trained_in_full_with_the_plans_figures(tmp_path, tiny_models, capsys):
    path = recipe_file(tmp_path, tiny_models, **QLORA, **OLD_DEFAULTS)
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    (note,) = [line for line in out.splitlines() if "trains in full" in line]
    full, lean = make_plan(str(path)), make_plan(str(recipe_file(tmp_path, tiny_models, **QLORA)))
    assert note.startswith("# note: the value model trains in full (value_use_peft: false) beside a 4-bit policy")
    assert f"peak {full.budget.peak / 2**30:.2f} GiB as written, {lean.budget.peak / 2**30:.2f} GiB with a 4-bit" in note
    assert full.budget.peak > lean.budget.peak
    assert f"{full.roles()['value'][1] / 1e6:,.1f}M parameters" in note
    assert "# value model: " in out and "(bfloat16, trained in full)" in out
    # the new defaults: no such note, the value model a 4-bit LoRA one
    assert main(["check", str(recipe_file(tmp_path, tiny_models, **QLORA))]) == 0
    out = capsys.readouterr().out
    assert "trains in full" not in out and "(4-bit, LoRA r=4)" in out
