"""train_micro_batch_size (trl_ext.ppo.memory.micro_batch, trl_ext.ppo.optimize_loop.micro_batch_weights): forward/backward in micro-batches of their own size inside
unchanged mini-batches and optimizer steps. Under global_token_mean, the sequence-level aggregations and (with the
key set) token_mean, the update does not depend on the micro-batch: one sequence per pass and the whole mini-batch in
one pass give the same weights within float rounding; with the value model, critic-free, and on a shared base."""

from __future__ import annotations

import pytest
import torch

from ppo_helpers import config_kwargs, load_models, prompt_dataset, seed_all

# per_device_train_batch_size 2 x gradient_accumulation_steps 2: mini-batches of 4; one update, 2 PPO epochs. Plain
# SGD: Adam's first steps are lr * sign(gradient), which turns a rounding difference of a gradient near 0 into lr.
SETTINGS = dict(total_episodes=4, num_sample_generations=0, learning_rate=0.05, optim="sgd")
TOLERANCE = 1e-6


def trained_weights(tiny_models, tok, tmp_path, *, micro, shared_adapter=None, train=True, **overrides):
    """The trainable parameters after one update (policy and value) with ``train_micro_batch_size = micro``; with
    ``train=False``, before it."""
    import trl_ext

    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    if shared_adapter is not None:
        from peft import LoraConfig, get_peft_model

        from trl_ext.models.shared_base import add_scalar_adapter

        policy = get_peft_model(policy, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                   lora_dropout=0.0, task_type="CAUSAL_LM"))
        reward = add_scalar_adapter(policy, "reward", source=shared_adapter, trainable=False)
        value = add_scalar_adapter(policy, "value", source=shared_adapter, trainable=True)
    kwargs = config_kwargs(tmp_path, **{**SETTINGS, **overrides}, train_micro_batch_size=micro)
    args = trl_ext.PPOConfig(**kwargs)
    if args.critic_free:
        value = None
    trainer = trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                                 value_model=value, train_dataset=prompt_dataset(tok))
    if train:
        trainer.train()
    model = trainer.accelerator.unwrap_model(trainer.model)
    return trainer, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


CASES = [
    ("gae", "global_token_mean"),
    ("gae", "seq_mean_token_mean"),
    ("gae", "seq_mean_token_sum_norm"),
    ("rloo", "global_token_mean"),
    ("grpo", "token_mean"),
]


@pytest.mark.parametrize("estimator, aggregation", CASES)
def test_one_sequence_per_pass_and_the_whole_mini_batch_give_equal_weights(tiny_models, tok, tmp_path, estimator,
                                                                           aggregation):
    extra = dict(advantage_estimator=estimator, loss_aggregation=aggregation)
    if estimator != "gae":
        extra.update(num_samples_per_prompt=2)
    ones, w1 = trained_weights(tiny_models, tok, tmp_path / "one", micro=1, **extra)
    whole, w4 = trained_weights(tiny_models, tok, tmp_path / "whole", micro=4, **extra)
    _, w0 = trained_weights(tiny_models, tok, tmp_path / "before", micro=4, train=False, **extra)
    assert (ones.train_micro_batch, whole.train_micro_batch) == (1, 4)
    assert max_difference(w1, w0) > 1e-3  # the update moved the weights
    assert max_difference(w1, w4) < TOLERANCE, f"{estimator}/{aggregation}: {max_difference(w1, w4):.3g}"
    # same optimizer steps: 2 PPO epochs x 1 mini-batch, whatever the micro-batch
    assert ones.state.global_step == whole.state.global_step == 1


def test_unset_is_todays_loop_and_micro_batches_of_that_size_give_its_update(tiny_models, tok, tmp_path):
    """Critic-free, with equal micro-batches, the sequence-level and global-token policy losses are the same sum
    whether the micro-batches come from gradient_accumulation_steps (unset: today's loop) or from
    train_micro_batch_size. (The value loss is not: set, it is a token mean over the mini-batch, unset a mean of the
    micro-batches' token means.)"""
    for aggregation in ("global_token_mean", "seq_mean_token_mean"):
        extra = dict(advantage_estimator="rloo", num_samples_per_prompt=2, loss_aggregation=aggregation)
        _, today = trained_weights(tiny_models, tok, tmp_path / f"{aggregation}-unset", micro=None, **extra)
        _, two = trained_weights(tiny_models, tok, tmp_path / f"{aggregation}-2", micro=2, **extra)
        assert max_difference(today, two) < TOLERANCE, aggregation


