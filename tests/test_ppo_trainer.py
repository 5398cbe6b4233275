"""trl_ext.PPOTrainer: parent equivalence, KL controllers from the logs, ptx, LoRA models, steps and errors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from ppo_helpers import (
    config_kwargs,
    left_tokenizer,
    load_models,
    prompt_dataset,
    ptx_dataset,
    seed_all,
    update_logs,
)

EXCLUDED = ("eps",)  # wall-clock episodes per second


@pytest.fixture(scope="module")
def tok(tiny_models):
    return left_tokenizer(tiny_models)


@pytest.fixture(scope="module")
def data(tok):
    return prompt_dataset(tok), prompt_dataset(tok, n=4, seed=5)


def run(trainer_cls, config_cls, tiny_models, tok, data, tmp_path, *, peft_config=None, value_model=None,
        trainer_kwargs=None, **overrides):
    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    trainer = trainer_cls(
        args=config_cls(**config_kwargs(tmp_path, **overrides)),
        processing_class=tok,
        model=policy,
        ref_model=None,
        reward_model=reward,
        train_dataset=data[0],
        value_model=value_model if value_model is not None else value,
        eval_dataset=data[1],
        peft_config=peft_config,
        **(trainer_kwargs or {}),
    )
    trainer.train()
    return trainer, update_logs(trainer)


def run_ext(*args, **kwargs):
    import trl_ext

    return run(trl_ext.PPOTrainer, trl_ext.PPOConfig, *args, **kwargs)


def lora_config(**kwargs):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **kwargs)


def assert_same_metrics(parent_logs, child_logs):
    assert len(parent_logs) == len(child_logs) == 3
    for parent, child in zip(parent_logs, child_logs):
        for key, value in parent.items():
            if key in EXCLUDED:
                continue
            assert child[key] == pytest.approx(value, abs=1e-6, rel=1e-6), (parent["step"], key)
    # the run is not trivially constant: the policy moved and the value loss changed
    assert parent_logs[-1]["objective/kl"] != parent_logs[0]["objective/kl"]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_defaults_reproduce_trl_metrics(tiny_models, tok, data, tmp_path, lora):
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    peft = lora_config() if lora else None
    _, parent = run(PPOTrainer, PPOConfig, tiny_models, tok, data, tmp_path / "trl", peft_config=peft)
    child_trainer, child = run_ext(tiny_models, tok, data, tmp_path / "ext", peft_config=peft)
    assert_same_metrics(parent, child)
    for entry in child:
        assert entry["objective/kl_coef"] == 0.05
        assert all(entry[f"time/{phase}"] >= 0 for phase in ("rollout", "scoring", "optimization"))
        assert "loss/ptx_avg" not in entry
    assert child_trainer.state.global_step == 3 and child_trainer.state.episode == 12
