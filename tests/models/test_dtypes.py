"""Parameter dtypes that hold (trl_ext.models.dtypes): checkpoints stored in bfloat16 (as Qwen2.5 and Llama 3 ship),
run in float16 or bfloat16 without autocast, or with fp16 mixed precision, by every trainer, quantized or not; and
`upcast_non_quantized: false` (a bfloat16 residual stream under a 4-bit base)."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from trl import ModelConfig

from trl_ext.models import load_policy, load_scalar_model
from trl_ext.models.dtypes import KeptParameterDtypes, dtype_rule_violations

ROOT = Path(__file__).resolve().parents[2]
PREFERENCES = ROOT / "recipes" / "demo" / "data" / "preferences.jsonl"
PROMPTS = ROOT / "recipes" / "demo" / "data" / "prompts.jsonl"
LORA = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, lora_target_modules="all-linear")


@pytest.fixture(scope="module")
def bf16_checkpoints(tmp_path_factory, tokenizer):
    """A tiny causal LM and a tiny reward model saved in bfloat16, and a LoRA reward adapter on that causal LM."""
    from trl_ext.testing import build_causal_lm, build_scalar_model, save_scalar_adapter

    root = tmp_path_factory.mktemp("bf16")
    paths = {"policy": root / "policy", "reward": root / "reward", "adapter": root / "adapter"}
    build_causal_lm(tokenizer).to(torch.bfloat16).save_pretrained(paths["policy"])
    build_scalar_model(tokenizer).to(torch.bfloat16).save_pretrained(paths["reward"])
    for name in ("policy", "reward"):
        tokenizer.save_pretrained(paths[name])
        assert json.loads((paths[name] / "config.json").read_text())["dtype"] == "bfloat16"
    save_scalar_adapter(paths["policy"], paths["adapter"])
    paths["sft_data"] = root / "sft.jsonl"  # SFT text: the demo's prompts
    rows = [json.loads(line) for line in PROMPTS.read_text().splitlines()[:8]]
    paths["sft_data"].write_text("".join(json.dumps({"text": r["prompt"]}) + "\n" for r in rows))
    return {k: str(v) for k, v in paths.items()}


def lm_batch(tokenizer):
    torch.manual_seed(0)
    return torch.randint(len(tokenizer.all_special_ids), len(tokenizer), (2, 10))


# --------------------------------------------------------------------------------------------------------------
# Loading: every setting, both roles


@pytest.mark.parametrize("quant", ["none", "4bit", "8bit"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("peft", [True, False], ids=["lora", "full"])
@pytest.mark.parametrize("role", ["policy", "scalar"])
def test_loaded_parameters_follow_the_rule_and_run_without_autocast(bf16_checkpoints, tokenizer, quant, dtype, peft,
                                                                      role):
    args = ModelConfig(model_name_or_path=bf16_checkpoints["policy"], dtype=dtype, load_in_4bit=quant == "4bit",
                       load_in_8bit=quant == "8bit", **(LORA if peft else {}))
    model = (load_policy if role == "policy" else load_scalar_model)(args, tokenizer=tokenizer)
    assert dtype_rule_violations(model, getattr(torch, dtype)) == []
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if peft:  # LoRA weights and a trained score head: float32 (peft's LoRA; the head copied from the base)
        assert trainable and all(p.dtype == torch.float32 for _, p in trainable)
        assert role == "policy" or any("score" in n for n, _ in trainable)
    ids = lm_batch(tokenizer)
    out = model(input_ids=ids, labels=ids) if role == "policy" else model(input_ids=ids)
    loss = out.loss if role == "policy" else out.logits.float().pow(2).mean()
    assert torch.isfinite(loss)
    if trainable:
        loss.backward()
        assert all(p.grad is not None and p.grad.dtype == p.dtype for _, p in trainable)


def test_trl_bfloat16_cast_is_undone_with_the_very_same_values(bf16_checkpoints, tokenizer):
    """TRL's RewardTrainer casts a quantized model's trainables to bfloat16; trl-ext's gets its own tensors back."""
    from trl_ext import RewardConfig, RewardTrainer
    from trl_ext.recipe_loader.data import open_split

    args = ModelConfig(model_name_or_path=bf16_checkpoints["policy"], dtype="float16", load_in_4bit=True, **LORA)
    model = load_scalar_model(args, tokenizer=tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    config = RewardConfig(output_dir="unused", bf16=False, use_cpu=True, report_to=[], max_length=32)
    kept = KeptParameterDtypes(model)
    from trl import RewardTrainer as TRLRewardTrainer

    TRLRewardTrainer(model=model, args=config, train_dataset=open_split(str(PREFERENCES), "train").select(range(4)),
                     processing_class=tokenizer)
    cast = {n for n, p in model.named_parameters() if p.requires_grad and p.dtype == torch.bfloat16}
    assert cast == set(before)  # what TRL does: every trainable parameter (LoRA and the head) to bfloat16
    assert kept.restore(model) == len(before)
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert param.dtype == torch.float32 and torch.equal(param, before[name])
    trainer = RewardTrainer(model=model, args=config, processing_class=tokenizer,
                            train_dataset=open_split(str(PREFERENCES), "train").select(range(4)))
    assert dtype_rule_violations(trainer.model, torch.float16) == []


# --------------------------------------------------------------------------------------------------------------
# Every trainer, from a recipe: the first steps go through, the rule holds


def recipe_keys(trainer, paths, out, *, quant, dtype):
    keys = dict(trainer="ppo" if trainer.startswith("ppo") else trainer, model_name_or_path=paths["policy"],
                dtype=dtype, output_dir=str(out), bf16=False, use_cpu=True, report_to="none", save_strategy="no",
                seed=0, load_in_4bit=quant == "4bit", learning_rate=1e-3, **LORA)
    if trainer in ("sft", "reward", "dpo"):
        keys.update(dataset_name=str(PREFERENCES), max_steps=2, per_device_train_batch_size=2, max_length=48,
                    logging_steps=1)
    if trainer == "sft":
        keys.update(dataset_name=paths["sft_data"])
    if trainer.startswith("ppo"):
        keys.update(dataset_name=str(PROMPTS), total_episodes=4, per_device_train_batch_size=2,
                    local_rollout_forward_batch_size=2, num_mini_batches=1, num_ppo_epochs=1, response_length=4,
                    num_sample_generations=0, logging_steps=1)
    if trainer == "ppo":  # separate models: a frozen reward model (4-bit, no LoRA, or full) and a LoRA value model
        keys.update(reward_model_path=paths["reward"], reward_use_peft=False, value_use_peft=True,
                    value_lora_target_modules="all-linear", value_lora_r=4)
        keys.update(reward_load_in_4bit=quant == "4bit", value_load_in_4bit=quant == "4bit")
    if trainer == "ppo_shared":
        keys.update(shared_base=True, reward_model_path=paths["adapter"])
    return keys


def run_recipe(tmp_path, keys):
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(keys))
    return run(resolve_recipe(path))


