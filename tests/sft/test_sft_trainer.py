"""trl_ext.SFTTrainer: TRL's numbers exactly; SIGTERM saves a checkpoint that resumes; a NaN loss stops it."""

import os
import random
import signal

import pytest
import torch
from datasets import Dataset

import trl
from trl_ext import SFTConfig, SFTTrainer
from trl_ext.runtime.interruption import TrainingInterrupted
from trl_ext.runtime.nonfinite import NonFiniteError
from trl_ext.testing import tiny_corpus

from signal_callbacks import SendSignalAfterStep

WORDS = tiny_corpus(60, seed=5)
KEYS = ["loss", "grad_norm", "entropy", "mean_token_accuracy", "num_tokens"]
MAX_STEPS = 4


def prompt_completion_rows(n=16, seed=0):
    rng = random.Random(seed)
    return [{"prompt": rng.choice(WORDS)[:24], "completion": " " + rng.choice(WORDS)} for _ in range(n)]


def config(out, **kw):
    base = dict(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
                max_steps=MAX_STEPS, per_device_train_batch_size=4, logging_steps=1, save_strategy="no",
                learning_rate=1e-2, seed=0, max_length=64, disable_tqdm=True)
    base.update(kw)
    return SFTConfig(**base)


def make(cls, tiny_models, tokenizer, out, data, callbacks=None, **kw):
    from transformers import AutoModelForCausalLM

    return cls(model=AutoModelForCausalLM.from_pretrained(tiny_models.policy), args=config(out, **kw),
               train_dataset=data, processing_class=tokenizer, callbacks=callbacks)


def step_logs(trainer):
    return {h["step"]: h for h in trainer.state.log_history if "loss" in h}


def test_sft_config_is_trls():
    # TRL's fields and defaults, plus the non-finite policy (trl_ext.runtime.nonfinite) whose default is TRL's behaviour
    assert issubclass(SFTConfig, trl.SFTConfig)
    ours, theirs = SFTConfig(output_dir="x", use_cpu=True), trl.SFTConfig(output_dir="x", use_cpu=True)
    assert {k: v for k, v in ours.to_dict().items() if "nonfinite" not in k} == theirs.to_dict()
    assert ours.nonfinite_policy == "stop"
    assert issubclass(SFTTrainer, trl.SFTTrainer) and SFTTrainer is not trl.SFTTrainer


@pytest.mark.parametrize("fmt", ["prompt_completion", "text"])
def test_reproduces_trl(tiny_models, tokenizer, tmp_path, fmt):
    rows = prompt_completion_rows()
    if fmt == "text":
        rows = [{"text": r["prompt"] + r["completion"]} for r in rows]
    data = Dataset.from_list(rows)
    a = make(trl.SFTTrainer, tiny_models, tokenizer, tmp_path / "trl", data)
    a.train()
    b = make(SFTTrainer, tiny_models, tokenizer, tmp_path / "ext", data)
    b.train()
    la, lb = step_logs(a), step_logs(b)
    assert sorted(la) == list(range(1, MAX_STEPS + 1))
    for step in la:
        assert {k: la[step][k] for k in KEYS} == {k: lb[step][k] for k in KEYS}
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(pa, pb), name
    # it trains: the weights moved from the start (the loss fell only 2.5-6 % in 4 steps over seeds 0-2 and kernels:
    # no threshold on it)
    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    assert not all(torch.equal(p, q) for p, q in zip(start.parameters(), a.model.parameters()))


def test_sigterm_saves_a_checkpoint_that_resumes(tiny_models, tokenizer, tmp_path):
    data = Dataset.from_list(prompt_completion_rows(seed=1))
    reference = make(SFTTrainer, tiny_models, tokenizer, tmp_path / "reference", data)
    reference.train()
    interrupted = make(SFTTrainer, tiny_models, tokenizer, tmp_path / "run", data,
                       callbacks=[SendSignalAfterStep(signal.SIGTERM, 2)])
    with pytest.raises(TrainingInterrupted) as caught:
        interrupted.train()
    assert caught.value.exit_code == 143 and caught.value.step == 2
    assert caught.value.checkpoint == str(tmp_path / "run" / "checkpoint-2") and os.path.isdir(caught.value.checkpoint)

    resumed = make(SFTTrainer, tiny_models, tokenizer, tmp_path / "run", data)
    resumed.train(resume_from_checkpoint=True)
    expected, got = step_logs(reference), step_logs(resumed)
    for step in (3, 4):
        for key in ("loss", "grad_norm", "mean_token_accuracy"):
            assert got[step][key] == pytest.approx(expected[step][key], abs=1e-5), (step, key)


def test_nan_loss_stops_with_the_state_before_the_step(tiny_models, tokenizer, tmp_path):
    class NaNAtStepThree(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            return loss * float("nan") if self.state.global_step == 2 else loss

    data = Dataset.from_list(prompt_completion_rows(seed=2))
    trainer = make(NaNAtStepThree, tiny_models, tokenizer, tmp_path / "run", data)
    with pytest.raises(NonFiniteError, match=r"^step 3: loss contains NaN") as caught:
        trainer.train()
    assert caught.value.saved and caught.value.checkpoint == str(tmp_path / "run" / "checkpoint-2")
