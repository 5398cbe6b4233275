"""rollout_engine (trl_ext.ppo.rollout.engine): continuous batching gives generate's tokens on greedy decoding, the
trainer's log-probs on sampling (or recomputes them when top-k/top-p reshape sampling), keeps the run's RNG and cache,
trains (GAE on a shared base, RLOO), and what it cannot run is refused in one line."""

from __future__ import annotations

import pytest
import torch

from ppo_helpers import config_kwargs, prompt_dataset, seed_all, update_logs
from trl_ext.errors import UserInputError
from trl_ext.ppo.memory.budget import ModelShape, kv_cache_bytes
from trl_ext.ppo.rollout.engine import (
    AUTO_MIN_RESPONSE_LENGTH,
    LOGPROB_TOLERANCE,
    ContinuousBatchingRollout,
    choose_rollout_engine,
    engine_cache_plan,
    engine_logprobs_usable,
    has_continuous_batching,
    teacher_forced_logprobs,
)
from trl_ext.ppo.rollout.sequences import first_true_indices, truncate_response

if not has_continuous_batching():
    pytest.skip("transformers without the continuous batching trl-ext drives", allow_module_level=True)

TEXTS = ["hello world the", "a b", "the quick brown fox jumps", "x", "one two three four five six", "b a"]


