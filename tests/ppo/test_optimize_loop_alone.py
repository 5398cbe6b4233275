"""run_ppo_epochs and GradientClip without a trainer: a model of two weight vectors, a loss linear in them (so each
step's gradient is written out by hand), a real CPU Accelerator. Checks each optimizer step's accumulated gradient,
the numpy RNG order, the no_sync / DeepSpeed boundaries, the steps taken and the clip."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from trl_ext.ppo.objective.losses import PolicyLoss, ValueLoss
from trl_ext.ppo.objective.objectives import ObjectiveConfig
from trl_ext.ppo.optimize_loop import GradientClip, MiniBatchPlan, UpdateSteps, run_ppo_epochs
from trl_ext.ppo.rollout import MicroBatchOutput

BATCH, FEATURES, LENGTH, VF_COEF = 8, 3, 5, 0.25


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.policy = nn.Parameter(torch.tensor([0.1, -0.2, 0.3]))
        self.value = nn.Parameter(torch.tensor([0.2, 0.1, -0.1]))
        self.boundaries = []

    def set_gradient_accumulation_boundary(self, last: bool):  # DeepSpeed's engine's
        self.boundaries.append(last)


def rollout_of(seed: int = 0):
    """Per sequence: features x, a policy coefficient c, and 1-5 value tokens n (``padding_mask_p1`` False there)."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(1, LENGTH + 1, (BATCH,), generator=g)
    padding = torch.arange(LENGTH)[None, :] >= n[:, None]
    return SimpleNamespace(x=torch.randn(BATCH, FEATURES, generator=g),
                           c=torch.randn(BATCH, generator=g), n=n.float(), padding_mask=padding,
                           padding_mask_p1=padding, contain_eos_token=torch.ones(BATCH, dtype=torch.bool))


def fake_loss(model, rollout, inds, ptx_batch=None, *, kl_coef, token_normalizer):
    """Policy term: mean of ``c_i x_i . policy``; value term: the token mean of ``x_i . value`` (``n_i`` tokens)."""
    x, c, n = rollout.x[inds], rollout.c[inds], rollout.n[inds]
    policy = (x @ model.policy * c).mean()
    value = (n * (x @ model.value)).sum() / n.sum()
    loss = policy + VF_COEF * value
    if ptx_batch is not None:
        loss = loss + ptx_batch["coef"] * model.policy.sum()
    zero = torch.zeros(())
    return MicroBatchOutput(loss=loss, policy=PolicyLoss(policy, zero, torch.ones(1), zero),
                            value=ValueLoss(value, zero), logits=torch.zeros(len(inds), 1, 2),
                            ptx_loss=None if ptx_batch is None else torch.tensor(1.0))


def plan_of(micro=None, *, per_device=2, mini_batch=4, epochs=2, aggregation="seq_mean_token_mean"):
    args = SimpleNamespace(local_mini_batch_size=mini_batch, per_device_train_batch_size=per_device,
                           num_ppo_epochs=epochs, local_batch_size=BATCH, vf_coef=VF_COEF, ptx_coef=0.5)
    return MiniBatchPlan.from_args(args, ObjectiveConfig(loss_aggregation=aggregation), micro)


def accelerator_of(accumulation: int):
    from accelerate import Accelerator

    return Accelerator(cpu=True, gradient_accumulation_steps=accumulation)


class Recorder:
    """The collaborators of one run: each step's gradients, and what happened in which order."""

    def __init__(self, model, taken=lambda k: True):
        self.model, self.taken = model, taken
        self.grads, self.events, self.policy_losses = [], [], []
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(self):
        self.grads.append((self.model.policy.grad.clone(), self.model.value.grad.clone()))
        self.events.append("step")
        taken = self.taken(len(self.grads))
        if taken:
            self.optimizer.step()
        return taken

    def zero_grad(self):
        self.events.append("zero_grad")
        self.optimizer.zero_grad()

    def loss(self, *args, **kwargs):
        out = fake_loss(*args, **kwargs)
        self.policy_losses.append(out.policy.loss.item())
        return out

    def steps(self, **extra):
        return UpdateSteps(loss=self.loss, step=self.step, zero_grad=self.zero_grad,
                           observe=lambda loss, quantity, where="": self.events.append(where), **extra)


