"""Step 3 of the gold pipeline: preference pairs sampled from the SFT model, labelled by the gold reward.

    python recipes/gold/make_pairs.py     # reads outputs/gold/sft, writes outputs/gold/data/pairs/{train,test}.jsonl

For each pair, a prompt is drawn at random and the SFT model samples two responses (temperature 1); the one with the
higher gold reward is ``chosen`` (pairs of equal gold reward are skipped). In ``train.jsonl`` each label is then
flipped with probability ``--noise`` (default 0.2: one label in five is wrong, as with hurried human labellers);
``test.jsonl`` holds clean held-out pairs, on which the reward model's gold accuracy is measured. Each row keeps
``gold_chosen``, ``gold_rejected`` and ``flipped`` for analysis (the trainers ignore these columns).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gold_eval


def make_pairs(sft_dir: str | Path, out: str | Path, *, n_train: int = 1000, n_test: int = 500, noise: float = 0.2,
               seed: int = 0) -> dict:
    """Write ``train.jsonl`` (noisy labels) and ``test.jsonl`` (clean) under ``out``; returns their counts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(sft_dir))
    sft = AutoModelForCausalLM.from_pretrained(str(sft_dir))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stats = {}
    for split, n, split_noise, split_seed in (("train", n_train, noise, seed), ("test", n_test, 0.0, seed + 1)):
        rows, stats[split] = gold_eval.sample_pairs(sft, tokenizer, n, noise=split_noise, seed=split_seed)
        with open(out / f"{split}.jsonl", "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return stats


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sft", default="outputs/gold/sft", help="the SFT model (default: outputs/gold/sft)")
    parser.add_argument("--out", default="outputs/gold/data/pairs", help="default: outputs/gold/data/pairs")
    parser.add_argument("--train-pairs", type=int, default=1000)
    parser.add_argument("--test-pairs", type=int, default=500)
    parser.add_argument("--noise", type=float, default=0.2, help="probability that a training label is flipped")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    stats = make_pairs(args.sft, args.out, n_train=args.train_pairs, n_test=args.test_pairs, noise=args.noise,
                       seed=args.seed)
    print(json.dumps(stats))
