"""The one optimize loop (trl_ext/ppo/optimize_loop.py): `num_ppo_epochs x num_mini_batches` optimizer steps per
update for every gradient_accumulation_steps, num_mini_batches and train_micro_batch_size, counted by a step hook on
the optimizer; and `max_grad_norm`, measured on the parameters that plain SGD at lr 1 moves."""

from __future__ import annotations

import pytest
import torch

from ppo_helpers import config_kwargs, count_optimizer_steps, load_models, prompt_dataset, seed_all


def trainer_for(tiny_models, tok, tmp_path, trainer_cls=None, **overrides):
    import trl_ext

    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, **overrides))
    return (trainer_cls or trl_ext.PPOTrainer)(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                              value_model=None if args.critic_free else value,
                              train_dataset=prompt_dataset(tok), eval_dataset=prompt_dataset(tok, n=4, seed=5))


def steps_of(tiny_models, tok, tmp_path, *, updates, **overrides) -> tuple[int, object]:
    """(optimizer steps taken, trainer) of a run of `updates` updates of one process's batch each."""
    batch = overrides.get("per_device_train_batch_size", 2) * overrides["gradient_accumulation_steps"]
    trainer = trainer_for(tiny_models, tok, tmp_path, total_episodes=updates * batch, **overrides)
    steps = count_optimizer_steps(trainer)
    trainer.train()
    assert trainer.state.global_step == updates
    return steps.count, trainer


# 4 updates x 1 PPO epoch over the 16 prompts: the 4th update takes the epoch's last prompt batch. With sample
# generations on, their DataLoader is accelerate's most recent one at that point; without, the prompt DataLoader is.
# TRL 1.12's arithmetic (trl-ext's loop before it had this one) took, in the same runs, with / without sample
# generations: GA1 x 2 mini-batches 8 / 8, GA2 x 1: 4 / 5, GA2 x 2: 4 / 5, GA4 x 4: 4 / 7, GA4 x 2: 4 / 7 steps
# (every GA micro-batches across mini-batch boundaries, plus one per micro-batch in an epoch-end update without).
TABLE = [  # (gradient_accumulation_steps, num_mini_batches, per_device_train_batch_size)
    (1, 2, 4),
    (2, 1, 2),
    (2, 2, 2),
    (4, 4, 1),
    (4, 2, 1),
]


@pytest.mark.parametrize("generations", [2, 0])
@pytest.mark.parametrize("accumulation, mini_batches, per_device", TABLE)
def test_one_step_per_mini_batch_over_an_epoch_end(tiny_models, tok, tmp_path, accumulation, mini_batches,
                                                   per_device, generations):
    count, _ = steps_of(tiny_models, tok, tmp_path, updates=4, num_ppo_epochs=1,
                        gradient_accumulation_steps=accumulation, num_mini_batches=mini_batches,
                        per_device_train_batch_size=per_device, num_sample_generations=generations)
    assert count == 4 * 1 * mini_batches  # updates x epochs x mini-batches


@pytest.mark.parametrize("micro", [None, 1])
@pytest.mark.parametrize("accumulation", [1, 2, 4])
@pytest.mark.parametrize("mini_batches", [1, 2, 4])
def test_step_count_grid(tiny_models, tok, tmp_path, accumulation, mini_batches, micro):
    """2 updates x 2 PPO epochs, micro-batches of per_device_train_batch_size (None) or of one sequence."""
    count, trainer = steps_of(tiny_models, tok, tmp_path, updates=2, num_ppo_epochs=2, num_sample_generations=0,
                              gradient_accumulation_steps=accumulation, num_mini_batches=mini_batches,
                              per_device_train_batch_size=4, train_micro_batch_size=micro)
    assert count == 2 * 2 * mini_batches
    assert trainer.accelerator.gradient_state.sync_gradients  # left as accelerate expects it outside the loop


def test_the_loop_leaves_the_optimizer_without_gradients_and_logs_no_norm_when_clipping_is_off(tiny_models, tok,
                                                                                                 tmp_path):
    count, trainer = steps_of(tiny_models, tok, tmp_path, updates=1, num_ppo_epochs=1, gradient_accumulation_steps=2,
                              num_mini_batches=2, num_sample_generations=0)
    model = trainer.accelerator.unwrap_model(trainer.model)
    assert count == 2 and all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert "policy/grad_norm" not in trainer.state.log_history[0]


