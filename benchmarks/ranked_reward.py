"""Ranked reward data vs the same data expanded to all pairs.

For K = 2, 4, 8 responses per prompt: one epoch of trl_ext.RewardTrainer on the ranked data (each response
scored once: K sequences per prompt) against one epoch of trl.RewardTrainer on every ordered pair of the same
data (2 * C(K, 2) sequences per prompt). Both see the same number of sequences per forward pass
(`--examples-per-batch` * K). The limit of the speed-up is 2 * C(K, 2) / K = K - 1. Runs alternate (ranked, pairs,
pairs, ranked, ...) and the reported ratio is the median of the per-repeat ratios.

    python benchmarks/ranked_reward.py                 # defaults below, about 1 minute on 2 CPU cores
    python benchmarks/ranked_reward.py --ks 2 4 --repeats 3

Prints a table and writes benchmarks/results/ranked_reward.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--examples-per-batch", type=int, default=2, help="ranked examples per batch (pairs: * K / 2)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--words", type=int, default=24, help="words per response (sets the sequence length)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "ranked_reward.json"))
    a = p.parse_args(argv)

    import torch
    import transformers
    import trl
    from datasets import Dataset

    from trl_ext import RewardConfig, RewardTrainer
    from trl_ext.testing import _WORDS, build_scalar_model, build_tokenizer

    torch.set_num_threads(a.threads)
    transformers.logging.set_verbosity_error()
    tokenizer = build_tokenizer()
    rng = random.Random(0)

    def sentence():
        return " " + " ".join(rng.choice(_WORDS) for _ in range(a.words))

    def model():
        return build_scalar_model(tokenizer, seed=1, hidden_size=a.hidden, num_layers=a.layers)

    tmp = tempfile.mkdtemp()

    def args(batch):
        return RewardConfig(
            output_dir=tmp, use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
            num_train_epochs=1, per_device_train_batch_size=batch, logging_steps=10**6, save_strategy="no",
            seed=0, max_length=None, disable_tqdm=True,
        )

    class EpochTimer(transformers.TrainerCallback):
        """Wall time of the epoch itself (first batch to last step), without the trainer's setup."""

        def on_epoch_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_epoch_end(self, args, state, control, **kwargs):
            self.seconds = time.perf_counter() - self.start

    def epoch_seconds(cls, data, batch):
        timer = EpochTimer()
        trainer = cls(model=model(), args=args(batch), train_dataset=data, processing_class=tokenizer,
                      callbacks=[timer])
        trainer.train()
        return timer.seconds

    # Warm-up (first-call costs of torch and the Trainer), untimed.
    warm = [{"prompt": sentence(), "responses": [sentence(), sentence()]} for _ in range(4)]
    epoch_seconds(RewardTrainer, Dataset.from_list(warm), 2)
    warm_pairs = [{"prompt": r["prompt"], "chosen": r["responses"][0], "rejected": r["responses"][1]} for r in warm]
    epoch_seconds(trl.RewardTrainer, Dataset.from_list(warm_pairs), 2)

    results = []
    for k in a.ks:
        ranked_rows = [{"prompt": sentence(), "responses": [sentence() for _ in range(k)]} for _ in range(a.prompts)]
        pair_rows = [
            {"prompt": r["prompt"], "chosen": r["responses"][i], "rejected": r["responses"][j]}
            for r in ranked_rows
            for i, j in combinations(range(k), 2)
        ]
        ranked, pairs = Dataset.from_list(ranked_rows), Dataset.from_list(pair_rows)
        pair_batch = max(1, a.examples_per_batch * k // 2)  # same number of sequences per forward pass
        t_ranked, t_pairs = [], []
        for rep in range(a.repeats):
            order = [("ranked", RewardTrainer, ranked, a.examples_per_batch), ("pairs", trl.RewardTrainer, pairs, pair_batch)]
            for name, cls, data, batch in order if rep % 2 == 0 else order[::-1]:
                (t_ranked if name == "ranked" else t_pairs).append(epoch_seconds(cls, data, batch))
        ratios = [tp / tr for tp, tr in zip(t_pairs, t_ranked)]
        results.append({
            "K": k, "prompts": a.prompts, "ranked_sequences": k * a.prompts, "pair_sequences": 2 * len(pair_rows),
            "ranked_epoch_s": statistics.median(t_ranked), "pairs_epoch_s": statistics.median(t_pairs),
            "ratio_median": statistics.median(ratios), "ratios": ratios, "limit": k - 1,
            "fraction_of_limit": statistics.median(ratios) / (k - 1) if k > 1 else None,
        })

    print(f"{'K':>3} {'ranked s/epoch':>15} {'TRL pairs s/epoch':>18} {'speed-up':>9} {'limit K-1':>10} {'% of limit':>11}")
    for r in results:
        print(f"{r['K']:>3} {r['ranked_epoch_s']:>15.2f} {r['pairs_epoch_s']:>18.2f} {r['ratio_median']:>9.2f} "
              f"{r['limit']:>10} {100 * r['ratio_median'] / r['limit']:>10.0f}%")
    # Same JSON convention as the other benchmarks: {"meta": machine, load, versions, commit, settings; "results"}.
    from _common import write_result

    write_result("ranked_reward", vars(a), results, out=a.out)

if __name__ == "__main__":
    main()
