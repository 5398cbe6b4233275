"""The non-finite policy (trl_ext.runtime.nonfinite): StepGuard's arithmetic, the config keys, and `skip` in the SFT,
reward and DPO trainers, in float32 with a forced NaN and in float16 (models loaded with dtype=torch.float16, as TRL's
test_train_model_dtype does). PPO's side is in tests/ppo/test_ppo_nonfinite.py."""

from __future__ import annotations

import copy

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from trl_ext.errors import UserInputError
from trl_ext.runtime.nonfinite import NonFiniteError, StepGuard
from trl_ext.testing import build_causal_lm

from trainer_helpers import MAX_STEPS, common, pair_rows


# ------------------------------------------------------------------ StepGuard


def test_counts_and_the_error_message_of_each_case():
    from trl_ext.runtime.nonfinite import NonFiniteCounts, count_nonfinite

    counts = count_nonfinite(torch.tensor([1.0, float("nan"), float("inf"), -float("inf")]))
    assert (counts.nan, counts.inf, counts.total, counts.ok) == (1, 2, 4, False)
    assert [NonFiniteCounts(*c).ok for c in ((0, 0, 4), (1, 0, 4), (0, 1, 4))] == [True, False, False]
    nan = NonFiniteCounts(2, 0, 4)
    assert str(NonFiniteError(3, "objective/scores", nan, "rollouts", None)) == (
        "update 3: objective/scores contains NaN (2 of 4 rollouts); weights had already changed in this update and "
        "there is no complete checkpoint")
    assert str(NonFiniteError(3, "loss/total", NonFiniteCounts(0, 1, 8), "tokens", "out/checkpoint-2")).endswith(
        "contains inf (1 of 8 tokens); weights had already changed in this update; latest complete checkpoint: "
        "out/checkpoint-2")
    saved = NonFiniteError(3, "loss/total", nan, "tokens", "out/checkpoint-3", saved=True, step_kind="step")
    assert str(saved).endswith("; the state before this step is saved in out/checkpoint-3") and saved.saved


def test_guard_finds_the_first_bad_micro_batch_with_its_counts():
    guard = StepGuard("stop")
    guard.observe(torch.tensor(1.0), where=" (micro-batch 1)")
    guard.observe(torch.tensor([float("nan"), 2.0, float("inf"), float("nan")]), "loss/x", "rows", " (micro-batch 2)")
    guard.observe(torch.tensor(float("inf")), where=" (micro-batch 3)")
    finding = guard.inspect()
    assert (finding.quantity, finding.unit, finding.where) == ("loss/x", "rows", " (micro-batch 2)")
    assert (finding.counts.nan, finding.counts.inf, finding.counts.total) == (2, 1, 4)
    assert guard.inspect() is None  # the record starts afresh after each step


def test_guard_checks_gradients_through_their_norms():
    layer = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 3)).sum().backward()
    guard = StepGuard("stop")
    guard.observe(torch.tensor(0.5))
    assert guard.inspect(optimizer) is None
    layer.bias.grad[1] = float("inf")
    guard.observe(torch.tensor(0.5))
    finding = guard.inspect(optimizer)
    assert finding.quantity == "grad_norm"
    assert (finding.counts.nan, finding.counts.inf, finding.counts.total) == (0, 1, 2)
    assert guard.inspect(optimizer, check_gradients=False) is None  # left to the loss scaler


def test_skip_counts_consecutive_steps_and_stops_after_the_bound():
    guard = StepGuard("skip", max_consecutive_skips=2)
    decisions = []
    for bad in (True, True, False, True, True, True):
        finding = object() if bad else None  # a Finding, or None (all finite)
        if guard.must_stop(finding):
            decisions.append("stop")
            break
        decisions.append("step" if guard.decide(finding) else "skip")
    assert decisions == ["skip", "skip", "step", "skip", "skip", "stop"]
    assert guard.skipped_steps == 4 and guard.consecutive_skips == 2
    assert guard.metrics() == {"nonfinite/skipped_steps": 4, "nonfinite/consecutive_skips": 2}
    assert StepGuard("stop").must_stop(object()) and StepGuard("stop").metrics() == {}


@pytest.mark.parametrize("key, value, message", [
    ("nonfinite_policy", "ignore", r"^nonfinite_policy: invalid choice 'ignore' \(valid: one of stop, skip\)$"),
    ("max_consecutive_nonfinite_skips", 0, r"^max_consecutive_nonfinite_skips: 0 is out of range \(valid: an integer >= 1\)$"),
    ("max_consecutive_nonfinite_skips", 2.5, r"^max_consecutive_nonfinite_skips: 2.5 is not an integer \(valid: an integer >= 1\)$"),
])
@pytest.mark.parametrize("config", ["SFTConfig", "RewardConfig", "DPOConfig", "PPOConfig"])
def test_bad_policy_values_are_one_line_errors(tmp_path, config, key, value, message):
    import trl_ext

    with pytest.raises(UserInputError, match=message):
        getattr(trl_ext, config)(output_dir=str(tmp_path), use_cpu=True, **{key: value})


