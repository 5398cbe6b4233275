"""The package installs, exports its trainers as subclasses of TRL's, and its CLI answers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trl_ext

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "trl_ext", *args], capture_output=True, text=True, env=env, cwd=ROOT, **kwargs
    )


def test_exports_are_subclasses_of_trl():
    import trl
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    assert issubclass(trl_ext.PPOTrainer, PPOTrainer) and trl_ext.PPOTrainer is not PPOTrainer
    assert issubclass(trl_ext.PPOConfig, PPOConfig) and trl_ext.PPOConfig is not PPOConfig
    assert issubclass(trl_ext.RewardTrainer, trl.RewardTrainer) and trl_ext.RewardTrainer is not trl.RewardTrainer
    assert issubclass(trl_ext.RewardConfig, trl.RewardConfig) and trl_ext.RewardConfig is not trl.RewardConfig
    assert issubclass(trl_ext.DPOTrainer, trl.DPOTrainer) and trl_ext.DPOTrainer is not trl.DPOTrainer
    assert issubclass(trl_ext.DPOConfig, trl.DPOConfig) and trl_ext.DPOConfig is not trl.DPOConfig


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        trl_ext.NoSuchThing  # noqa: B018


def test_cli_version_and_help():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"trl-ext {trl_ext.__version__}"
    out = run_cli("--help")
    assert out.returncode == 0
    assert "train" in out.stdout and "check" in out.stdout


def test_tiny_models_are_deterministic(tiny_models, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from trl_ext.testing import build_tiny_models

    again = build_tiny_models(tmp_path / "again")
    for cls, a, b in (
        (AutoModelForCausalLM, tiny_models.policy, again.policy),
        (AutoModelForSequenceClassification, tiny_models.reward, again.reward),
    ):
        sa, sb = cls.from_pretrained(a).state_dict(), cls.from_pretrained(b).state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    reward = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    assert reward.config.num_labels == 1 and reward.score.out_features == 1


def test_tiny_tokenizer_roundtrip_and_chat_template(tokenizer):
    text = "the cat is very happy"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|user|>hello</s><|assistant|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
