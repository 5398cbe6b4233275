"""A Python user and a recipe user get the same refusals: each invalid PPO setting is refused when ``PPOConfig`` is
constructed, with the line ``trl-ext check`` prints for the same setting in a recipe (there framed as ``recipe: key
'<key>': ...``).

The settings are added to ``recipes/demo/ppo.yaml`` (its PPOConfig keys are the Python base: a rollout batch of 8,
no stop token, ``gae``), so the combination messages, which quote the batch, agree too.
"""

import dataclasses
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEMO = yaml.safe_load((ROOT / "recipes" / "demo" / "ppo.yaml").read_text())

# (settings added to the demo recipe, the key the refusal names). Every PPOConfig key with a rule of its own is here
# (ranges and choices: trl_ext.field_rules; combinations: trl_ext.ppo.combination_rules), with the issue's examples.
CASES = [
    # the issue's examples
    (dict(num_mini_batches=3), "num_mini_batches"),
    (dict(stop_token="foo"), "stop_token"),
    (dict(learning_rate=-1.0), "learning_rate"),
    (dict(response_length=0), "response_length"),
    (dict(temperature=0.0), "temperature"),
    (dict(kl_coef=-0.1), "kl_coef"),
    (dict(cliprange_high=-0.1), "cliprange_high"),
    (dict(advantage_estimator="rloo"), "num_samples_per_prompt"),  # rloo with one sample
    # ranges of TRL's fields
    (dict(learning_rate=float("inf")), "learning_rate"),
    (dict(num_mini_batches=0), "num_mini_batches"),
    (dict(num_ppo_epochs=0), "num_ppo_epochs"),
    (dict(total_episodes=0), "total_episodes"),
    (dict(per_device_train_batch_size=0), "per_device_train_batch_size"),
    (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps"),
    (dict(vf_coef=-1.0), "vf_coef"),
    (dict(cliprange=0.0), "cliprange"),
    (dict(cliprange_value=-0.2), "cliprange_value"),
    (dict(gamma=1.5), "gamma"),
    (dict(lam=-0.1), "lam"),
    (dict(adam_beta1=1.0), "adam_beta1"),
    (dict(seed=-1), "seed"),
    (dict(missing_eos_penalty=-1.0), "missing_eos_penalty"),
    # ranges of trl-ext's fields
    (dict(cliprange_low=1.5), "cliprange_low"),
    (dict(dual_clip=1.0), "dual_clip"),
    (dict(delta=0.5), "delta"),
    (dict(entropy_coef=-0.01), "entropy_coef"),
    (dict(max_sampling_rounds=0), "max_sampling_rounds"),
    (dict(num_samples_per_prompt=0), "num_samples_per_prompt"),
    (dict(critic_warmup=-1), "critic_warmup"),
    (dict(kl_target=0.0), "kl_target"),
    (dict(kl_horizon=0), "kl_horizon"),
    (dict(ptx_coef=-1.0), "ptx_coef"),
    (dict(ptx_batch_size=0), "ptx_batch_size"),
    (dict(ptx_max_length=0), "ptx_max_length"),
    (dict(reward_clip=0.0), "reward_clip"),
    (dict(max_memory_gib=0.0), "max_memory_gib"),
    (dict(reward_num_workers=-1), "reward_num_workers"),
    (dict(reward_timeout_s=0.0, reward_num_workers=1), "reward_timeout_s"),
    (dict(max_tool_calling_iterations=0), "max_tool_calling_iterations"),
    (dict(tool_timeout_s=0.0), "tool_timeout_s"),
    (dict(tool_num_workers=-1), "tool_num_workers"),
    (dict(num_completions_to_print=-1), "num_completions_to_print"),
    (dict(max_consecutive_nonfinite_skips=0), "max_consecutive_nonfinite_skips"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(min_p=1.5), "min_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    # choices (the Literal of each field)
    (dict(value_clip="both"), "value_clip"),
    (dict(kl_controller="pid"), "kl_controller"),
    (dict(ptx_mode="interleaved"), "ptx_mode"),
    (dict(advantage_estimator="ppo"), "advantage_estimator"),
    (dict(kl_in="value"), "kl_in"),
    (dict(loss_aggregation="sum"), "loss_aggregation"),
    (dict(ratio_level="group"), "ratio_level"),
    (dict(policy_loss="sapo"), "policy_loss"),
    (dict(kl_estimator="k4"), "kl_estimator"),
    (dict(rollout_engine="vllm"), "rollout_engine"),
    (dict(nonfinite_policy="ignore"), "nonfinite_policy"),
    (dict(turn_credit="step"), "turn_credit"),
    # combinations
    (dict(whiten_rewards=True, num_mini_batches=2), "whiten_rewards"),
    (dict(stop_token="eos", stop_token_id=2), "stop_token"),
    (dict(total_episodes=None, num_train_epochs=0.0), "num_train_epochs"),
    (dict(local_rollout_forward_batch_size="auto"), "local_rollout_forward_batch_size"),
    (dict(advantage_estimator="rloo", num_samples_per_prompt=3), "num_samples_per_prompt"),
    (dict(kl_in="loss"), "kl_in"),
    (dict(advantage_estimator="reinforce_pp", whiten_rewards=True), "whiten_rewards"),
    (dict(advantage_estimator="grpo", num_samples_per_prompt=2, critic_warmup=2), "critic_warmup"),
    (dict(advantage_estimator="grpo", num_samples_per_prompt=2, critic_learning_rate=1e-3), "critic_learning_rate"),
    (dict(advantage_estimator="grpo", num_samples_per_prompt=2, critic_lam=1.0), "critic_lam"),
    (dict(length_adaptive_lam_alpha=0.0), "length_adaptive_lam_alpha"),
    (dict(turn_credit="turn"), "turn_credit"),  # gae has no per-turn form
    (dict(advantage_estimator="grpo", num_samples_per_prompt=2, policy_loss="cispo", dual_clip=3.0), "dual_clip"),
    (dict(delta=1.1), "delta"),
    (dict(use_bias_correction_kl=True), "use_bias_correction_kl"),
    (dict(mask_truncated_completions=True), "mask_truncated_completions"),
    (dict(dynamic_sampling=True), "dynamic_sampling"),
    (dict(reward_timeout_s=5.0), "reward_timeout_s"),
    (dict(rollout_cuda_graphs=True, rollout_engine="continuous_batching"), "rollout_cuda_graphs"),
    (dict(repetition_penalty=1.2, rollout_engine="continuous_batching"), "repetition_penalty"),
    (dict(generation_kwargs={"top_p": 0.9}), "generation_kwargs"),  # a key of its own
    (dict(generation_kwargs={"max_new_tokens": 4}), "generation_kwargs"),  # the trainer's
    (dict(generation_kwargs={"do_sample": False}), "generation_kwargs"),
    (dict(generation_kwargs={"no_such_key": 1}), "generation_kwargs"),
    (dict(generation_kwargs={"cache_implementation": "nope"}), "generation_kwargs"),
    (dict(eval_strategy="epoch"), "eval_strategy"),
    (dict(eval_strategy="steps", eval_steps=2.5), "eval_steps"),
    (dict(eval_strategy="steps", eval_steps=0.0), "eval_steps"),
    (dict(eval_strategy="steps", eval_on_start=True), "eval_on_start"),
]


def python_refusal(tmp_path, settings) -> str:
    import trl_ext
    from trl_ext.errors import UserInputError

    fields = {f.name for f in dataclasses.fields(trl_ext.PPOConfig)}
    kwargs = {k: v for k, v in DEMO.items() if k in fields}
    kwargs.update(output_dir=str(tmp_path / "out"), reward_model_path="tiny://reward", **settings)
    with pytest.raises(UserInputError) as caught:
        trl_ext.PPOConfig(**kwargs)
    return str(caught.value)


def test_the_table_holds_every_rule_and_the_issues_examples():
    assert len(CASES) >= 40
    named = {key for _, key in CASES}
    # every key checked by a rule of trl_ext.ppo.combination_rules, and every trl-ext field with a range or choices
    assert {"num_mini_batches", "whiten_rewards", "stop_token", "num_train_epochs", "local_rollout_forward_batch_size",
            "num_samples_per_prompt", "kl_in", "dual_clip", "delta", "use_bias_correction_kl",
            "mask_truncated_completions", "dynamic_sampling", "reward_timeout_s", "rollout_cuda_graphs",
            "generation_kwargs", "repetition_penalty", "critic_warmup"} <= named
    from trl_ext.field_rules import key_specs
    from trl_ext.ppo.base import ParentPPOConfig

    import trl_ext

    own = {f.name for f in dataclasses.fields(trl_ext.PPOConfig)} - {f.name for f in dataclasses.fields(
        ParentPPOConfig)}
    specs = key_specs([trl_ext.PPOConfig])
    ruled = {k for k in own if specs[k].choices or specs[k].kind in ("int", "float")}
    assert len(ruled) >= 25 and ruled <= named, ruled - named


@pytest.mark.parametrize("settings, key", CASES, ids=[",".join(f"{k}={v}" for k, v in s.items()) for s, _ in CASES])
def test_python_and_recipe_get_the_same_refusal(tmp_path, monkeypatch, capsys, tiny_models, settings, key):
    from trl_ext.cli import main

    message = python_refusal(tmp_path, settings)
    assert message.startswith(f"{key}: ") and "\n" not in message, message
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**DEMO, "reward_model_path": "tiny://reward",
                                      "output_dir": str(tmp_path / "out"), **settings}, sort_keys=False))
    assert main(["check", str(recipe)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"trl-ext: error: recipe: key '{key}': {message[len(key) + 2:]}"


def test_a_recipe_with_valid_sampling_keys_passes_the_check(tmp_path, monkeypatch, capsys, tiny_models):
    from trl_ext.cli import main

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**DEMO, "reward_model_path": "tiny://reward", "output_dir": str(tmp_path / "o"),
                                      "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1,
                                      "generation_kwargs": {"suppress_tokens": [3]}}, sort_keys=False))
    assert main(["check", str(recipe)]) == 0, capsys.readouterr().err