def test_shared_base_equal_weights(tiny_models, tok, reward_adapter, tmp_path):
    _, w1 = trained_weights(tiny_models, tok, tmp_path / "one", micro=1, shared_adapter=reward_adapter,
                            loss_aggregation="global_token_mean")
    _, w4 = trained_weights(tiny_models, tok, tmp_path / "whole", micro=4, shared_adapter=reward_adapter,
                            loss_aggregation="global_token_mean")
    _, w0 = trained_weights(tiny_models, tok, tmp_path / "before", micro=4, shared_adapter=reward_adapter,
                            loss_aggregation="global_token_mean", train=False)
    assert max_difference(w1, w0) > 1e-3
    assert max_difference(w1, w4) < TOLERANCE
    # auto (a LoRA policy): the tiny run's training phase fits 2 GiB at the whole mini-batch of 4
    auto, wa = trained_weights(tiny_models, tok, tmp_path / "auto", micro="auto", shared_adapter=reward_adapter,
                               loss_aggregation="global_token_mean", max_memory_gib=2)
    assert auto.train_micro_batch == 4 and max_difference(wa, w4) < TOLERANCE


def test_auto_takes_the_largest_micro_batch_whose_training_phase_fits():
    from dataclasses import replace

    from trl_ext.errors import UserInputError
    from trl_ext.ppo.memory.budget import GIB, LLAMA_3_8B, PPOShape, ppo_memory_budget
    from trl_ext.ppo.memory.micro_batch import largest_fitting_micro_batch

    run = PPOShape(batch=64, micro_batch=2, rollout_chunk=8, prompt_length=512, response_length=64, lora_r=32,
                   quantization="nf4-nested")

    def need(m):
        b = ppo_memory_budget(LLAMA_3_8B, replace(run, micro_batch=m), shared=True)
        return b.peak - max(b.phases.values()) + b.phases["training"]

    target = 24 * GIB
    m = largest_fitting_micro_batch(LLAMA_3_8B, run, target, shared=True)
    assert 1 < m < 64 and need(m) <= target < need(m + 1)
    assert largest_fitting_micro_batch(LLAMA_3_8B, run, 10**15, shared=True) == 64  # capped at the mini-batch
    with pytest.raises(UserInputError, match="max_memory_gib: 8.00 GiB is less than the training phase needs"):
        largest_fitting_micro_batch(LLAMA_3_8B, run, 8 * GIB, shared=True)


@pytest.mark.parametrize("largest, mini_batch, expected", [(15, 16, 8), (16, 16, 16), (1, 16, 1), (5, 16, 4),
                                                          (7, 16, 6), (40, 16, 16), (3, 10, 3), (9, 10, 5)])
def test_auto_evens_out_its_passes(largest, mini_batch, expected):
    """``auto`` keeps the fewest passes the largest fitting micro-batch needs, at the smallest size that needs no more
    (one H200, 8B: 15 of 16 ran 15 + 1; 8 + 8 is the same two passes with about half the activations)."""
    from trl_ext.ppo.memory.micro_batch import balanced_micro_batch

    got = balanced_micro_batch(largest, mini_batch)
    assert got == expected
    passes = -(-mini_batch // min(largest, mini_batch))
    assert -(-mini_batch // got) == passes and (got == 1 or -(-mini_batch // (got - 1)) > passes)


@pytest.mark.parametrize("value, expected", [(None, None), ("auto", "auto"), (" 3 ", 3), (2, 2)])
def test_values(value, expected):
    from trl_ext.ppo.memory.micro_batch import micro_batch_value

    assert micro_batch_value(value) == expected


@pytest.mark.parametrize("value", [0, -1, "x", 1.5, True])
def test_bad_values_name_the_key(value):
    from trl_ext.errors import UserInputError
    from trl_ext.ppo.memory.micro_batch import micro_batch_value

    with pytest.raises(UserInputError, match="^train_micro_batch_size: must be a positive integer or 'auto'"):
        micro_batch_value(value)


def test_recipe_key(tmp_path):
    """The recipe loader maps the PPOConfig field: an integer, `auto`, and a wrong value refused in one line."""
    from trl_ext.errors import UserInputError
    from trl_ext.recipe_loader.loader import resolve_recipe

    (tmp_path / "d.jsonl").write_text('{"prompt": "a b"}\n')
    for value, expected in (("3", 3), ("auto", "auto")):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(f"trainer: ppo\nmodel_name_or_path: tiny://policy\nreward_model_path: tiny://reward\n"
                          f"dataset_name: {tmp_path}/d.jsonl\noutput_dir: {tmp_path}/out\nuse_cpu: true\n"
                          f"max_memory_gib: 2\ntrain_micro_batch_size: {value}\n")
        assert resolve_recipe(recipe).training_args.train_micro_batch_size == expected
    recipe.write_text(recipe.read_text().replace("train_micro_batch_size: auto", "train_micro_batch_size: 0"))
    with pytest.raises(UserInputError, match="train_micro_batch_size: must be a positive integer or 'auto'"):
        resolve_recipe(recipe)
