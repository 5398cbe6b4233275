"""Reward and DPO trainers: SIGINT/SIGTERM save a checkpoint that resumes (with our extensions on), atomic saves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from datasets import Dataset

from trl_ext.runtime.checkpoints import latest_checkpoint, resolve_checkpoint
from trl_ext.errors import UserInputError
from trl_ext.runtime.interruption import SignalWatcher, TrainingInterrupted
from trl_ext.runtime.nonfinite import NonFiniteError
from trl_ext.testing import build_causal_lm

from signal_callbacks import SendSignalAfterStep
from trainer_helpers import MAX_STEPS, common, pair_rows, ranked_rows


def reward_trainer(tiny_models, tokenizer, out, callbacks=None, trainer_cls=None, **kw):
    from transformers import AutoModelForSequenceClassification

    from trl_ext import RewardConfig, RewardTrainer

    data = Dataset.from_list(ranked_rows([2, 3, 4, 2, 3, 2, 4, 3, 2, 3, 2, 4], seed=8))
    return (trainer_cls or RewardTrainer)(
        model=AutoModelForSequenceClassification.from_pretrained(tiny_models.reward),
        args=RewardConfig(**common(out, label_smoothing=0.15, **kw)), train_dataset=data,
        processing_class=tokenizer, callbacks=callbacks,
    )


def dpo_trainer(tiny_models, tokenizer, out, callbacks=None, **kw):
    from transformers import AutoModelForCausalLM

    from trl_ext import DPOConfig, DPOTrainer

    return DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_models.policy), ref_model=build_causal_lm(tokenizer, seed=7),
        args=DPOConfig(**common(out, label_smoothing=0.1, beta=0.5, **kw)),
        train_dataset=Dataset.from_list(pair_rows(12)), processing_class=tokenizer, callbacks=callbacks,
    )


def step_logs(trainer):
    return {h["step"]: h for h in trainer.state.log_history if "loss" in h}


KEYS = {"reward": ["loss", "accuracy", "margin", "mean_reward"],
        "dpo": ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen"]}


@pytest.mark.parametrize("kind, signum", [("reward", signal.SIGINT), ("dpo", signal.SIGTERM)])
def test_signal_saves_a_checkpoint_that_resumes(tiny_models, tokenizer, tmp_path, kind, signum):
    make = reward_trainer if kind == "reward" else dpo_trainer
    reference = make(tiny_models, tokenizer, tmp_path / "reference")
    reference.train()
    expected = step_logs(reference)

    interrupted = make(tiny_models, tokenizer, tmp_path / "run", callbacks=[SendSignalAfterStep(signum, 2)])
    with pytest.raises(TrainingInterrupted) as caught:
        interrupted.train()
    err = caught.value
    assert err.exit_code == 128 + signum and err.step == 2
    assert err.checkpoint == str(tmp_path / "run" / "checkpoint-2") and os.path.isdir(err.checkpoint)
    assert interrupted.state.global_step == 2  # stopped right after the step that saw the signal

    resumed = make(tiny_models, tokenizer, tmp_path / "run")
    if kind == "dpo":  # cDPO survives the resume: TRL's robust loss with the derived flip rate
        assert resumed.loss_types == ["robust"] and resumed.label_smoothing == pytest.approx(-0.1 / 0.8)
    resumed.train(resume_from_checkpoint=True)
    got = step_logs(resumed)
    assert sorted(got) == list(range(1, MAX_STEPS + 1))
    for step in (3, 4):
        for key in KEYS[kind]:
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-5), (step, key)
    assert got[3]["loss"] != pytest.approx(got[4]["loss"])  # the numbers move


def test_a_save_that_dies_midway_leaves_no_checkpoint(tiny_models, tokenizer, tmp_path):
    from trl_ext import RewardTrainer

    class DiesInSecondSave(RewardTrainer):
        def save_extra_checkpoint_files(self, checkpoint_dir):
            if self.state.global_step == 2:
                raise OSError("disk full (simulated)")

    trainer = reward_trainer(tiny_models, tokenizer, tmp_path, trainer_cls=DiesInSecondSave, save_strategy="steps",
                             save_steps=1)
    with pytest.raises(OSError, match="simulated"):
        trainer.train()
    names = sorted(os.listdir(tmp_path))
    assert "checkpoint-1" in names and "checkpoint-2" not in names and "tmp-checkpoint-2" in names
    # the half-written one holds model weights already, but nothing takes it for a checkpoint
    assert os.path.isfile(tmp_path / "tmp-checkpoint-2" / "checkpoint-2" / "model.safetensors")
    assert latest_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-1")
    resumed = reward_trainer(tiny_models, tokenizer, tmp_path, save_strategy="steps", save_steps=1)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == MAX_STEPS
    assert sorted(n for n in os.listdir(tmp_path) if "checkpoint" in n) == [f"checkpoint-{i}" for i in range(1, 5)]


def test_resolve_checkpoint(tmp_path):
    for step in (2, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-11").mkdir()  # incomplete
    (tmp_path / "tmp-checkpoint-12" / "checkpoint-12").mkdir(parents=True)
    latest = str(tmp_path / "checkpoint-10")
    assert resolve_checkpoint(True, str(tmp_path)) == latest
    assert resolve_checkpoint("true", str(tmp_path)) == latest
    assert resolve_checkpoint("false", str(tmp_path)) is None and resolve_checkpoint(None, str(tmp_path)) is None
    assert resolve_checkpoint(str(tmp_path / "checkpoint-2"), "unused") == str(tmp_path / "checkpoint-2")
    with pytest.raises(UserInputError, match="resume_from_checkpoint: .*checkpoint-11.* not a complete checkpoint"):
        resolve_checkpoint(str(tmp_path / "checkpoint-11"), str(tmp_path))
    with pytest.raises(UserInputError, match="resume_from_checkpoint: no complete checkpoint"):
        resolve_checkpoint(True, str(tmp_path / "nothing-here"))


def test_nan_loss_stops_the_reward_trainer_with_the_state_before_the_step(tiny_models, tokenizer, tmp_path):
    from trl_ext import RewardTrainer

    class NaNAtStepThree(RewardTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss * float("nan") if self.state.global_step == 2 else loss

    reference = reward_trainer(tiny_models, tokenizer, tmp_path / "reference")
    reference.train()
    trainer = reward_trainer(tiny_models, tokenizer, tmp_path / "run", trainer_cls=NaNAtStepThree)
    message = r"^step 3: loss contains NaN \(1 of 1 processes\); the state before this step is saved in "
    with pytest.raises(NonFiniteError, match=message) as caught:
        trainer.train()
    assert caught.value.saved and caught.value.checkpoint == str(tmp_path / "run" / "checkpoint-2")
    # checkpoint-2 holds the weights before the failing step: resuming without the fault finishes like the reference
    resumed = reward_trainer(tiny_models, tokenizer, tmp_path / "run")
    resumed.train(resume_from_checkpoint=caught.value.checkpoint)
    assert step_logs(resumed)[4]["loss"] == pytest.approx(step_logs(reference)[4]["loss"], abs=1e-5)


def test_a_second_ctrl_c_interrupts_at_once():
    """The signals are raised with signal.raise_signal, whose handler has run when it returns (os.kill's may run
    later, on a loaded machine after the pytest.raises block has closed, or in another thread)."""
    # Python's own handler, as in a program run from a terminal (pytest run as a background job ignores SIGINT)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher = SignalWatcher()
    try:
        watcher.install()
        signal.raise_signal(signal.SIGINT)  # recorded, nothing raised
        assert watcher.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back by the second signal
    finally:
        watcher.uninstall()
        signal.signal(signal.SIGINT, outer)


def test_a_second_sigterm_with_no_handler_before_ends_the_process_at_once():
    """Where SIGTERM had its default action, the second one restores it and raises it: the process ends there."""
    program = textwrap.dedent("""
        import signal
        from trl_ext.runtime.interruption import SignalWatcher

        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # whatever the test's runner left
        SignalWatcher().install()
        signal.raise_signal(signal.SIGTERM)
        print("recorded", flush=True)
        signal.raise_signal(signal.SIGTERM)
        print("still running", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert (proc.returncode, proc.stdout) == (-signal.SIGTERM, "recorded\n"), proc.stderr