# ------------------------------------------------------------------ the HF-Trainer-based trainers


def make(kind, tiny_models, tokenizer, out, trainer_cls=None, callbacks=None, dtype=None, **kw):
    """A tiny SFT, reward or DPO trainer (`trainer_cls` may subclass trl-ext's)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    import trl_ext

    load = dict(dtype=dtype) if dtype is not None else {}
    data = Dataset.from_list(pair_rows(12))
    if kind == "sft":
        data = Dataset.from_list([{"prompt": r["prompt"], "completion": r["chosen"]} for r in pair_rows(12)])
        cls, args = trl_ext.SFTTrainer, trl_ext.SFTConfig(**common(out, **kw))
        extra = dict(model=AutoModelForCausalLM.from_pretrained(tiny_models.policy, **load))
    elif kind == "reward":
        cls, args = trl_ext.RewardTrainer, trl_ext.RewardConfig(**common(out, **kw))
        extra = dict(model=AutoModelForSequenceClassification.from_pretrained(tiny_models.reward, **load))
    else:
        cls, args = trl_ext.DPOTrainer, trl_ext.DPOConfig(**common(out, beta=0.5, **kw))
        ref = build_causal_lm(tokenizer, seed=7)
        extra = dict(model=AutoModelForCausalLM.from_pretrained(tiny_models.policy, **load),
                     ref_model=ref.to(dtype) if dtype is not None else ref)
    return (trainer_cls or cls)(args=args, train_dataset=data, processing_class=tokenizer, callbacks=callbacks,
                                **extra)


def nan_at(kind, steps):
    """The trainer of `kind` whose loss is NaN at the (1-based) optimizer steps in `steps`."""
    import trl_ext

    parent = {"sft": trl_ext.SFTTrainer, "reward": trl_ext.RewardTrainer, "dpo": trl_ext.DPOTrainer}[kind]

    class NaNAt(parent):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            nan = self.state.global_step + 1 in steps
            if return_outputs:
                return (loss[0] * float("nan"), loss[1]) if nan else loss
            return loss * float("nan") if nan else loss

    return NaNAt


class Snapshots(TrainerCallback):
    """Weights, Adam state and scheduler position at the start of training and after every step."""

    def __init__(self):
        self.after = {}

    def _take(self, step, model, optimizer, lr_scheduler):
        state = copy.deepcopy(optimizer.state_dict()["state"]) if optimizer is not None else None
        self.after[step] = ({n: p.detach().clone() for n, p in model.named_parameters()}, state,
                            lr_scheduler.last_epoch if lr_scheduler is not None else None)

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        self._take(state.global_step, model, optimizer, lr_scheduler)


def same_state(a, b) -> bool:
    weights_a, optim_a, sched_a = a
    weights_b, optim_b, sched_b = b
    if sched_a != sched_b or optim_a.keys() != optim_b.keys():
        return False
    if not all(torch.equal(weights_a[n], weights_b[n]) for n in weights_a):
        return False
    return all(torch.equal(torch.as_tensor(v), torch.as_tensor(optim_b[k][name]))
               for k in optim_a for name, v in optim_a[k].items())


def logs(trainer):
    return {h["step"]: h for h in trainer.state.log_history if "loss" in h}


@pytest.mark.parametrize("kind", ["sft", "reward", "dpo"])
def test_skip_takes_no_step_for_a_nan_loss(tiny_models, tokenizer, tmp_path, kind):
    """Step 3's loss is NaN: under `skip` the weights, the Adam state and the LR schedule after step 3 are those
    after step 2; the skip is logged; step 4 trains again."""
    snapshots = Snapshots()
    trainer = make(kind, tiny_models, tokenizer, tmp_path, trainer_cls=nan_at(kind, {3}), callbacks=[snapshots],
                   nonfinite_policy="skip")
    trainer.train()
    assert trainer.state.global_step == MAX_STEPS
    assert same_state(snapshots.after[2], snapshots.after[3])
    assert snapshots.after[2][2] == 2 and snapshots.after[4][2] == 3  # the scheduler skipped step 3 only
    assert not same_state(snapshots.after[3], snapshots.after[4])
    logged = logs(trainer)
    assert [logged[s]["nonfinite/skipped_steps"] for s in (1, 2, 3, 4)] == [0, 0, 1, 1]
    assert [logged[s]["nonfinite/consecutive_skips"] for s in (1, 2, 3, 4)] == [0, 0, 1, 0]


@pytest.mark.parametrize("kind", ["sft", "reward", "dpo"])
def test_consecutive_skips_stop_with_the_clear_error(tiny_models, tokenizer, tmp_path, kind):
    """Losses NaN from step 2 on, at most 2 consecutive skips: steps 2 and 3 are skipped, step 4 stops the run with
    the error; the state saved is the one before step 4, which is the one after step 1."""
    snapshots = Snapshots()
    trainer = make(kind, tiny_models, tokenizer, tmp_path, trainer_cls=nan_at(kind, {2, 3, 4}), callbacks=[snapshots],
                   nonfinite_policy="skip", max_consecutive_nonfinite_skips=2)
    message = (r"^step 4: loss contains NaN \(1 of 1 processes\) \(after 2 consecutive skipped steps, "
               r"max_consecutive_nonfinite_skips\); the state before this step is saved in ")
    with pytest.raises(NonFiniteError, match=message) as caught:
        trainer.train()
    assert caught.value.checkpoint == str(tmp_path / "checkpoint-3")
    assert same_state(snapshots.after[1], snapshots.after[3])


@pytest.mark.parametrize("kind", ["sft", "reward", "dpo"])
def test_float16_models_train_with_skip(tiny_models, tokenizer, tmp_path, kind):
    """Models loaded in float16 (no autocast, no loss scaler: TRL's test_train_model_dtype), large steps: with `skip`
    the run reaches its last step, the weights stay float16 and finite, and training moved them."""
    trainer = make(kind, tiny_models, tokenizer, tmp_path, dtype=torch.float16, nonfinite_policy="skip",
                   learning_rate=1e-3)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == MAX_STEPS
    params = dict(trainer.model.named_parameters())
    assert {p.dtype for p in params.values()} == {torch.float16}
    assert all(torch.isfinite(p).all() for p in params.values())
    assert any(not torch.equal(before[n], p) for n, p in params.items())
    assert logs(trainer)[MAX_STEPS]["nonfinite/skipped_steps"] == trainer.step_guard.skipped_steps < MAX_STEPS


def test_loss_scaler_skips_are_counted_not_failures():
    """fp16's loss scaler (accelerate's optimizer with a GradScaler; here torch's CPU one, since accelerate gives
    none on CPU): a scaled loss that overflows makes inf gradients, the scaler skips that step and halves its scale;
    under `stop` this is no failure, the weights stay, the skip is counted apart; the next step goes through."""
    from accelerate import Accelerator
    from accelerate.optimizer import AcceleratedOptimizer

    from trl_ext.runtime.nonfinite import guarded_optimizer_step

    def fail(finding):
        raise AssertionError(f"not a failure: {finding}")

    accelerator = Accelerator(cpu=True)
    layer = torch.nn.Linear(3, 1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    optimizer = AcceleratedOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1), scaler=scaler)
    guard = StepGuard("stop")
    start = [p.detach().clone() for p in layer.parameters()]
    for factor, stepped in ((1e35, False), (1.0, True)):  # 1e35 * 2**16 overflows float32: inf gradients
        loss = layer(torch.ones(1, 3)).sum() * factor
        guard.observe(loss)  # finite: the loss itself is fine
        scaler.scale(loss).backward()
        assert guarded_optimizer_step(guard, optimizer, accelerator, fail)  # handed to the scaler either way
        assert optimizer.step_was_skipped is not stepped
        optimizer.zero_grad()
        if not stepped:
            assert all(torch.equal(a, b) for a, b in zip(start, layer.parameters()))
            assert scaler.get_scale() == 2.0**15
    assert not all(torch.equal(a, b) for a, b in zip(start, layer.parameters()))
    assert guard.metrics() == {"nonfinite/scaler_skipped_steps": 1}
    assert guard.skipped_steps == 0

    # a NaN loss under `skip`, after the gradients were unscaled for clipping (as HF Trainer does): skipped by the
    # guard, the scaler keeps its scale and its next step goes through
    guard, weights = StepGuard("skip"), [p.detach().clone() for p in layer.parameters()]
    for factor, stepped in ((float("nan"), False), (1.0, True)):
        loss = layer(torch.ones(1, 3)).sum() * factor
        guard.observe(loss)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer.optimizer)
        assert guarded_optimizer_step(guard, optimizer, accelerator, fail) is stepped
        optimizer.zero_grad()
        if not stepped:
            assert all(torch.equal(a, b) for a, b in zip(weights, layer.parameters()))
            assert optimizer.step_was_skipped and scaler.get_scale() == 2.0**15
    assert not all(torch.equal(a, b) for a, b in zip(weights, layer.parameters()))
    assert guard.metrics() == {"nonfinite/skipped_steps": 1, "nonfinite/consecutive_skips": 0,
                               "nonfinite/scaler_skipped_steps": 0}
