"""Checkpoints written by trl-ext 0.1.0 (flat layout, before issue #10) still load and resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from v0_1_checkpoint import CHECKPOINT_STEP, N_UPDATES, make_ppo_trainer, update_metrics

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "v0_1_checkpoints"


@pytest.mark.parametrize(
    "path, class_name, field, value",
    [
        ("ppo/checkpoint-3/training_args.bin", "PPOConfig", "kl_controller", "adaptive"),
        ("reward_training_args.bin", "RewardConfig", "label_smoothing", 0.1),
        ("dpo_training_args.bin", "DPOConfig", "label_smoothing", 0.1),
    ],
)
def test_pickled_configs_unpickle_as_todays_classes(path, class_name, field, value):
    import trl_ext

    config = torch.load(FIXTURE / path, weights_only=False)
    assert type(config) is getattr(trl_ext, class_name)
    assert getattr(config, field) == value


def test_ppo_resumes_from_a_v0_1_checkpoint(tiny_models, tmp_path):
    expected = json.loads((FIXTURE / "ppo" / "updates.json").read_text())
    assert [e["step"] for e in expected] == list(range(1, N_UPDATES + 1))
    shutil.copytree(FIXTURE / "ppo" / f"checkpoint-{CHECKPOINT_STEP}", tmp_path / f"checkpoint-{CHECKPOINT_STEP}")
    trainer = make_ppo_trainer(tiny_models, tmp_path, save_strategy="no")
    trainer.train(resume_from_checkpoint=True)
    got = update_metrics(trainer)
    assert [e["step"] for e in got] == [e["step"] for e in expected]
    assert got[:CHECKPOINT_STEP] == expected[:CHECKPOINT_STEP]  # the log history comes from the checkpoint
    resumed, reference = got[CHECKPOINT_STEP], expected[CHECKPOINT_STEP]
    assert resumed.keys() == reference.keys() and "loss/ptx_avg" in resumed
    # update 4 ends a prompt epoch, where 0.1.0 (TRL's arithmetic) stepped on every micro-batch and one optimizer
    # step per mini-batch is taken here: what the restored weights, RNGs and KL controller sample and score before
    # the update's optimizer steps is the same
    sampled = [key for key in reference if key.startswith("objective/")]
    assert len(sampled) >= 5
    for key in sampled:
        assert resumed[key] == pytest.approx(reference[key], abs=1e-5, rel=1e-5), key
    # the KL controller's state came back: update 4's coefficient is the one the adaptive rule reached after 3
    assert resumed["objective/kl_coef"] != expected[0]["objective/kl_coef"]
