"""Shared helpers of the PPO tests: tiny prompt and ptx data, model loading, config kwargs, seeding, log access."""

from __future__ import annotations

import random

import numpy as np
import torch


def prompt_dataset(tokenizer, n: int = 16, seed: int = 0):
    """`n` short prompts, tokenized (column `input_ids`), as TRL's PPO expects."""
    from datasets import Dataset

    from trl_ext.testing import tiny_corpus

    texts = [" ".join(line.split()[:4]) for line in tiny_corpus(n, seed=seed + 7)]
    return Dataset.from_dict({"input_ids": [tokenizer(t)["input_ids"] for t in texts]})


def ptx_dataset(n: int = 16, seed: int = 3):
    from datasets import Dataset

    from trl_ext.testing import tiny_corpus

    return Dataset.from_dict({"text": tiny_corpus(n, seed=seed)})


def left_tokenizer(tiny_models):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_models.tokenizer)
    tok.padding_side = "left"
    return tok


def load_models(tiny_models):
    """Fresh policy, value and reward models (same weights every call)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    policy = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    value = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    reward = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    return policy, value, reward


def config_kwargs(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        num_mini_batches=1,
        num_ppo_epochs=2,
        total_episodes=12,
        response_length=8,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        num_sample_generations=2,
        per_device_eval_batch_size=2,
        stop_token="eos",
        missing_eos_penalty=1.0,
        local_rollout_forward_batch_size=2,
        seed=11,
        disable_tqdm=True,
        max_grad_norm=0.0,  # TRL's PPO clips no gradient: the tests compare with it (and with each other) unclipped
    )
    kwargs.update(overrides)
    return kwargs


def seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def update_logs(trainer) -> list[dict]:
    """The per-update metric dicts of a finished run (log entries that carry `objective/kl`)."""
    return [entry for entry in trainer.state.log_history if "objective/kl" in entry]


class OptimizerSteps:
    """Counts the steps a torch optimizer takes (a step post-hook); with ``track`` (a list of parameters), also the
    L2 norm of each step's change of those parameters (``changes``)."""

    def __init__(self, optimizer, track=None):
        self.count, self.changes, self._before = 0, [], None
        self.track = list(track) if track is not None else None
        if self.track is not None:
            optimizer.register_step_pre_hook(self._snapshot)
        optimizer.register_step_post_hook(self._stepped)

    def _snapshot(self, *_):
        self._before = [p.detach().clone() for p in self.track]

    def _stepped(self, *_):
        self.count += 1
        if self.track is not None:
            diff = torch.cat([(p.detach() - b).flatten() for p, b in zip(self.track, self._before)])
            self.changes.append(diff.norm().item())


def count_optimizer_steps(trainer, track_parameters: bool = False) -> OptimizerSteps:
    """An :class:`OptimizerSteps` on `trainer`'s torch optimizer (under accelerate's wrapper); with
    `track_parameters`, tracking the change of every trainable parameter."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    track = None
    if track_parameters:
        track = [p for p in trainer.accelerator.unwrap_model(trainer.model).parameters() if p.requires_grad]
    return OptimizerSteps(optimizer, track)


def first_rollout(ppo):
    """A built trainer's first update up to the optimisation: its rollout sampled and scored (asserted finite),
    rewards and advantages computed. Returns ``(rollout, kl_coef)``."""
    ppo.model.train()
    ppo.init_train_state()
    ppo.init_data_streams()
    with torch.no_grad():
        rollout, scored, _ = ppo.sample_and_score(ppo.next_prompt_batch())
        assert scored
        kl_coef = float(ppo.kl_ctl.value)
        ppo.compute_rewards(rollout, kl_coef)
        ppo.compute_advantages(rollout)
    return rollout, kl_coef
