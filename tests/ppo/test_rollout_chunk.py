"""local_rollout_forward_batch_size: auto (trl_ext.ppo.memory.chunk): the chosen chunk fits the memory target and the
next larger one does not, on the budget's formulas and on a real trainer with tiny models."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ppo_helpers import config_kwargs, prompt_dataset, seed_all, update_logs
from trl_ext.errors import UserInputError
from trl_ext.ppo.memory.budget import GIB, ModelShape, PPOShape, ppo_memory_budget
from trl_ext.ppo.memory.chunk import largest_fitting_chunk, rollout_chunk_value

TINY = ModelShape(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=2,
                  head_dim=16)
RUN = PPOShape(batch=16, micro_batch=2, rollout_chunk=1, prompt_length=6, response_length=4, lora_r=4)


def peak(shape, run, chunk, **kw):
    return ppo_memory_budget(shape, replace(run, rollout_chunk=chunk), shared=kw.pop("shared", True), **kw).peak


def test_values_of_the_field():
    assert rollout_chunk_value("auto") == "auto" and rollout_chunk_value(" AUTO ") == "auto"
    assert rollout_chunk_value("16") == 16 and rollout_chunk_value(8) == 8
    for bad in ("x", 0, -2, "1.5", True):
        with pytest.raises(UserInputError, match="local_rollout_forward_batch_size: must be a positive integer"):
            rollout_chunk_value(bad)


def test_chosen_chunk_fits_and_the_next_does_not():
    # from 8 sequences on the scoring phase is the largest; it grows by (100 vocab x 5 response positions + 768
    # layer values x 10 tokens) x 4 bytes per sequence; below, training is the largest and the peak stays flat
    assert peak(TINY, RUN, 9) - peak(TINY, RUN, 8) == (5 * 100 + 10 * 768) * 4
    assert peak(TINY, RUN, 1) == peak(TINY, RUN, 7) < peak(TINY, RUN, 8)
    assert largest_fitting_chunk(TINY, RUN, peak(TINY, RUN, 1), shared=True).chunk == 7
    for c in (8, 11, 15):
        for target in (peak(TINY, RUN, c), peak(TINY, RUN, c + 1) - 1):
            choice = largest_fitting_chunk(TINY, RUN, target, shared=True)
            assert choice.chunk == c
            assert choice.budget.peak <= target < choice.next_budget.peak
            assert choice.next_budget.peak == peak(TINY, RUN, c + 1)
    # capped at the per-device batch
    capped = largest_fitting_chunk(TINY, RUN, 100 * GIB, shared=True)
    assert capped.chunk == 16 and capped.next_budget is None
    assert "the whole per-device batch" in capped.describe()
    # a run without a critic leaves room for a larger chunk at the same target
    target = peak(TINY, RUN, 10, shared=False)
    assert largest_fitting_chunk(TINY, RUN, target, shared=False).chunk == 10
    # no value base (47,104 bytes), adapter (16,384), head (256), AdamW state (33,280): 97,024 bytes = 2.8 sequences
    assert largest_fitting_chunk(TINY, RUN, target, shared=False, value_model=False).chunk == 12
    # bfloat16 residual stream: half the bytes per chunk, a larger chunk at the same target
    fast = replace(RUN, quantization="nf4", dtype_bytes=2, upcast_non_quantized=False)
    slow = replace(fast, upcast_non_quantized=True)
    target = peak(TINY, slow, 10)
    assert largest_fitting_chunk(TINY, slow, target, shared=True).chunk == 10
    assert largest_fitting_chunk(TINY, fast, target, shared=True).chunk == 16


def test_impossible_target_is_refused_in_one_line():
    target = peak(TINY, RUN, 1) - 1
    with pytest.raises(UserInputError) as err:
        largest_fitting_chunk(TINY, RUN, target, shared=True)
    message = str(err.value)
    assert "\n" not in message and message.startswith("max_memory_gib: ")
    assert f"({peak(TINY, RUN, 1) / GIB:.2f} GiB predicted" in message


def test_config_checks(tmp_path):
    import trl_ext

    kwargs = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    with pytest.raises(UserInputError, match="'auto' on CPU .* needs max_memory_gib"):
        trl_ext.PPOConfig(local_rollout_forward_batch_size="auto", **kwargs)
    with pytest.raises(UserInputError, match=r"max_memory_gib: 0 is out of range \(valid: a number > 0\)"):
        trl_ext.PPOConfig(local_rollout_forward_batch_size="auto", max_memory_gib=0, **kwargs)
    args = trl_ext.PPOConfig(local_rollout_forward_batch_size="auto", max_memory_gib=1.5, **kwargs)
    assert (args.local_rollout_forward_batch_size, args.max_memory_gib) == ("auto", 1.5)
    assert trl_ext.PPOConfig(**kwargs).local_rollout_forward_batch_size == 64  # TRL's default, an int


def test_recipe_key(tmp_path):
    from trl_ext.recipe_loader.loader import resolve_recipe

    out = ["--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--reward_model_path", "tiny://reward"]
    recipe = resolve_recipe("recipes/demo/ppo.yaml", out + ["--local_rollout_forward_batch_size", "auto",
                                                             "--max_memory_gib", "2"])
    assert recipe.training_args.local_rollout_forward_batch_size == "auto"
    assert recipe.training_args.max_memory_gib == 2.0
    assert resolve_recipe("recipes/demo/ppo.yaml", out + ["--local_rollout_forward_batch_size", "3"]) \
        .training_args.local_rollout_forward_batch_size == 3
    with pytest.raises(UserInputError) as err:
        resolve_recipe("recipes/demo/ppo.yaml", out + ["--local_rollout_forward_batch_size", "many"])
    assert "must be a positive integer or 'auto', got 'many'" in str(err.value)


def make_trainer(tiny_models, tok, tmp_path, **overrides):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    import trl_ext

    seed_all(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    value = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    reward = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    # 8 episodes per update in micro-batches of 1: the scoring phase is the budget's largest from 4 sequences on
    kwargs = config_kwargs(tmp_path, num_sample_generations=0, total_episodes=8, num_ppo_epochs=1,
                           per_device_train_batch_size=1, gradient_accumulation_steps=8)
    kwargs.update(overrides)
    return trl_ext.PPOTrainer(
        args=trl_ext.PPOConfig(**kwargs), processing_class=tok, model=policy, ref_model=None, reward_model=reward,
        train_dataset=prompt_dataset(tok, n=8), value_model=value,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )


def test_trainer_resolves_auto_from_the_loaded_models(tiny_models, tok, tmp_path):
    """On the tiny LoRA run (8 episodes per update per device): the trainer's chunk is the largest whose budget,
    computed here from the checkpoint's config and the run's settings by hand, fits the target; training with it
    logs exactly what the same integer chunk logs."""
    from transformers import AutoConfig

    shape = ModelShape.from_config(AutoConfig.from_pretrained(tiny_models.policy))
    longest = max(len(ids) for ids in prompt_dataset(tok, n=8)["input_ids"])
    run = PPOShape(batch=8, micro_batch=1, rollout_chunk=1, prompt_length=longest, response_length=8, lora_r=4,
                   quantization=None, lora_modules=("q_proj", "v_proj"), dtype_bytes=4)
    p = {c: peak(shape, run, c, shared=False) for c in (4, 5, 6)}  # separate policy, reward and value models
    assert p[4] < p[5] < p[6]
    target = (p[5] + p[6]) // 2  # 5 fits, 6 does not
    trainer = make_trainer(tiny_models, tok, tmp_path / "auto", local_rollout_forward_batch_size="auto",
                           max_memory_gib=target / GIB)
    choice = trainer.rollout_chunk_choice
    assert trainer.args.local_rollout_forward_batch_size == choice.chunk == 5
    assert choice.budget.peak == p[5] <= choice.target_bytes < choice.next_budget.peak == p[6]
    trainer.train()
    fixed = make_trainer(tiny_models, tok, tmp_path / "fixed", local_rollout_forward_batch_size=5)
    fixed.train()
    assert update_logs(trainer) and [{k: v for k, v in e.items() if not k.startswith(("time/", "eps"))}
                                     for e in update_logs(trainer)] \
        == [{k: v for k, v in e.items() if not k.startswith(("time/", "eps"))} for e in update_logs(fixed)]
    # at the whole batch: capped
    big = make_trainer(tiny_models, tok, tmp_path / "big", local_rollout_forward_batch_size="auto", max_memory_gib=64)
    assert big.args.local_rollout_forward_batch_size == 8


def test_trainer_refuses_auto_without_lora_or_target(tiny_models, tok, tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    import trl_ext

    with pytest.raises(UserInputError, match=r"max_memory_gib: 0\.00 GiB is less than this run needs"):
        make_trainer(tiny_models, tok, tmp_path / "small", local_rollout_forward_batch_size="auto",
                     max_memory_gib=0.001)
    policy = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    value = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    with pytest.raises(UserInputError, match="'auto' needs a LoRA policy"):
        trl_ext.PPOTrainer(
            args=trl_ext.PPOConfig(**config_kwargs(tmp_path / "full", local_rollout_forward_batch_size="auto",
                                                   max_memory_gib=4)),
            processing_class=tok, model=policy, ref_model=None, reward_model=value, value_model=value,
            train_dataset=prompt_dataset(tok, n=8),
        )


def test_shape_of_a_loaded_4bit_lora_policy(tiny_models, tokenizer, tmp_path):
    """What `auto` reads from a QLoRA policy: nf4 (nested), LoRA rank and modules, compute dtype, float32 upcast."""
    from transformers import AutoConfig
    from trl import ModelConfig

    import trl_ext
    from trl_ext.models import load_policy
    from trl_ext.ppo.memory.chunk import run_shape_from_models

    policy = load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy), load_in_4bit=True, dtype="bfloat16",
                                     use_bnb_nested_quant=True, use_peft=True, lora_r=8,
                                     lora_target_modules=["q_proj", "k_proj", "down_proj"]), tokenizer=tokenizer)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, per_device_train_batch_size=2, gradient_accumulation_steps=3,
                                             num_mini_batches=2, response_length=5))
    args.local_batch_size = 12  # set by the trainer: 2 x 3 x 2
    shape, run = run_shape_from_models(policy, args, prompt_length=7)
    assert replace(shape, name="") == replace(ModelShape.from_config(AutoConfig.from_pretrained(tiny_models.policy)),
                                              name="")
    assert (run.quantization, run.lora_r, run.lora_modules) == ("nf4-nested", 8, ("q_proj", "k_proj", "down_proj"))
    assert (run.batch, run.micro_batch, run.prompt_length, run.response_length) == (12, 2, 7, 5)
    # bfloat16 compute, embeddings upcast to float32 by peft's k-bit preparation: a float32 residual stream
    assert (run.dtype_bytes, run.upcast_non_quantized, run.activation_bytes) == (2, True, 4)
