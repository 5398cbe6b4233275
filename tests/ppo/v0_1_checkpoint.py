"""Checkpoints written by trl-ext 0.1.0, before the package moved into subpackages (issue #10): the fixture's maker.

`tests/data/v0_1_checkpoints/` holds what trl-ext 0.1.0 (commit dba66a4, the flat `trl_ext/*.py` layout) wrote:

* `ppo/checkpoint-3`: a PPO checkpoint of the run :func:`make_ppo_trainer` builds (LoRA policy whose reference is the
  policy with adapters off, adaptive KL, joint PPO-ptx; 8 prompts, 4 per update, so update 3 ends mid-epoch). Its
  `training_args.bin` pickles the config class by its 0.1.0 path, `trl_ext.ppo_config.PPOConfig`.
* `ppo/updates.json`: the metrics of the uninterrupted run's 4 updates, which a resume from `checkpoint-3` must
  reproduce.
* `reward_training_args.bin`, `dpo_training_args.bin`: the configs as HF Trainer pickles them into every checkpoint
  (`trl_ext.reward_config.RewardConfig`, `trl_ext.dpo_config.DPOConfig`).

Only public API is used here, so the script runs on any version; the point of the fixture is that its files come
from 0.1.0. To remake them (this overwrites them with what the code you point PYTHONPATH at writes):

    git worktree add /tmp/trl-ext-0.1.0 dba66a4
    PYTHONPATH=/tmp/trl-ext-0.1.0 python tests/ppo/v0_1_checkpoint.py tests/data/v0_1_checkpoints
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
from pathlib import Path

N_UPDATES = 4
CHECKPOINT_STEP = 3
WALL_CLOCK_PREFIXES = ("eps", "time/")


def make_ppo_trainer(tiny_models, output_dir, **overrides):
    """The fixture's PPO run: same seed, models and data every call."""
    import numpy as np
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    import trl_ext
    from trl_ext.testing import tiny_corpus

    tok = AutoTokenizer.from_pretrained(tiny_models.tokenizer)
    tok.padding_side = "left"
    prompts = Dataset.from_dict(
        {"input_ids": [tok(" ".join(line.split()[:4]))["input_ids"] for line in tiny_corpus(8, seed=21)]}
    )
    ptx = Dataset.from_dict({"text": tiny_corpus(16, seed=22)})
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    value = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    reward = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    kwargs = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, report_to="none", disable_tqdm=True, seed=11,
        per_device_train_batch_size=2, gradient_accumulation_steps=2, num_mini_batches=1, num_ppo_epochs=2,
        total_episodes=4 * N_UPDATES, response_length=8, learning_rate=1e-3, logging_steps=1,
        stop_token="eos", missing_eos_penalty=1.0, local_rollout_forward_batch_size=2, num_sample_generations=0,
        kl_controller="adaptive", kl_target=0.01, kl_horizon=8, ptx_coef=0.5, ptx_max_length=16,
        save_strategy="steps", save_steps=CHECKPOINT_STEP, max_grad_norm=0.0,  # 0.1.0 clipped no gradient
    )
    kwargs.update(overrides)
    return trl_ext.PPOTrainer(
        args=trl_ext.PPOConfig(**kwargs), processing_class=tok, model=policy, ref_model=None, reward_model=reward,
        train_dataset=prompts, value_model=value, ptx_dataset=ptx,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )


def update_metrics(trainer) -> list[dict]:
    """Per-update metrics without the wall-clock ones."""
    return [
        {k: v for k, v in entry.items() if not k.startswith(WALL_CLOCK_PREFIXES)}
        for entry in trainer.state.log_history
        if "objective/kl" in entry
    ]


def main(out: Path) -> None:
    import torch

    import trl_ext
    from trl_ext.testing import build_tiny_models

    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tiny_models = build_tiny_models(Path(tmp) / "tiny")
        run_dir = Path(tmp) / "ppo"
        trainer = make_ppo_trainer(tiny_models, run_dir)
        trainer.train()
        shutil.rmtree(out / "ppo", ignore_errors=True)
        (out / "ppo").mkdir()
        shutil.copytree(run_dir / f"checkpoint-{CHECKPOINT_STEP}", out / "ppo" / f"checkpoint-{CHECKPOINT_STEP}")
        (out / "ppo" / "updates.json").write_text(json.dumps(update_metrics(trainer), indent=1) + "\n")
    common = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none")
    torch.save(trl_ext.RewardConfig(**common, label_smoothing=0.1), out / "reward_training_args.bin")
    torch.save(trl_ext.DPOConfig(**common, label_smoothing=0.1), out / "dpo_training_args.bin")
    print(f"trl_ext {trl_ext.__version__} from {Path(trl_ext.__file__).parent}: wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python {sys.argv[0]} OUTPUT_DIR")
    main(Path(sys.argv[1]))
