"""Step 1 of the gold pipeline: write the base model and the data that does not depend on a trained model.

    python recipes/gold/make_data.py            # -> outputs/gold/base, outputs/gold/data/{sft,prompts.jsonl,ptx.jsonl}

* ``base/``: the word-level tokenizer and a randomly initialised tiny Llama (hidden 64, 2 layers, ~80k parameters),
  the model SFT starts from;
* ``data/sft/{train,test}.jsonl``: the SFT corpus in TRL's prompt-completion format (``test`` is the held-out text
  on which the alignment tax is measured);
* ``data/prompts.jsonl``: the 96 prompts of the language (PPO's prompts);
* ``data/ptx.jsonl``: the SFT training text, eos included, as one ``text`` column (PPO-ptx's pretraining mix).

Deterministic given ``--seed``. The preference pairs come from the SFT model: ``make_pairs.py``, after SFT.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gold_task


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def make_data(out: str | Path, *, sft_examples: int = 4000, test_examples: int = 500, seed: int = 0) -> Path:
    """Write ``base/`` and ``data/`` under ``out`` (see the module docstring); returns ``out``."""
    out = Path(out)
    gold_task.write_base_model(out / "base", seed=seed)
    data = out / "data"
    train = gold_task.sft_examples(sft_examples, seed=seed)
    write_jsonl(data / "sft" / "train.jsonl", train)
    write_jsonl(data / "sft" / "test.jsonl", gold_task.sft_examples(test_examples, seed=seed + 10_000))
    write_jsonl(data / "prompts.jsonl", [{"prompt": p} for p in gold_task.all_prompts()])
    # ptx text as SFT saw it, ending with the end-of-sequence token: without it, every next-token target of the
    # ptx loss is a word, and PPO-ptx teaches the policy never to stop.
    eos = gold_task.build_tokenizer().eos_token
    write_jsonl(data / "ptx.jsonl", [{"text": r["prompt"] + r["completion"] + eos} for r in train])
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/gold", help="output folder (default: outputs/gold)")
    parser.add_argument("--sft-examples", type=int, default=4000)
    parser.add_argument("--test-examples", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = make_data(args.out, sft_examples=args.sft_examples, test_examples=args.test_examples, seed=args.seed)
    print(f"wrote {path / 'base'} and {path / 'data'}")
