"""PPOConfig.from_grpo_config: every GRPOConfig field is mapped, passed through or named as not honoured; the values
it maps; what it refuses and what it warns about (trl_ext/ppo/grpo_compat/from_grpo.py)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

from trl_ext.errors import UserInputError


def grpo(tmp_path, **keys):
    from trl import GRPOConfig

    base = dict(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=8,
                num_generations=4, max_completion_length=16, max_grad_norm=0.0)
    return GRPOConfig(**{**base, **keys})


def convert(config, **overrides):
    import trl_ext

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ppo = trl_ext.PPOConfig.from_grpo_config(config, **overrides)
    ours = [str(w.message) for w in caught if str(w.message).startswith("GRPOConfig:")]
    return ppo, ours


def test_every_grpo_field_is_mapped_passed_through_or_not_honoured():
    """A field a new TRL adds to GRPOConfig fails here until from_grpo.py places it."""
    from transformers import TrainingArguments
    from trl import GRPOConfig

    from trl_ext.ppo.grpo_compat.from_grpo import MAPPED, NOT_HONOURED, REFUSED, WARNED, not_honoured

    training_arguments = {f.name for f in dataclasses.fields(TrainingArguments)}
    unplaced = [f.name for f in dataclasses.fields(GRPOConfig)
                if f.name not in MAPPED and not not_honoured(f.name) and f.name not in training_arguments]
    assert unplaced == []
    assert not set(MAPPED) & NOT_HONOURED and not set(REFUSED) & set(WARNED)
    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert {"num_generations", "beta", "loss_type", "use_vllm", "top_p"} <= grpo_fields
    # every listed key is a real GRPOConfig field (no stale names), TrainingArguments ones included
    assert set(MAPPED) - grpo_fields == set() and (set(REFUSED) | set(WARNED)) - grpo_fields == set()


def test_trl_defaults(tmp_path):
    """TRL 1.16's defaults (loss_type dapo, beta 0, epsilon 0.2, scale_rewards group, temperature 1, k = 8 ...)."""
    config = grpo(tmp_path, per_device_train_batch_size=8, num_generations=8, max_completion_length=512)
    ppo, warned = convert(config)
    assert warned == []
    assert (ppo.advantage_estimator, ppo.num_samples_per_prompt, ppo.kl_in, ppo.kl_coef) == ("grpo", 8, "loss", 0.0)
    assert (ppo.loss_aggregation, ppo.policy_loss, ppo.cliprange, ppo.cliprange_high) == (
        "global_token_mean", "clipped", 0.2, None)
    assert ppo.grpo_scale_by_std is True and ppo.ratio_level == "token" and ppo.delta is None
    assert ppo.use_bias_correction_kl is config.use_bias_correction_kl
    assert (ppo.response_length, ppo.stop_token, ppo.temperature) == (512, "eos", 1.0)
    assert (ppo.per_device_train_batch_size, ppo.gradient_accumulation_steps, ppo.num_mini_batches) == (8, 1, 1)
    assert ppo.num_ppo_epochs == 1 and ppo.num_sample_generations == 0
    assert ppo.max_tool_calling_iterations is None  # no cap on tool-calling rounds, as GRPOConfig
    assert ppo.num_train_epochs == config.num_train_epochs * 8  # epochs over prompts -> over completions
    assert ppo.learning_rate == config.learning_rate == 1e-6  # TrainingArguments fields pass through
    assert (ppo.seed, ppo.logging_steps, ppo.lr_scheduler_type) == (config.seed, 10, config.lr_scheduler_type)


def test_dapo_style_config(tmp_path):
    ppo, _ = convert(grpo(tmp_path, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0,
                          mask_truncated_completions=True, num_iterations=2, gradient_accumulation_steps=2,
                          per_device_train_batch_size=4, num_generations=4, temperature=0.9, max_steps=7,
                          warmup_steps=4, logging_steps=3, reward_weights=[1.0, 0.5], entropy_coef=0.01))
    assert (ppo.cliprange, ppo.cliprange_high, ppo.loss_aggregation) == (0.2, 0.28, "global_token_mean")
    assert ppo.mask_truncated_completions is True and ppo.num_ppo_epochs == 2 and ppo.temperature == 0.9
    # 8 completions per process and update, one optimizer step per pass: 7 optimizer steps / 2 passes = 4 updates
    assert (ppo.per_device_train_batch_size, ppo.gradient_accumulation_steps) == (4, 2)
    assert ppo.total_episodes == 4 * 8 and (ppo.warmup_steps, ppo.logging_steps) == (2, 2)
    assert ppo.reward_weights == [1.0, 0.5] and ppo.entropy_coef == 0.01