@pytest.fixture(scope="module")
def lora_policy(tiny_models, tok):
    """The tiny causal LM with a non-zero LoRA adapter (so the adapter changes the tokens), stopping at EOS."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    model.generation_config.eos_token_id = tok.eos_token_id
    return get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))


def queries(tok):
    return tok(TEXTS, padding=True, return_tensors="pt")["input_ids"]


def valid_positions(query_responses, context_length, tok):
    """The response positions the trainer keeps (up to the stop token, before the first pad): `score_rollouts`'s
    `~padding_mask`."""
    responses = truncate_response(tok.eos_token_id, tok.pad_token_id, query_responses[:, context_length:])
    lengths = first_true_indices(responses == tok.pad_token_id) - 1
    return torch.arange(responses.shape[1]) <= lengths.unsqueeze(1)


def test_auto_rule():
    n = AUTO_MIN_RESPONSE_LENGTH
    assert choose_rollout_engine("auto", n, True).engine == "continuous_batching"
    assert choose_rollout_engine("auto", 4 * n, True).engine == "continuous_batching"
    assert choose_rollout_engine("auto", n - 1, True).engine == "generate"
    no_stop = choose_rollout_engine("auto", 4 * n, False)
    assert no_stop.engine == "generate" and "no stop token" in no_stop.describe()
    assert choose_rollout_engine("generate", 4 * n, True).engine == "generate"
    assert choose_rollout_engine("continuous_batching", 8, False).engine == "continuous_batching"
    # on CUDA auto takes generate until a GPU measurement shows continuous batching winning (0.48x on one H200)
    cuda = choose_rollout_engine("auto", 4 * n, True, device_type="cuda")
    assert cuda.engine == "generate" and "0.48x" in cuda.reason
    assert choose_rollout_engine("auto", 4 * n, True, device_type="cpu").engine == "continuous_batching"
    assert choose_rollout_engine("continuous_batching", 8, False, device_type="cuda").engine == "continuous_batching"


def test_config_refusals_in_one_line(tmp_path, monkeypatch):
    import trl_ext

    kwargs = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert trl_ext.PPOConfig(**kwargs).rollout_engine == "generate"
    with pytest.raises(UserInputError) as err:
        trl_ext.PPOConfig(rollout_engine="vllm", **kwargs)
    assert str(err.value) == ("rollout_engine: invalid choice 'vllm' (valid: one of generate, continuous_batching, "
                              "auto)")
    from trl_ext.recipe_loader.loader import resolve_recipe

    out = ["--output_dir", str(tmp_path / "out"), "--use_cpu", "true", "--reward_model_path", "tiny://reward"]
    recipe = resolve_recipe("recipes/demo/ppo.yaml", out + ["--rollout_engine", "auto"])
    assert recipe.training_args.rollout_engine == "auto"
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    with pytest.raises(UserInputError) as err:
        trl_ext.PPOConfig(rollout_engine="continuous_batching", **kwargs)
    assert "\n" not in str(err.value) and str(err.value).startswith("rollout_engine: 'continuous_batching' is not "
                                                                    "supported under DeepSpeed ZeRO-3")


def test_cache_plan_is_one_generate_chunk():
    plan = engine_cache_plan(chunk=8, prompt_length=40, response_length=100, page_size=32)
    assert (plan.num_blocks, plan.cache_tokens, plan.max_batch_tokens) == (8 * 5, 8 * 160, 40)  # 140 -> 5 pages
    kwargs = plan.config_kwargs()
    assert (kwargs["max_requests_per_batch"], kwargs["num_blocks"], kwargs["page_size"]) == (8, 40, 32)
    # the budget's KV cache of one chunk (8 x 140 tokens), plus less than one page per sequence
    shape = ModelShape(vocab_size=100, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16)
    budget = kv_cache_bytes(shape, 8, 140, 4)
    engine = kv_cache_bytes(shape, 1, plan.cache_tokens, 4)
    assert budget < engine < budget + kv_cache_bytes(shape, 8, 32, 4)


def test_greedy_gives_generates_tokens_and_the_cache_is_built_once(lora_policy, tok):
    from transformers import GenerationConfig

    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    q = queries(tok)
    config = GenerationConfig(max_new_tokens=12, do_sample=False)
    reference, _ = generate_with_logprobs(lora_policy, q, len(TEXTS), tok.pad_token_id,
                                          sampling_plan(lora_policy, config))
    engine = ContinuousBatchingRollout(engine_cache_plan(4, q.shape[1], 12))
    base = lora_policy.get_base_model()
    first, _, _ = engine.sample(base, q, tok.pad_token_id, config)
    cache = engine.manager.batch_processor.cache.cache_tensor
    second, _, _ = engine.sample(base, q, tok.pad_token_id, config)
    assert torch.equal(first, reference) and torch.equal(second, reference)
    assert engine.manager.batch_processor.cache.cache_tensor is cache  # the same cache for every rollout
    assert cache.numel() == (engine.plan.num_blocks * 32 + 2 * 32) * 2 * 2 * 2 * 16 * 4  # + 2 trash pages
    assert cache.untyped_storage().nbytes() == 0  # its memory is given back between rollouts
    assert not hasattr(base, "_cached_continuous_batching_manager") and base.config._attn_implementation == "sdpa"
    with lora_policy.disable_adapter():  # the adapter matters: without it the tokens differ
        without, _, _ = engine.sample(base, q, tok.pad_token_id, config)
    assert not torch.equal(without, reference)
    engine.close()


def test_sampled_logprobs_match_the_trainers_and_rng_is_the_runs(lora_policy, tok):
    from transformers import GenerationConfig

    q = queries(tok)
    temperature = 0.7
    config = GenerationConfig(max_new_tokens=16, do_sample=True, temperature=temperature + 1e-7, top_k=0, top_p=1.0)
    engine = ContinuousBatchingRollout(engine_cache_plan(4, q.shape[1], 16))
    base = lora_policy.get_base_model()
    torch.manual_seed(3)
    query_responses, logprobs, processors = engine.sample(base, q, tok.pad_token_id, config)
    assert engine_logprobs_usable(processors, config, temperature)
    teacher = teacher_forced_logprobs(lora_policy, query_responses, q.shape[1], tok.pad_token_id, temperature, 4)
    valid = valid_positions(query_responses, q.shape[1], tok)
    assert valid.sum() > 30 and (query_responses[:, q.shape[1]:] == tok.eos_token_id).any()  # some stop early
    assert (logprobs - teacher)[valid].abs().max() <= LOGPROB_TOLERANCE
    # resume: a fresh engine (a resumed run) samples what the running one (reused manager) samples from the same RNG
    torch.manual_seed(3)
    again, _, _ = ContinuousBatchingRollout(engine.plan).sample(base, q, tok.pad_token_id, config)
    torch.manual_seed(3)
    reused, _, _ = engine.sample(base, q, tok.pad_token_id, config)
    assert torch.equal(again, query_responses) and torch.equal(reused, query_responses)
    # new weights, same prompts: no KV of the previous rollout is reused (the prefix ledger is emptied)
    with torch.no_grad():
        for name, param in lora_policy.named_parameters():
            if "lora_B" in name:
                param.mul_(3.0)
    query_responses, logprobs, _ = engine.sample(base, q, tok.pad_token_id, config)
    teacher = teacher_forced_logprobs(lora_policy, query_responses, q.shape[1], tok.pad_token_id, temperature, 4)
    valid = valid_positions(query_responses, q.shape[1], tok)
    assert (logprobs - teacher)[valid].abs().max() <= LOGPROB_TOLERANCE
    with torch.no_grad():
        for name, param in lora_policy.named_parameters():
            if "lora_B" in name:
                param.div_(3.0)
    engine.close()


@pytest.mark.parametrize(
    ("sampling", "engine_logprobs"),
    [(dict(do_sample=True, temperature=0.7 + 1e-7), True),  # the trainer's: temperature only
     (dict(do_sample=True, temperature=1.0 + 1e-7), True),
     (dict(do_sample=True, temperature=0.7 + 1e-7, top_k=20), False),  # truncated: recomputed
     (dict(do_sample=True, temperature=0.7 + 1e-7, top_p=0.9), False),
     (dict(do_sample=True, temperature=0.5 + 1e-7), False),  # not the trainer's temperature (0.7)
     (dict(do_sample=False), False)],  # greedy: log-probs of the unscaled logits
)
def test_which_logprobs_each_config_takes(lora_policy, sampling, engine_logprobs):
    from transformers import GenerationConfig

    config = GenerationConfig(**{"max_new_tokens": 4, "top_k": 0, "top_p": 1.0, **sampling})
    processors = lora_policy.get_base_model()._get_logits_processor(config)
    temperature = 0.7 if sampling.get("temperature", 1.0) != 1.0 + 1e-7 else 1.0
    assert engine_logprobs_usable(processors, config, temperature) is engine_logprobs


def ppo_trainer(tiny_models, tok, tmp_path, trainer_class=None, **overrides):
    """A 2-update LoRA PPO run with continuous batching (critic-free unless `shared_value` is given)."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    import trl_ext

    seed_all(0)
    shared = overrides.pop("shared_adapter", None)
    reward_funcs = overrides.pop("reward_funcs", None)
    policy = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    kwargs = config_kwargs(tmp_path, num_sample_generations=0, total_episodes=8, num_ppo_epochs=1, response_length=12,
                           rollout_engine="continuous_batching")
    kwargs.update(overrides)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    if shared is not None:  # GAE on a shared base: reward and value are adapters on the policy's base
        from peft import get_peft_model

        from trl_ext.models.shared_base import add_scalar_adapter

        policy = get_peft_model(policy, peft_config)
        reward = add_scalar_adapter(policy, "reward", source=shared, trainable=False)
        value = add_scalar_adapter(policy, "value", source=shared, trainable=True)
        peft_config = None
    elif reward_funcs is not None:
        reward, value = None, None
    else:
        reward, value = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward), None
    extra = {} if reward_funcs is None else {"reward_funcs": reward_funcs}
    return (trainer_class or trl_ext.PPOTrainer)(
        args=trl_ext.PPOConfig(**kwargs), processing_class=tok, model=policy, ref_model=None, reward_model=reward,
        train_dataset=prompt_dataset(tok, n=8), value_model=value, peft_config=peft_config, **extra,
    )


