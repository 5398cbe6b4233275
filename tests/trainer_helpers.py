"""Tiny data and settings of the SFT, reward and DPO trainer tests (tests/runtime/): ranked and paired rows of
random words, and CPU training arguments of `MAX_STEPS` steps."""

from __future__ import annotations

import random

from trl_ext.testing import tiny_corpus

WORDS = tiny_corpus(40, seed=21)
MAX_STEPS = 4


def ranked_rows(ks, seed=0):
    rng = random.Random(seed)
    return [{"prompt": rng.choice(WORDS)[:20], "responses": [" " + rng.choice(WORDS) for _ in range(k)]} for k in ks]


def pair_rows(n, seed=0):
    rng = random.Random(seed)
    return [{"prompt": rng.choice(WORDS)[:20], "chosen": " " + rng.choice(WORDS), "rejected": " " + rng.choice(WORDS)}
            for _ in range(n)]


def common(out, **kw):
    """Training arguments of a tiny CPU run (`kw` on top)."""
    base = dict(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
                max_steps=MAX_STEPS, per_device_train_batch_size=3, logging_steps=1, save_strategy="no",
                learning_rate=1e-2, lr_scheduler_type="linear", seed=0, max_length=64, disable_tqdm=True)
    base.update(kw)
    return base