@pytest.mark.parametrize("keys, ours", [
    ({"loss_type": "grpo", "beta": 0.04}, {"loss_aggregation": "seq_mean_token_mean", "kl_coef": 0.04}),
    ({"loss_type": "bnpo"}, {"loss_aggregation": "token_mean"}),
    ({"loss_type": "dr_grpo", "scale_rewards": "none"}, {"loss_aggregation": "seq_mean_token_sum_norm",
                                                        "grpo_scale_by_std": False}),
    ({"loss_type": "cispo", "epsilon_high": 5.0}, {"policy_loss": "cispo", "cliprange_high": 4.0}),
    ({"importance_sampling_level": "sequence", "delta": 1.5}, {"ratio_level": "sequence", "delta": 1.5}),
    ({"use_transformers_continuous_batching": True}, {"rollout_engine": "continuous_batching"}),
    ({"model_init_kwargs": {"dtype": "bfloat16"}, "trust_remote_code": True},
     {"model_init_kwargs": {"dtype": "bfloat16", "trust_remote_code": True}}),
    ({"chat_template_kwargs": {"enable_thinking": False}}, {"chat_template_kwargs": {"enable_thinking": False}}),
    ({"max_tool_calling_iterations": 3}, {"max_tool_calling_iterations": 3}),
    ({"top_p": 0.95, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1},
     {"top_p": 0.95, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "generation_kwargs": None}),
    # GRPO's generation_kwargs override the named keys (they move to them); cache_implementation joins them
    ({"top_p": 0.9, "generation_kwargs": {"top_p": 0.5, "suppress_tokens": [3]}, "cache_implementation": "static"},
     {"top_p": 0.5, "generation_kwargs": {"suppress_tokens": [3], "cache_implementation": "static"}}),
])
def test_mapped_keys(tmp_path, keys, ours):
    ppo, _ = convert(grpo(tmp_path, **keys))
    assert {k: getattr(ppo, k) for k in ours} == ours


def test_eval_keys_are_carried(tmp_path):
    """GRPO's evaluation keys: `eval_strategy` as it is, `eval_steps` in updates (optimizer steps / num_iterations),
    named in no warning; GRPO's `num_generations_eval` is (one completion per prompt here); `epoch` is refused."""
    ppo, warned = convert(grpo(tmp_path, eval_strategy="steps", eval_steps=6, num_iterations=2,
                               per_device_eval_batch_size=12))
    assert (str(ppo.eval_strategy.value), ppo.eval_steps, ppo.per_device_eval_batch_size) == ("steps", 3, 12)
    assert ppo.eval_do_sample is False and warned == []
    _, warned = convert(grpo(tmp_path, eval_strategy="steps", num_generations_eval=2))
    assert len(warned) == 1 and "num_generations_eval=2 (evaluation generates one completion per prompt" in warned[0]
    with pytest.raises(UserInputError, match="^eval_strategy: 'epoch' has no meaning in PPO"):
        convert(grpo(tmp_path, eval_strategy="epoch"))


def test_overrides_win_and_the_estimator_may_change(tmp_path):
    ppo, _ = convert(grpo(tmp_path, beta=0.1), advantage_estimator="rloo", kl_controller="adaptive")
    assert (ppo.advantage_estimator, ppo.kl_in, ppo.kl_controller, ppo.kl_coef) == ("rloo", "reward", "adaptive", 0.1)
    assert ppo.use_bias_correction_kl is False  # TRL 1.16's True corrects a loss term this run does not have
    ppo, _ = convert(grpo(tmp_path), advantage_estimator="gae")  # a value model: the KL goes in the reward
    assert (ppo.kl_in, ppo.num_samples_per_prompt) == ("reward", 4)