def test_what_needs_the_models_or_the_data_is_refused_when_the_trainer_is_built(tiny_models, tmp_path):
    """The checks `trl-ext check` makes from a recipe's model and data run for Python users at construction: a
    reward function's parameters against the train dataset's columns, LoRA targets against the policy."""
    from datasets import Dataset
    from peft import LoraConfig
    from ppo_helpers import config_kwargs, left_tokenizer, load_models

    import trl_ext
    from trl_ext.errors import UserInputError

    tok = left_tokenizer(tiny_models)
    data = Dataset.from_dict({"input_ids": [tok("a b c")["input_ids"]] * 4})

    def needs_answer(completions, answer, **kwargs):
        return [float(a == c) for a, c in zip(answer, completions)]

    def build(**kw):
        policy, _, reward = load_models(tiny_models)
        args = trl_ext.PPOConfig(**config_kwargs(tmp_path / "out", total_episodes=4, advantage_estimator="rloo",
                                                 num_samples_per_prompt=2, num_sample_generations=0))
        return trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, value_model=None,
                                  train_dataset=data, **kw)

    with pytest.raises(UserInputError, match=r"^reward_funcs: needs_answer: function 'needs_answer' needs 'answer', "
                       r"which is neither an argument the trainer passes nor a column of the dataset .*input_ids"):
        build(reward_model=None, reward_funcs=[needs_answer])
    with pytest.raises(UserInputError, match=r"^lora_target_modules .*'nope'.* Linear modules"):
        build(reward_model=load_models(tiny_models)[2], peft_config=LoraConfig(r=4, target_modules=["nope"]))
    with pytest.raises(UserInputError, match=r"^eval_strategy: 'steps' needs evaluation prompts and the run has none"):
        policy, _, reward = load_models(tiny_models)
        args = trl_ext.PPOConfig(**config_kwargs(tmp_path / "out", total_episodes=4, eval_strategy="steps"))
        trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, value_model=None,
                           reward_model=reward, train_dataset=data)