def test_the_loop_calls_the_trainers_overrides_and_an_update_without_a_step_leaves_the_schedule(tiny_models, tok,
                                                                                                tmp_path):
    """A subclass's `compute_micro_batch_loss` and `optimizer_step` are what the loop calls (the trainer hands it its
    bound methods); when no step of an update is taken, neither the weights nor the learning rate move."""
    import trl_ext

    calls = []

    class Refusing(trl_ext.PPOTrainer):
        def compute_micro_batch_loss(self, *args, **kwargs):
            calls.append("loss")
            return super().compute_micro_batch_loss(*args, **kwargs)

        def optimizer_step(self):
            calls.append("step")
            return False  # as if the NaN/inf guard had skipped it

    trainer = trainer_for(tiny_models, tok, tmp_path, trainer_cls=Refusing, total_episodes=4, num_ppo_epochs=2,
                          num_mini_batches=2, num_sample_generations=0, lr_scheduler_type="linear")
    model = trainer.accelerator.unwrap_model(trainer.model)
    before = [p.detach().clone() for p in model.parameters()]
    lr = trainer.lr_scheduler.get_last_lr()
    trainer.train()
    assert calls == ["loss", "step"] * 4  # 2 epochs x 2 mini-batches of one micro-batch
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert trainer.lr_scheduler.get_last_lr() == lr and lr[0] > 0


def clipped_run(tiny_models, tok, tmp_path, max_grad_norm, **overrides):
    """One update of plain SGD at lr 1 (constant schedule): each optimizer step moves the parameters by lr x the
    (clipped) gradient. Returns (per-step parameter change norms, logged metrics)."""
    trainer = trainer_for(tiny_models, tok, tmp_path, total_episodes=4, num_sample_generations=0, optim="sgd",
                          learning_rate=1.0, lr_scheduler_type="constant", max_grad_norm=max_grad_norm,
                          **overrides)
    steps = count_optimizer_steps(trainer, track_parameters=True)
    trainer.train()
    return steps.changes, trainer.state.log_history[0]


def test_max_grad_norm_bounds_each_step_and_the_logged_norm_is_the_gradients(tiny_models, tok, tmp_path):
    one = dict(num_ppo_epochs=1)
    unclipped, log0 = clipped_run(tiny_models, tok, tmp_path / "off", 0.0, **one)
    clipped, log1 = clipped_run(tiny_models, tok, tmp_path / "on", 1e-3, **one)
    loose, log2 = clipped_run(tiny_models, tok, tmp_path / "loose", 1e6, **one)
    assert len(unclipped) == len(clipped) == len(loose) == 1  # 1 epoch x 1 mini-batch
    assert unclipped[0] > 0.1  # SGD at lr 1 moves the tiny models far
    assert clipped[0] == pytest.approx(1e-3, rel=1e-3)  # scaled to max_grad_norm (1e-6 below it: torch's eps)
    assert "policy/grad_norm" not in log0
    # a step that the clip does not bite moves the parameters by lr x the gradient norm: the logged pre-clip norm
    assert loose[0] == pytest.approx(unclipped[0], rel=1e-5)
    assert log2["policy/grad_norm"] == pytest.approx(loose[0], rel=1e-4)
    # the same first step: the same gradient, its norm logged before the clip
    assert log1["policy/grad_norm"] == pytest.approx(log2["policy/grad_norm"], rel=1e-5)


@pytest.mark.parametrize("estimator", ["gae", "rloo"])
def test_max_grad_norm_per_step_over_epochs_and_mini_batches(tiny_models, tok, tmp_path, estimator):
    """2 PPO epochs x 2 mini-batches: 4 steps, each at most max_grad_norm; the logged norm averages the 4 steps'.
    With a value model the norm is over policy and value together; critic-free, over the policy alone."""
    extra = {} if estimator == "gae" else dict(advantage_estimator=estimator, num_samples_per_prompt=2)
    changes, log = clipped_run(tiny_models, tok, tmp_path, 1e-2, num_mini_batches=2, **extra)
    assert len(changes) == 4
    assert all(change <= 1e-2 * (1 + 1e-4) for change in changes)
    assert log["policy/grad_norm"] > 1e-2  # the clip bit on these steps


def test_max_grad_norm_is_a_recipe_key_and_refused_negative(tmp_path):
    import trl_ext
    from trl_ext.errors import UserInputError
    from trl_ext.recipe_loader.loader import resolve_recipe

    (tmp_path / "d.jsonl").write_text('{"prompt": "a b"}\n')
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"trainer: ppo\nmodel_name_or_path: tiny://policy\nreward_model_path: tiny://reward\n"
                      f"dataset_name: {tmp_path}/d.jsonl\noutput_dir: {tmp_path}/out\nuse_cpu: true\n"
                      "max_grad_norm: 0.5\n")
    assert resolve_recipe(recipe).training_args.max_grad_norm == 0.5
    assert trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none").max_grad_norm == 1.0
    with pytest.raises(UserInputError, match="^max_grad_norm:"):
        trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_grad_norm=-1.0)