def trained_models(trainer):
    """The models a trainer holds: (model, trainable-checked) pairs."""
    models = [trainer.model]
    for name in ("reward_model", "ref_model"):
        if getattr(trainer, name, None) is not None:
            models.append(getattr(trainer, name))
    return models


def first_losses(trainer):
    keys = ("loss", "loss/policy_avg", "objective/scores")
    return [h[k] for h in trainer.state.log_history for k in keys if k in h]


CASES = [(t, q, d) for t in ("sft", "reward", "dpo", "ppo", "ppo_shared")
         for q, d in (("4bit", "float16"), ("none", "bfloat16"))]


@pytest.mark.parametrize("trainer_kind,quant,dtype", CASES, ids=[f"{t}-{q}-{d}" for t, q, d in CASES])
def test_every_trainer_runs_a_bfloat16_checkpoint_without_autocast(bf16_checkpoints, tmp_path, trainer_kind, quant,
                                                                    dtype):
    """bf16: false on CPU: no autocast anywhere; the score heads, the reference pass and the rollout must agree."""
    trainer = run_recipe(tmp_path, recipe_keys(trainer_kind, bf16_checkpoints, tmp_path / "out", quant=quant,
                                               dtype=dtype))
    for model in trained_models(trainer):
        assert dtype_rule_violations(model, getattr(torch, dtype)) == []
    trainable = [p for m in trained_models(trainer) for p in m.parameters() if p.requires_grad]
    assert trainable and all(p.dtype == torch.float32 for p in trainable)  # LoRA weights and trained heads
    losses = first_losses(trainer)
    assert losses and all(math.isfinite(v) for v in losses)