def mini_batches(plan, seed):
    """The index sets of each optimizer step: TRL's numpy order, one permutation per epoch."""
    rng = np.random.RandomState(seed)
    return [perm[s:s + plan.size] for perm in (rng.permutation(plan.batch_size) for _ in range(plan.epochs))
            for s in range(0, plan.batch_size, plan.size)]


def run(plan, recorder, accumulation=2, seed=3, rollout=None, **kwargs):
    np.random.seed(seed)
    return run_ppo_epochs(rollout or rollout_of(), plan, kwargs.pop("steps", None) or recorder.steps(),
                          kwargs.pop("accelerator", None) or accelerator_of(accumulation), recorder.model,
                          kl_coef=0.1, **kwargs)


@pytest.mark.parametrize("accumulation", [1, 2, 4])
def test_unset_micro_batch_each_step_is_the_mean_of_its_micro_batches_losses(accumulation):
    """per_device_train_batch_size 2 in mini-batches of 4: each step's gradient is the mean of the two micro-batches'
    own gradients (TRL's: each its own value token mean), whatever gradient_accumulation_steps."""
    plan, rollout = plan_of(None), rollout_of()
    recorder = Recorder(Tiny())
    stats = run(plan, recorder, accumulation, rollout=rollout)
    assert plan.spans == ((0, 2), (2, 4)) and not plan.weighted
    assert stats.optimizer_steps == 4 and stats.stepped  # 2 epochs x 2 mini-batches
    for (policy, value), inds in zip(recorder.grads, mini_batches(plan, seed=3), strict=True):
        x, c, n = rollout.x[inds], rollout.c[inds], rollout.n[inds]
        assert torch.allclose(policy, (c[:, None] * x).mean(0), atol=1e-6)
        halves = [(n[h, None] * x[h]).sum(0) / n[h].sum() for h in (slice(0, 2), slice(2, 4))]
        assert torch.allclose(value, VF_COEF * (halves[0] + halves[1]) / 2, atol=1e-6)


@pytest.mark.parametrize("accumulation", [1, 3])
def test_train_micro_batch_size_weights_each_term_by_its_share_of_the_mini_batch(accumulation):
    """Micro-batches of 3 and 1 sequences: the step's gradient is that of the whole mini-batch at once (policy: the
    sequence mean; value: the token mean over the mini-batch's value tokens)."""
    plan, rollout = plan_of(3), rollout_of(1)
    recorder = Recorder(Tiny())
    stats = run(plan, recorder, accumulation, rollout=rollout)
    assert plan.spans == ((0, 3), (3, 4)) and plan.weighted and stats.optimizer_steps == 4
    for (policy, value), inds in zip(recorder.grads, mini_batches(plan, seed=3), strict=True):
        x, c, n = rollout.x[inds], rollout.c[inds], rollout.n[inds]
        assert torch.allclose(policy, (c[:, None] * x).mean(0), atol=1e-6)
        assert torch.allclose(value, VF_COEF * (n[:, None] * x).sum(0) / n.sum(), atol=1e-6)
    # the statistics of micro-batch [epoch, mini-batch, micro-batch], in the order the losses were computed
    assert stats.pg_loss.flatten().tolist() == pytest.approx(recorder.policy_losses)
    assert len(set(recorder.policy_losses)) == 8


class RecordingAccelerator:
    """A real CPU Accelerator that also records, at each backward, whether gradients sync and no_sync is open."""

    def __init__(self, accelerator):
        self.inner, self.open, self.backwards = accelerator, False, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    @contextlib.contextmanager
    def no_sync(self, model):
        self.open = True
        try:
            yield
        finally:
            self.open = False

    def backward(self, loss):
        self.backwards.append((self.inner.sync_gradients, self.open))
        self.inner.backward(loss)


def test_gradients_stay_local_until_the_mini_batchs_last_micro_batch_and_deepspeed_is_told_so():
    plan = plan_of(None, per_device=1, epochs=1)  # 4 micro-batches per mini-batch, 2 mini-batches
    accelerator = RecordingAccelerator(accelerator_of(4))
    recorder = Recorder(Tiny())
    run(plan, recorder, accelerator=accelerator, deepspeed=True)
    pattern = [False, False, False, True] * 2
    assert accelerator.backwards == [(last, not last) for last in pattern]
    assert recorder.model.boundaries == pattern
    assert accelerator.inner.sync_gradients  # left as accelerate expects it outside the loop
    where = [e for e in recorder.events if e.startswith(" (")]
    assert where[-1] == " (PPO epoch 1, mini-batch 2, micro-batch 4)" and len(where) == 8


