"""PPO's non-finite guard: one host synchronisation per optimizer step; the `skip` policy (runtime/nonfinite.py)."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode
from transformers import TrainerCallback

from ppo_helpers import config_kwargs, load_models, prompt_dataset, seed_all, update_logs

# Tensor methods that copy a device value to the host (and so wait for the device)
HOST_SYNCS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu", "nonzero"}


def make_trainer(tiny_models, tok, out, trainer_cls=None, callbacks=None, dtype=None, **overrides):
    import trl_ext

    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    if dtype is not None:
        policy, value, reward = (m.to(dtype) for m in (policy, value, reward))
    kwargs = dict(total_episodes=12, num_sample_generations=0, lr_scheduler_type="linear")
    kwargs.update(overrides)
    return (trainer_cls or trl_ext.PPOTrainer)(
        args=trl_ext.PPOConfig(**config_kwargs(out, **kwargs)), processing_class=tok, model=policy,
        ref_model=None, reward_model=reward, train_dataset=prompt_dataset(tok, n=8), value_model=value,
        callbacks=callbacks,
    )


class HostSyncCounter(TorchFunctionMode):
    """Counts the tensor-to-host calls (`.item()`, `.tolist()`, `bool(t)`, ...) made from trl_ext's own code."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in HOST_SYNCS:
            caller = sys._getframe(1).f_code.co_filename
            if "/trl_ext/" in caller:
                self.calls.append((name, caller))
        return func(*args, **(kwargs or {}))


def test_one_host_sync_per_optimizer_step(tiny_models, tok, tmp_path):
    """4 micro-batches per optimizer step, 2 PPO epochs of 1 mini-batch: the guard synchronises twice in an update's
    optimisation, once per optimizer step (it did 16 times before: two `.item()` per micro-batch)."""

    class Counting(__import__("trl_ext").PPOTrainer):
        counts = []

        def optimize(self, rollout, kl_coef):
            with HostSyncCounter() as counter:
                stats = super().optimize(rollout, kl_coef)
            self.counts.append(counter.calls)
            return stats

    trainer = make_trainer(tiny_models, tok, tmp_path, trainer_cls=Counting, total_episodes=8,
                           per_device_train_batch_size=1, gradient_accumulation_steps=4, num_ppo_epochs=2)
    trainer.train()
    assert len(trainer.counts) == 2  # updates
    for calls in trainer.counts:
        assert [name for name, _ in calls] == ["tolist"] * 2, calls  # one per optimizer step
        assert all(caller.endswith("runtime/nonfinite.py") for _, caller in calls)


def nan_loss_trainer(first_bad_update: int, last_bad_update: int = 10**9):
    import trl_ext

    class NaNLoss(trl_ext.PPOTrainer):
        """Every micro-batch loss of updates `first_bad_update`..`last_bad_update` is NaN."""

        def compute_micro_batch_loss(self, model, rollout, micro_batch_inds, ptx_batch=None, **step):
            out = super().compute_micro_batch_loss(model, rollout, micro_batch_inds, ptx_batch, **step)
            if first_bad_update <= self.state.global_step + 1 <= last_bad_update:
                out.loss = out.loss * float("nan")
            return out

    return NaNLoss


class Snapshots(TrainerCallback):
    """Trainable weights, optimizer state and scheduler position at the end of every update."""

    def __init__(self):
        self.trainer = None
        self.after = {}

    def on_step_end(self, args, state, control, **kwargs):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        self.after[state.global_step] = (
            {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
            copy.deepcopy(self.trainer.optimizer.state_dict()["state"]),
            self.trainer.lr_scheduler.last_epoch,
        )


def assert_same_state(a, b):
    weights_a, optim_a, sched_a = a
    weights_b, optim_b, sched_b = b
    assert weights_a.keys() == weights_b.keys()
    assert all(torch.equal(weights_a[n], weights_b[n]) for n in weights_a)
    assert optim_a.keys() == optim_b.keys()
    for key in optim_a:
        for name, value in optim_a[key].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(optim_b[key][name])), (key, name)
    assert sched_a == sched_b