FP16_CASES = [("sft", "none", False), ("reward", "none", True), ("dpo", "4bit", True), ("ppo", "none", True),
              ("ppo_shared", "4bit", True)]


@pytest.mark.parametrize("trainer_kind,quant,peft", FP16_CASES, ids=[f"{t}-{q}-{'lora' if p else 'full'}"
                                                                     for t, q, p in FP16_CASES])
def test_fp16_mixed_precision_trains_float32_parameters_only(bf16_checkpoints, tmp_path, trainer_kind, quant, peft):
    """fp16: true: the loss scaler unscales float32 gradients only (a bfloat16/float16 trainable tensor fails on GPU
    with "_amp_foreach_non_finite_check_and_unscale_cuda not implemented for 'BFloat16'")."""
    keys = recipe_keys(trainer_kind, bf16_checkpoints, tmp_path / "out", quant=quant, dtype="float16")
    keys.update(fp16=True)
    if not peft:
        keys.update(use_peft=False)
    trainer = run_recipe(tmp_path, keys)
    for model in trained_models(trainer):
        assert dtype_rule_violations(model, torch.float16, fp16=True) == []
    frozen = [p.dtype for m in trained_models(trainer) for p in m.parameters() if not p.requires_grad]
    assert not peft or torch.float16 in frozen or quant == "4bit"  # frozen weights keep the requested dtype
    assert all(math.isfinite(v) for v in first_losses(trainer))


# --------------------------------------------------------------------------------------------------------------
# upcast_non_quantized: false (a bfloat16 residual stream under a quantized base)


def norm_and_embedding_dtypes(model):
    return {str(p.dtype).removeprefix("torch.") for n, p in model.named_parameters()
            if any(k in n for k in ("embed_tokens", "norm", "lm_head")) or (n.endswith("score.weight"))}


@pytest.mark.parametrize("bits", ["4bit", "8bit"])
def test_without_upcast_the_unquantized_weights_and_the_residual_stream_stay_in_the_compute_dtype(
        bf16_checkpoints, tokenizer, bits):
    ids = lm_batch(tokenizer)
    for upcast, expected in ((True, torch.float32), (False, torch.bfloat16)):
        args = ModelConfig(model_name_or_path=bf16_checkpoints["policy"], dtype="bfloat16", **LORA,
                           **{f"load_in_{bits}": True})
        policy = load_policy(args, upcast_non_quantized=upcast)
        assert norm_and_embedding_dtypes(policy) == {str(expected).removeprefix("torch.")}
        assert {p.dtype for p in policy.parameters() if p.requires_grad} == {torch.float32}  # LoRA weights
        out = policy(input_ids=ids, labels=ids, output_hidden_states=True)
        assert out.hidden_states[-1].dtype == expected and out.logits.dtype == expected
        scalar = load_scalar_model(args, upcast_non_quantized=upcast)
        head = scalar.base_model.model.score.modules_to_save["default"]
        assert head.weight.dtype == torch.float32 and head.weight.requires_grad  # a trained head: float32
        assert scalar(input_ids=ids).logits.dtype == torch.float32
        frozen = load_scalar_model(ModelConfig(model_name_or_path=bf16_checkpoints["reward"], dtype="bfloat16",
                                               **{f"load_in_{bits}": True}), upcast_non_quantized=upcast)
        assert frozen.score.weight.dtype == expected and not any(p.requires_grad for p in frozen.parameters())
        assert dtype_rule_violations(policy, torch.bfloat16) == dtype_rule_violations(scalar, torch.bfloat16) == []