def test_a_failing_loss_leaves_accelerate_syncing_again():
    plan = plan_of(None, per_device=1, epochs=1)
    accelerator = accelerator_of(1)
    recorder = Recorder(Tiny())

    def failing(model, rollout, inds, ptx_batch=None, **step):
        raise FloatingPointError("loss")

    with pytest.raises(FloatingPointError):
        run(plan, recorder, accelerator=accelerator,
            steps=UpdateSteps(loss=failing, step=recorder.step, zero_grad=recorder.zero_grad, observe=print))
    assert accelerator.sync_gradients


def test_the_result_counts_the_steps_taken_and_ptx_runs_where_its_mode_says():
    """A step the guard skips is not counted (none taken: not stepped); joint ptx batches come once per micro-batch,
    into the loss; the separate ptx step follows each mini-batch's step and zero_grad, its loss kept."""
    plan = plan_of(None)
    skipped_second = Recorder(Tiny(), taken=lambda k: k != 2)
    assert run(plan, skipped_second).optimizer_steps == 3
    none = run(plan, Recorder(Tiny(), taken=lambda k: False))
    assert none.optimizer_steps == 0 and not none.stepped

    recorder, batches = Recorder(Tiny()), []

    def ptx_batch():
        batches.append(len(batches))
        return {"coef": 1.0}

    def ptx_step():
        recorder.events.append("ptx")
        return torch.tensor(float(len(recorder.events)))

    stats = run(plan, recorder, steps=recorder.steps(ptx_batch=ptx_batch, ptx_step=ptx_step))
    assert len(batches) == 8  # 2 epochs x 2 mini-batches x 2 micro-batches
    rollout, inds = rollout_of(), mini_batches(plan, seed=3)[0]
    x, c = rollout.x[inds], rollout.c[inds]
    # each micro-batch's ptx term adds 1 to every policy weight's gradient; unset micro-batch: their mean
    assert torch.allclose(recorder.grads[0][0], (c[:, None] * x).mean(0) + 1.0, atol=1e-6)
    steps = [e for e in recorder.events if not e.startswith(" (")]
    assert steps == ["step", "zero_grad", "ptx"] * 4
    assert len(stats.ptx_losses) == 4 + 8  # separate steps' losses and the joint micro-batches'


def gradients(model, values):
    for p, v in zip(model.parameters(), values):
        p.grad = torch.tensor(v)


def test_gradient_clip_scales_to_max_norm_and_reports_the_mean_pre_clip_norm():
    model = Tiny()
    clip = GradientClip(1.0, accelerator_of(1), model)
    gradients(model, [[3.0, 0.0, 0.0], [0.0, 4.0, 0.0]])  # norm 5 over both vectors
    clip()
    assert torch.cat([p.grad for p in model.parameters()]).norm().item() == pytest.approx(1.0, rel=1e-5)
    gradients(model, [[0.3, 0.0, 0.0], [0.0, 0.4, 0.0]])  # norm 0.5: left alone
    clip()
    assert model.policy.grad.tolist() == pytest.approx([0.3, 0.0, 0.0])
    assert clip.metrics() == {"policy/grad_norm": pytest.approx(2.75)}
    assert clip.metrics() == {"policy/grad_norm": pytest.approx(2.75)}  # reading changes nothing
    clip.begin()
    assert clip.metrics() == {}  # a new update


def test_gradient_clip_off_computes_nothing_and_refuses_a_deepspeed_engine_that_clips_otherwise():
    from trl_ext.errors import UserInputError

    model = Tiny()
    off = GradientClip(0.0, accelerator_of(1), model)
    gradients(model, [[30.0, 0.0, 0.0], [0.0, 40.0, 0.0]])
    off()
    assert model.value.grad.tolist() == [0.0, 40.0, 0.0] and off.metrics() == {}
    model.gradient_clipping = lambda: 0.5  # what a DeepSpeed engine answers
    with pytest.raises(UserInputError, match=r"^max_grad_norm: 1.0 but DeepSpeed's engine clips at 0.5"):
        GradientClip(1.0, accelerator_of(1), model)