def first_update_is_on_policy(trainer):
    """Before the update's optimizer step the policy is the one that sampled: ratio 1 and approximate KL 0 iff the
    rollout's old log-probs are the trainer's own; and the reference is the policy (zero LoRA B): KL 0."""
    first, second = update_logs(trainer)
    ratio = first["val/ratio"] if "val/ratio" in first else first["policy/ratio_avg"]  # GAE / critic-free names
    assert abs(ratio - 1) < 1e-5 and first["policy/approxkl_avg"] < 1e-10
    assert abs(first["objective/kl"]) < 12 * LOGPROB_TOLERANCE
    assert second["objective/kl"] != 0  # the policy moved


def test_ppo_gae_on_a_shared_base(tiny_models, tok, tmp_path, reward_adapter):
    trainer = ppo_trainer(tiny_models, tok, tmp_path, shared_adapter=reward_adapter)
    assert trainer.shared_base and trainer.rollout_engine_choice.engine == "continuous_batching"
    assert trainer.rollout_engine.plan.chunk == 2  # local_rollout_forward_batch_size 2 (of a per-device batch of 4)
    trainer.train()
    assert trainer.rollout_engine.logprobs_from_engine is True
    first_update_is_on_policy(trainer)


def test_ppo_critic_free_with_top_k_and_a_reward_function(tiny_models, tok, tmp_path):
    """top-k sampling (the `top_k` key): the engine's log-probs (of the truncated distribution) are replaced by a
    teacher-forced forward; the first update is then on-policy (TRL's PPO rollout, taking the processed scores,
    is not: ratio != 1). The reward function gets each completion's ids up to its stop token, as with generate."""
    lengths = []

    def length(completion_ids, **kwargs):
        lengths.append([len(ids) for ids in completion_ids])
        return [len(ids) / 64 for ids in completion_ids]

    trainer = ppo_trainer(tiny_models, tok, tmp_path, top_k=20, advantage_estimator="rloo",
                          num_samples_per_prompt=2, rollout_engine="auto", stop_token="eos", response_length=64,
                          reward_funcs=[length])
    assert trainer.rollout_engine_choice.engine == "continuous_batching"  # auto: stop token, 64 tokens
    trainer.train()
    assert trainer.rollout_engine.logprobs_from_engine is False
    first_update_is_on_policy(trainer)
    logs = update_logs(trainer)
    assert [len(x) for x in lengths] == [4, 4]
    for log, seen in zip(logs, lengths):
        assert log["completions/mean_length"] == pytest.approx(sum(seen) / len(seen))
        assert log["rewards/length/mean"] == pytest.approx(sum(seen) / len(seen) / 64)