def test_without_upcast_lora_gradients_match_a_float32_reference_within_bfloat16_tolerance(bf16_checkpoints,
                                                                                          tokenizer):
    """The float32 reference: the same LoRA model unquantized, with the 4-bit layers' dequantized weights, in
    float32 throughout. With the upcast the 4-bit matmuls already run in bfloat16; without it the residual stream
    does too: the error grows, but stays at bfloat16's scale (wrong gradients, as the CPU repacking trap gives,
    are off by ~1)."""
    from test_models import fp32_twin, lora_grads, max_rel_err, randomize_lora_b

    ids = lm_batch(tokenizer)
    lora = dict(LORA, lora_target_modules=["all-linear"])
    errors = {}
    for loader in (load_policy, load_scalar_model):
        for upcast in (True, False):
            args = ModelConfig(model_name_or_path=bf16_checkpoints["policy"], dtype="bfloat16", load_in_4bit=True,
                               **lora)
            qmodel = loader(args, upcast_non_quantized=upcast)
            randomize_lora_b(qmodel)
            twin = fp32_twin(qmodel, loader(ModelConfig(model_name_or_path=bf16_checkpoints["policy"],
                                                        dtype="float32", **lora)))
            expected = lora_grads(twin, ids)
            grads = lora_grads(qmodel, ids)
            assert all(g.dtype == torch.float32 for g in grads.values())
            errors[loader.__name__, upcast] = max_rel_err(grads, expected)
    for (name, upcast), err in errors.items():
        assert 0 < err < 0.05, errors  # bfloat16 carries 8 significant bits: ~0.4 % per rounding


@pytest.mark.parametrize("reentrant", [False, True])
def test_without_upcast_gradient_checkpointing_keeps_gradients(bf16_checkpoints, tokenizer, reentrant):
    from test_models import lora_grads, randomize_lora_b

    ids = lm_batch(tokenizer)
    args = ModelConfig(model_name_or_path=bf16_checkpoints["policy"], dtype="bfloat16", load_in_4bit=True, **LORA)
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same LoRA A initialisation
        model = load_policy(args, upcast_non_quantized=False, gradient_checkpointing=checkpointing,
                            gradient_checkpointing_kwargs={"use_reentrant": reentrant})
        assert model.get_base_model().is_gradient_checkpointing == checkpointing
        randomize_lora_b(model)
        grads.append(lora_grads(model, ids))
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=0)


@pytest.mark.parametrize("trainer_kind", ["ppo", "ppo_shared"])
def test_4bit_ppo_runs_with_a_bfloat16_residual_stream(bf16_checkpoints, tmp_path, trainer_kind):
    keys = recipe_keys(trainer_kind, bf16_checkpoints, tmp_path / "out", quant="4bit", dtype="bfloat16")
    keys.update(upcast_non_quantized=False, gradient_checkpointing=True)
    trainer = run_recipe(tmp_path, keys)
    policy = trainer.accelerator.unwrap_model(trainer.model).policy
    assert norm_and_embedding_dtypes(policy.get_base_model()) == {"bfloat16"}
    value = trainer.accelerator.unwrap_model(trainer.model).value_model
    reward = trainer.reward_model
    if trainer_kind == "ppo":  # separate 4-bit reward (frozen) and value (LoRA) models: bfloat16 backbones too
        assert reward.model.embed_tokens.weight.dtype == torch.bfloat16 and reward.score.weight.dtype == torch.bfloat16
        assert value.get_base_model().model.embed_tokens.weight.dtype == torch.bfloat16
    for model in trained_models(trainer):
        assert dtype_rule_violations(model, torch.bfloat16) == []
    states = [s for s in trainer.optimizer.state.values() if "exp_avg" in s]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
    assert {p.dtype for g in trainer.optimizer.param_groups for p in g["params"]} == {torch.float32}
    assert all(math.isfinite(v) for v in first_losses(trainer)) and first_losses(trainer)