def test_keys_without_counterpart_are_named_in_one_warning(tmp_path):
    ppo, warned = convert(grpo(tmp_path, use_vllm=True, vllm_mode="server", max_grad_norm=0.5, shuffle_dataset=False,
                               log_completions=True, log_unique_prompts=True))
    assert len(warned) == 1
    for key in ("use_vllm=True", "vllm_mode='server'", "shuffle_dataset=False", "log_unique_prompts=True"):
        assert key in warned[0], key
    assert "log_completions" not in warned[0].replace("log_completions_", "")  # mapped: not named
    assert "max_grad_norm" not in warned[0] and ppo.max_grad_norm == 0.5  # honoured: carried over as it is


def test_max_grad_norm_is_carried_with_grpos_default(tmp_path):
    """GRPOConfig's default (TrainingArguments' 1.0) and 0 (off) arrive unchanged and unwarned."""
    for value in (1.0, 0.0):
        ppo, warned = convert(grpo(tmp_path, max_grad_norm=value))
        assert ppo.max_grad_norm == value and not any("max_grad_norm" in w for w in warned)


def test_keys_that_change_the_run_are_refused_together(tmp_path):
    with pytest.raises(UserInputError) as err:
        convert(grpo(tmp_path, use_adaptive_entropy=True, sync_ref_model=True, top_entropy_quantile=0.2))
    message = str(err.value)
    assert "\n" not in message
    for key in ("use_adaptive_entropy=True", "sync_ref_model=True", "top_entropy_quantile=0.2"):
        assert key in message, key


@pytest.mark.parametrize("keys, culprit", [
    ({"loss_type": "sapo"}, "loss_type: 'sapo'"),
    ({"scale_rewards": "batch"}, "scale_rewards: 'batch'"),
    ({"steps_per_generation": 2}, "steps_per_generation: 2"),
    ({"num_generations": 3, "per_device_train_batch_size": 6, "gradient_accumulation_steps": 2,
      "steps_per_generation": 2, "generation_batch_size": None}, None),
    ({"num_generations": 16, "per_device_train_batch_size": 8, "generation_batch_size": 16},
     "steps_per_generation: 2"),
    ({"loss_type": "cispo"}, "epsilon_high: loss_type 'cispo'"),
])
def test_values_without_counterpart_are_refused(tmp_path, keys, culprit):
    if culprit is None:  # 3 divides 6 * 2 = 12 completions per process: accepted
        ppo, _ = convert(grpo(tmp_path, **keys))
        assert ppo.num_samples_per_prompt == 3 and ppo.gradient_accumulation_steps == 2
        return
    with pytest.raises(UserInputError, match=culprit):
        convert(grpo(tmp_path, **keys))


def test_a_grpo_scripts_sampling_keys_run_one_update(tiny_models, tmp_path):
    """A GRPOTrainer script's config with top_p, top_k, min_p (and max_grad_norm) given to PPOTrainer as it is: the
    PPOConfig carries the keys, the generation config samples with them, and one update runs on-policy (ratio 1:
    the rollout's log-probs are the loss's, the temperature-scaled full distribution, not the truncated one)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    import trl_ext
    from ppo_helpers import left_tokenizer, update_logs

    tok = left_tokenizer(tiny_models)
    config = grpo(tmp_path, top_p=0.95, top_k=20, min_p=0.05, max_grad_norm=0.5, max_steps=1, temperature=0.7,
                  per_device_train_batch_size=4, num_generations=2, max_completion_length=8, logging_steps=1,
                  save_strategy="no", seed=3, learning_rate=1e-3)
    data = Dataset.from_dict({"prompt": ["the cat is", "hello there", "a very good dog", "sun and sea"]})

    def length(completion_ids, **kwargs):
        return [len(ids) / 8 for ids in completion_ids]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl_ext.PPOTrainer(args=config, processing_class=tok, model=AutoModelForCausalLM.from_pretrained(
            tiny_models.policy), reward_funcs=[length], train_dataset=data)
    args = trainer.args
    assert isinstance(args, trl_ext.PPOConfig)
    assert (args.top_p, args.top_k, args.min_p, args.temperature) == (0.95, 20, 0.05, 0.7)
    assert args.max_grad_norm == 0.5  # honoured: the clip of every optimizer step
    trainer.train()
    generation = trainer.generation_config
    assert (generation.top_p, generation.top_k, generation.min_p, generation.do_sample) == (0.95, 20, 0.05, True)
    (log,) = update_logs(trainer)
    assert abs(log["policy/ratio_avg"] - 1) < 1e-4 and log["policy/approxkl_avg"] < 1e-8
