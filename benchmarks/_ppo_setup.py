"""PPO benchmark setup shared by ppo_overhead.py and ppo_scaling.py: tiny models built in memory (no hub),
prompt and ptx data, configs, a trainer factory for the baseline (TRL's own PPOTrainer, or trl_ext's at its defaults
where TRL has none) and trl_ext's PPOTrainer, and a per-update timer."""

from __future__ import annotations

import copy
import random
import tempfile
import time

import numpy as np
import torch
import transformers


class Models:
    """A tokenizer (left padding) and one policy and one scalar model built once; `fresh()` hands out copies,
    so every run starts from the same weights."""

    def __init__(self, hidden: int, layers: int, seed: int = 0):
        from trl_ext.testing import build_causal_lm, build_scalar_model, build_tokenizer

        self.tokenizer = build_tokenizer(seed=seed)
        self.tokenizer.padding_side = "left"
        self.policy = build_causal_lm(self.tokenizer, seed=seed, hidden_size=hidden, num_layers=layers,
                                      max_position_embeddings=1024)
        self.scalar = build_scalar_model(self.tokenizer, seed=seed + 1, hidden_size=hidden, num_layers=layers,
                                         max_position_embeddings=1024)
        self.policy_parameters = sum(p.numel() for p in self.policy.parameters())

    def fresh(self):
        """(policy, value model, reward model): deep copies, same weights every call."""
        return copy.deepcopy(self.policy), copy.deepcopy(self.scalar), copy.deepcopy(self.scalar)


def prompts(tokenizer, n: int, words: int = 4, seed: int = 7):
    """`n` tokenized prompts of `words` words (column `input_ids`, as TRL's PPO expects)."""
    from datasets import Dataset

    from trl_ext.testing import _WORDS

    rng = random.Random(seed)
    texts = [" ".join(rng.choice(_WORDS) for _ in range(words)) for _ in range(n)]
    return Dataset.from_dict({"input_ids": [tokenizer(t)["input_ids"] for t in texts]})


def ptx_texts(n: int = 64, seed: int = 3):
    from datasets import Dataset

    from trl_ext.testing import tiny_corpus

    return Dataset.from_dict({"text": tiny_corpus(n, seed=seed)})


_OUTPUT_DIR = tempfile.TemporaryDirectory(prefix="ppo-bench-")  # one per process, removed at exit; nothing is saved


def config_kwargs(*, batch: int, response_length: int, updates: int, micro_batch: int = 2, mini_batches: int = 1,
                  ppo_epochs: int = 4, **overrides) -> dict:
    """PPO settings: `batch` episodes per update (TRL: `per_device_train_batch_size * gradient_accumulation_steps`),
    split into `mini_batches` optimizer steps, each over micro-batches of `micro_batch` sequences; TRL's defaults
    otherwise (4 PPO epochs, fixed kl_coef 0.05, value clip "max"), and no gradient clipping (TRL's PPO clips
    nothing). One mini-batch by default: with several and gradient accumulation TRL 1.12 merges mini-batches into
    fewer optimizer steps than ours (docs/ppo.md, "Optimizer steps"), so its numbers would differ from ours.
    No sample generations, no saving, no tracker."""
    if batch % (micro_batch * mini_batches):
        raise ValueError(f"batch {batch} must be a multiple of micro_batch * mini_batches")
    kwargs = dict(
        output_dir=_OUTPUT_DIR.name,
        use_cpu=True, bf16=False, report_to="none", disable_tqdm=True,
        per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=batch // micro_batch,
        num_mini_batches=mini_batches,
        num_ppo_epochs=ppo_epochs,
        total_episodes=batch * updates,
        response_length=response_length,
        local_rollout_forward_batch_size=batch,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        num_sample_generations=0,
        stop_token="eos",
        missing_eos_penalty=1.0,
        max_grad_norm=0.0,
        seed=11,
    )
    kwargs.update(overrides)
    return kwargs


class UpdateTimer(transformers.TrainerCallback):
    """Wall time of every PPO update: from `on_train_begin` / the previous `on_step_end` to this `on_step_end`."""

    def __init__(self):
        self.seconds: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self._last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.seconds.append(now - self._last)
        self._last = now


def seed_all(seed: int = 0) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def baseline() -> str:
    """What the `"trl"` runs are: TRL's own PPOTrainer where the installed TRL ships it (1.10-1.12); from TRL 1.13
    on, which has none, trl_ext.PPOTrainer with every extension at its default (on trl-ext's own PPO base)."""
    import trl

    from trl_ext.ppo.base import TRL_HAS_PPO

    if TRL_HAS_PPO:
        return f"TRL {trl.__version__}'s own trl.experimental.ppo.PPOTrainer"
    return (f"trl_ext.PPOTrainer at its defaults (TRL {trl.__version__} has no PPOTrainer; trl-ext runs on its own "
            "PPO base), so (a) against it measures run-to-run noise only")


def make_trainer(kind: str, models: Models, data, *, ptx_data=None, callbacks=(), trainer_cls=None, **config):
    """The baseline (`kind="trl"`, see :func:`baseline`) or a trl_ext (`"ext"`) PPOTrainer on fresh copies of
    `models`, seeded alike."""
    from trl_ext.ppo.base import TRL_HAS_PPO

    if kind == "trl" and TRL_HAS_PPO:
        from trl.experimental.ppo import PPOConfig, PPOTrainer
    else:
        from trl_ext import PPOConfig, PPOTrainer
    seed_all(0)
    policy, value, reward = models.fresh()
    extra = {"ptx_dataset": ptx_data} if ptx_data is not None else {}
    return (trainer_cls or PPOTrainer)(
        args=PPOConfig(**config), processing_class=models.tokenizer, model=policy, ref_model=None,
        reward_model=reward, value_model=value, train_dataset=data, callbacks=list(callbacks), **extra,
    )


def update_logs(trainer) -> list[dict]:
    return [entry for entry in trainer.state.log_history if "objective/kl" in entry]