def test_skip_takes_no_step_and_logs_it(tiny_models, tok, tmp_path):
    """Update 2's losses are all NaN: under `skip` its 2 optimizer steps and its scheduler step are not taken
    (weights, Adam state and LR schedule after update 2 are those after update 1), the skips are logged, and
    update 3 trains again."""
    snapshots = Snapshots()
    trainer = make_trainer(tiny_models, tok, tmp_path, trainer_cls=nan_loss_trainer(2, 2), callbacks=[snapshots],
                           nonfinite_policy="skip")
    snapshots.trainer = trainer
    trainer.train()
    assert trainer.state.global_step == 3
    assert_same_state(snapshots.after[1], snapshots.after[2])
    assert snapshots.after[2][2] == 1 and snapshots.after[3][2] == 2  # scheduler: stepped after updates 1 and 3
    assert not torch.equal(*(next(iter(snapshots.after[s][0].values())) for s in (2, 3)))  # update 3 trained
    logs = update_logs(trainer)
    assert [e["nonfinite/skipped_steps"] for e in logs] == [0, 2, 2]
    assert [e["nonfinite/consecutive_skips"] for e in logs] == [0, 2, 0]


def test_skip_stops_after_max_consecutive_skips(tiny_models, tok, tmp_path):
    """2 optimizer steps per update, max 3 consecutive skips: update 2 skips 2, update 3 skips its first and stops
    at its second, with the clear error; no optimizer step was taken in update 3, so the state before it is saved."""
    from trl_ext.runtime.nonfinite import NonFiniteError

    trainer = make_trainer(tiny_models, tok, tmp_path, trainer_cls=nan_loss_trainer(2), nonfinite_policy="skip",
                           max_consecutive_nonfinite_skips=3)
    message = (r"^update 3: loss/total contains NaN \(1 of 1 processes\) \(PPO epoch 2, mini-batch 1, micro-batch 1\) "
               r"\(after 3 consecutive skipped steps, max_consecutive_nonfinite_skips\); the state before this update "
               r"is saved in ")
    with pytest.raises(NonFiniteError, match=message) as caught:
        trainer.train()
    assert caught.value.saved and caught.value.checkpoint == str(tmp_path / "checkpoint-2")
    assert trainer.step_guard.skipped_steps == 3


def test_skip_drops_an_update_with_nan_scores(tiny_models, tok, tmp_path):
    """NaN reward scores in update 2: the update is dropped whole (no step, no KL-controller update), logged."""
    snapshots = Snapshots()

    class PoisonReward(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            with torch.no_grad():
                weight = snapshots.trainer.reward_model.score.weight
                weight[0, 0] = float("nan") if state.global_step == 1 else 0.5

    trainer = make_trainer(tiny_models, tok, tmp_path, callbacks=[snapshots, PoisonReward()], nonfinite_policy="skip",
                           kl_controller="adaptive", kl_target=0.01, kl_horizon=8)
    snapshots.trainer = trainer
    trainer.train()
    assert_same_state(snapshots.after[1], snapshots.after[2])
    skipped = [e for e in trainer.state.log_history if e.get("step") == 2]
    assert skipped and "objective/kl" not in skipped[0] and skipped[0]["nonfinite/skipped_steps"] == 1
    assert update_logs(trainer)[-1]["nonfinite/consecutive_skips"] == 0


def test_float16_models_train_with_skip(tiny_models, tok, tmp_path):
    """Policy, value and reward models in float16 (as TRL's test_train_model_dtype loads them), no autocast: with
    `skip` the run goes through, every logged update is either trained (finite metrics) or counted as skipped."""
    trainer = make_trainer(tiny_models, tok, tmp_path, dtype=torch.float16, nonfinite_policy="skip",
                           learning_rate=1e-4)
    model = trainer.accelerator.unwrap_model(trainer.model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 3
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    assert all(torch.isfinite(p).all() for p in model.parameters())
    logs = update_logs(trainer)
    assert len(logs) + trainer.step_guard.skipped_steps >= 3  # each update trained (logged) or was counted skipped
    assert trainer.step_guard.skipped_steps < 6  # not every optimizer step was skipped: it trained
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