def test_greedy_on_a_4bit_lora_policy(tiny_models, tok):
    """A QLoRA policy (nf4 base through bitsandbytes' CPU path, trl-ext's loader): the engine's greedy tokens are
    generate's, and its sampled log-probs the trainer's."""
    from transformers import GenerationConfig
    from trl import ModelConfig

    from trl_ext.models import load_policy
    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    policy = load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy), load_in_4bit=True, dtype="float32",
                                     use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"]),
                         tokenizer=tok)
    policy.generation_config.eos_token_id = tok.eos_token_id
    q = queries(tok)
    engine = ContinuousBatchingRollout(engine_cache_plan(4, q.shape[1], 10))
    greedy = GenerationConfig(max_new_tokens=10, do_sample=False)
    reference, _ = generate_with_logprobs(policy, q, len(TEXTS), tok.pad_token_id, sampling_plan(policy, greedy))
    tokens, _, _ = engine.sample(policy.get_base_model(), q, tok.pad_token_id, greedy)
    assert torch.equal(tokens, reference)
    sampling = GenerationConfig(max_new_tokens=10, do_sample=True, temperature=1.0 + 1e-7, top_k=0, top_p=1.0)
    torch.manual_seed(0)
    query_responses, logprobs, _ = engine.sample(policy.get_base_model(), q, tok.pad_token_id, sampling)
    teacher = teacher_forced_logprobs(policy, query_responses, q.shape[1], tok.pad_token_id, 1.0, 4)
    assert (logprobs - teacher)[valid_positions(query_responses, q.shape[1], tok)].abs().max() <= LOGPROB_TOLERANCE
    engine.close()


def test_cuda_graphs_not_applied_under_continuous_batching_is_said_once(tiny_models, tok, tmp_path, capsys):
    """`rollout_cuda_graphs: true` with `rollout_engine: auto` choosing continuous batching: no DecodeGraphs object
    (the graphs run under `generate` only) and one line that says so; with `generate` the object is built."""
    trainer = ppo_trainer(tiny_models, tok, tmp_path / "cb", rollout_engine="auto", stop_token="eos",
                          response_length=64, rollout_cuda_graphs=True, advantage_estimator="rloo",
                          num_samples_per_prompt=2)
    assert trainer.rollout_engine_choice.engine == "continuous_batching" and trainer.decode_graphs is None
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("rollout_cuda_graphs")]
    assert said == ["rollout_cuda_graphs: not applied: the rollout runs on continuous batching, and CUDA-graph "
                    "decoding applies to rollout_engine 'generate' only"]
    trainer = ppo_trainer(tiny_models, tok, tmp_path / "gen", rollout_engine="generate", rollout_cuda_graphs=True,
                          advantage_estimator="rloo", num_samples_per_prompt=2)
    assert trainer.decode_graphs is not None and trainer.decode_graphs.eager_steps == 0
    assert "rollout_cuda_graphs" not in capsys.readouterr().out
