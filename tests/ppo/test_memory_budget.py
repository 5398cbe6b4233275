"""trl_ext.ppo.memory.budget: formulas against hand-computed numbers, published parameter counts, real models, and
what benchmarks/ppo_memory.py measured at small scale."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trl_ext.ppo.memory.budget import (
    GIB,
    LLAMA_3_8B,
    QWEN2_5_0_5B,
    QWEN2_5_7B,
    STREAMING_STEP_COPIES,
    ModelShape,
    PPOShape,
    base_weight_bytes,
    held_weight_bytes,
    kv_cache_bytes,
    lora_parameters,
    ppo_memory_budget,
    rollout_scores_bytes,
)

MIB = 2**20
# one layer, hidden 64, 4 heads (q 64) and 2 kv heads of 16 (k, v 32 each), MLP 128, vocabulary 100
TINY = ModelShape(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=2,
                  head_dim=16)


def test_parameter_counts_are_the_published_ones():
    assert LLAMA_3_8B.parameters == 8_030_261_248
    assert QWEN2_5_7B.parameters == 7_615_616_512
    assert QWEN2_5_0_5B.parameters == 494_032_768


def test_shape_from_a_transformers_config():
    from transformers import Qwen2Config

    config = Qwen2Config(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False)
    assert ModelShape.from_config(config, name="Qwen2.5-7B") == QWEN2_5_7B


def test_weight_bytes_by_hand():
    # linear weights: q 64*64 + k, v 64*32 each + o 64*64 + gate, up, down 64*128 each = 36864
    # others: embeddings 6400 + LM head 6400 + 3 norms of 64 = 12992, float32 when quantized
    assert TINY.linear_parameters == 36_864 and TINY.other_parameters() == 12_992
    assert base_weight_bytes(TINY, "nf4") == 36_864 // 2 + 36_864 // 64 * 4 + 12_992 * 4 == 72_704
    assert base_weight_bytes(TINY, "nf4", lm_head=False) == 20_736 + 6_592 * 4
    assert base_weight_bytes(TINY, "nf4-nested") == 18_432 + 576 + 2 * 4 + 51_968
    assert base_weight_bytes(TINY, "int8") == 36_864 + (64 + 32 + 32 + 64 + 128 + 128 + 64) * 4 + 51_968
    assert base_weight_bytes(TINY, None, dtype_bytes=2) == (36_864 + 12_992) * 2
    # LoRA r 4: 4 * (in + out) per linear layer
    assert lora_parameters(TINY, 4) == 4 * (128 + 96 + 96 + 128 + 192 + 192 + 192) == 4096
    assert lora_parameters(TINY, 4, ("q_proj", "v_proj")) == 4 * (128 + 96)
    assert kv_cache_bytes(TINY, batch=3, seq_len=10, bytes_per_value=2) == 2 * 1 * 3 * 2 * 16 * 10 * 2
    assert rollout_scores_bytes(64, 512, 151_936) == 64 * 512 * 151_936 * 4  # ~18.5 GiB, Qwen2.5's vocabulary


def test_weight_and_lora_formulas_match_a_loaded_4bit_lora_model(tiny_models, tokenizer):
    from transformers import AutoConfig
    from trl import ModelConfig

    from trl_ext.models import load_policy

    shape = ModelShape.from_config(AutoConfig.from_pretrained(tiny_models.policy))
    model = load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy), load_in_4bit=True, dtype="float32",
                                    use_peft=True, lora_r=4, lora_target_modules=["all-linear"]), tokenizer=tokenizer)
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert lora == lora_parameters(shape, 4)
    held = held_weight_bytes(model)
    predicted = base_weight_bytes(shape, "nf4") + lora * 4
    # not in the formula: bitsandbytes' 16-entry float32 nf4 code per quantized layer, the rotary inv_freq buffers
    code_tables, rotary = 14 * 16 * 4, 2 * (shape.head_dim // 2) * 4
    assert held == predicted + code_tables + rotary


def test_formulas_against_what_the_benchmark_measured():
    """Figures of benchmarks/ppo_memory.py (benchmarks/README.md, section 5): rollout peak growth at 512 new tokens,
    batch 4, vocabulary 151,936, bfloat16 model with 2 layers of 2 kv heads of 64 (MiB)."""
    shape = ModelShape(vocab_size=151_936, hidden_size=256, intermediate_size=512, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=64)
    kv = kv_cache_bytes(shape, 4, 32 + 512, 2) / MIB
    trl = 2 * rollout_scores_bytes(4, 512, 151_936) / MIB + kv
    streamed = STREAMING_STEP_COPIES * 4 * 151_936 * 4 / MIB + kv
    measured_trl, measured_streamed = MEASURED_ROLLOUT_512
    assert measured_trl == pytest.approx(trl, rel=0.05)
    assert measured_streamed == pytest.approx(streamed, rel=0.2)


MEASURED_ROLLOUT_512 = (2380.2, 16.1)  # TRL's rollout, trl_ext's rollout; MiB, benchmarks/README.md section 5


def test_budget_of_llama_3_8b_in_4_bit_with_lora():
    run = PPOShape(batch=64, micro_batch=2, rollout_chunk=8, prompt_length=512, response_length=64, lora_r=32)
    today = ppo_memory_budget(LLAMA_3_8B, replace(run, streaming_logprobs=False), shared=False)
    shared = ppo_memory_budget(LLAMA_3_8B, run, shared=True)
    # the shared base drops two 4-bit bases without LM head; adapters and optimizer are the same
    two_bases = 2 * base_weight_bytes(LLAMA_3_8B, "nf4", lm_head=False)
    assert today.persistent - shared.persistent == two_bases
    assert today.parts["base weights"] / GIB == pytest.approx(18.80, abs=0.01)
    # TRL's rollout holds its stacked scores twice (stack + per-step tuple, then the padded batch)
    assert today.parts["rollout: log-probs"] == 2 * 64 * 64 * LLAMA_3_8B.vocab_size * 4
    assert shared.parts["rollout: log-probs"] == STREAMING_STEP_COPIES * 8 * LLAMA_3_8B.vocab_size * 4
    assert shared.fits(24 * GIB) and not today.fits(24 * GIB)
    # at 512 new tokens the stacked scores alone (31 GiB) rule today's rollout out; the streamed one does not grow
    long = replace(run, response_length=512)
    assert ppo_memory_budget(LLAMA_3_8B, replace(long, streaming_logprobs=False), shared=True).phases["rollout"] \
        > 31 * GIB
    assert ppo_memory_budget(LLAMA_3_8B, long, shared=True).parts["rollout: log-probs"] \
        == shared.parts["rollout: log-probs"]


def test_shape_of_a_run_from_its_configs(tmp_path):
    from trl import ModelConfig

    import trl_ext

    args = trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=8,
                             gradient_accumulation_steps=8, response_length=64)
    model_args = ModelConfig(model_name_or_path="x", load_in_4bit=True, use_bnb_nested_quant=True, lora_r=32,
                             dtype="bfloat16", use_peft=True)
    run = PPOShape.from_config(args, model_args, prompt_length=512)
    assert (run.batch, run.micro_batch, run.rollout_chunk, run.seq_len) == (64, 8, 64, 576)
    assert (run.quantization, run.lora_r, run.activation_bytes) == ("nf4-nested", 32, 4)
    model_args.upcast_non_quantized = False  # the loader's recipe key, where the installed ModelConfig lacks it
    assert PPOShape.from_config(args, model_args, prompt_length=512).activation_bytes == 2
    assert PPOShape.from_config(trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none",
                                                  num_mini_batches=2), model_args, 16).batch == 8 * 1 * 2


def test_residual_stream_in_the_compute_dtype_by_hand():
    """`upcast_non_quantized=False`: embeddings, LM head and norms of a quantized base stay bfloat16 (2 bytes), and
    so do the residual stream, KV cache and activations."""
    assert base_weight_bytes(TINY, "nf4", dtype_bytes=2, upcast_non_quantized=False) == 18_432 + 576 * 4 + 12_992 * 2
    assert base_weight_bytes(TINY, "nf4", dtype_bytes=2) == 72_704  # today's float32 upcast
    # unquantized bases never upcast: the flag changes nothing there
    assert base_weight_bytes(TINY, None, dtype_bytes=2, upcast_non_quantized=False) == (36_864 + 12_992) * 2
    run = PPOShape(batch=4, micro_batch=2, rollout_chunk=2, prompt_length=6, response_length=4, lora_r=4)
    bf16 = replace(run, upcast_non_quantized=False)
    assert (run.activation_bytes, bf16.activation_bytes) == (4, 2)
    today, fast = ppo_memory_budget(TINY, run, shared=True), ppo_memory_budget(TINY, bf16, shared=True)
    assert today.parts["base weights"] - fast.parts["base weights"] == 12_992 * 2
    assert fast.parts["rollout: KV cache (one chunk)"] == 2 * 1 * 2 * 2 * 16 * 10 * 2 == 2560
    assert today.parts["rollout: KV cache (one chunk)"] == 2 * fast.parts["rollout: KV cache (one chunk)"]
    # training: checkpointed inputs 2 models x 1 layer x 2 seqs x 10 tokens x 64 x 2 bytes; one layer's
    # activations (4*64 + 2*32 + 64 + 3*128 = 768 values per token) twice; logits 3 copies x 2 x 10 x 100 x 2 bytes
    assert fast.parts["training: checkpointed layer inputs (policy + value)"] == 2 * 2 * 10 * 64 * 2
    assert fast.parts["training: one layer recomputed, with gradients"] == 2 * 2 * 10 * 768 * 2
    assert fast.parts["training: policy logits (one micro-batch)"] == 3 * 2 * (4 + 1) * 100 * 2
    # LoRA weights and their AdamW moments stay float32
    assert fast.parts["AdamW moments (policy and value adapters, value head)"] == (2 * 4096 + 64) * 8
    # Llama-3-8B: embeddings, LM head and norms (1,050,939,392 parameters) at 2 bytes instead of 4: 1.96 GiB less
    eight_b = PPOShape(batch=64, micro_batch=2, rollout_chunk=8, prompt_length=512, response_length=64, lora_r=32)
    saved = ppo_memory_budget(LLAMA_3_8B, eight_b, shared=True).parts["base weights"] - ppo_memory_budget(
        LLAMA_3_8B, replace(eight_b, upcast_non_quantized=False), shared=True).parts["base weights"]
    assert saved == 1_050_939_392 * 2 and saved / GIB == pytest.approx(1.96, abs=0.01)


def test_run_without_a_critic_by_hand():
    """`value_model=False`: no value base (separate design), adapter, head, AdamW state or value activations."""
    run = PPOShape(batch=4, micro_batch=2, rollout_chunk=2, prompt_length=6, response_length=4, lora_r=4,
                   quantization="nf4", dtype_bytes=4)
    with_critic = ppo_memory_budget(TINY, run, shared=False)
    critic_free = ppo_memory_budget(TINY, run, shared=False, value_model=False)
    scalar_base = 20_736 + 6_592 * 4  # 4-bit layers + float32 embeddings and norms, no LM head
    assert critic_free.parts["base weights"] == 72_704 + scalar_base
    assert with_critic.parts["base weights"] == 72_704 + 2 * scalar_base
    # policy and reward adapters (float32) and the reward head; AdamW: the policy adapter only
    assert critic_free.parts["LoRA adapters + score heads (policy, reward, value)"] == 2 * 4096 * 4 + 64 * 4
    assert critic_free.parts["AdamW moments (policy and value adapters, value head)"] == 4096 * 8
    assert critic_free.parts["training: gradients + AdamW step temporaries"] == 4096 * 12
    assert critic_free.parts["training: checkpointed layer inputs (policy + value)"] == 1 * 2 * 10 * 64 * 4
    assert critic_free.parts["training: one layer recomputed, with gradients"] == 2 * 10 * 768 * 4
    assert critic_free.parts["training: policy logits (one micro-batch)"] \
        == with_critic.parts["training: policy logits (one micro-batch)"] == 3 * 2 * (4 + 1) * 100 * 4
    # rollout and scoring do not depend on the critic
    for part in ("rollout: KV cache (one chunk)", "scoring: reference logits held at once"):
        assert critic_free.parts[part] == with_critic.parts[part]
    assert critic_free.design == "separate models, no critic"
    shared_free = ppo_memory_budget(TINY, run, shared=True, value_model=False)
    assert shared_free.parts["base weights"] == 72_704


def test_run_with_reward_functions_only_by_hand():
    """`reward_model=False` (reward functions only): no reward base (separate design), adapter or head; the value
    model, its AdamW state and every phase stay as they are."""
    run = PPOShape(batch=4, micro_batch=2, rollout_chunk=2, prompt_length=6, response_length=4, lora_r=4,
                   quantization="nf4", dtype_bytes=4)
    full = ppo_memory_budget(TINY, run, shared=False)
    no_reward = ppo_memory_budget(TINY, run, shared=False, reward_model=False)
    scalar_base = 20_736 + 6_592 * 4  # as above: one scalar-headed base of the tiny shape in 4-bit
    assert no_reward.parts["base weights"] == 72_704 + scalar_base  # policy + value
    # policy and value adapters (float32) and the value head; AdamW unchanged (the reward model is frozen)
    assert no_reward.parts["LoRA adapters + score heads (policy, reward, value)"] == 2 * 4096 * 4 + 64 * 4
    assert full.parts["LoRA adapters + score heads (policy, reward, value)"] == 3 * 4096 * 4 + 2 * 64 * 4
    assert no_reward.parts["AdamW moments (policy and value adapters, value head)"] \
        == full.parts["AdamW moments (policy and value adapters, value head)"]
    assert no_reward.phases == full.phases
    assert full.peak - no_reward.peak == scalar_base + 4096 * 4 + 64 * 4
    assert no_reward.design == "separate models, no reward model"
    # neither a reward nor a value model: the policy alone
    alone = ppo_memory_budget(TINY, run, shared=False, value_model=False, reward_model=False)
    assert alone.parts["base weights"] == 72_704
    assert alone.parts["LoRA adapters + score heads (policy, reward, value)"] == 4096 * 4
    shared = ppo_memory_budget(TINY, run, shared=True, reward_model=False)
    assert shared.parts["base weights"] == 72_704
    assert shared.parts["LoRA adapters + score heads (policy, reward, value)"] == 2 * 4096 * 4 + 64 * 4
