"""Step 1 of the verifiable task: the base model and the data (recipes/verifiable/README.md).

    python recipes/verifiable/make_data.py     # -> outputs/verifiable/base, outputs/verifiable/data/

* ``base/``: the word-level tokenizer and a randomly initialised tiny Llama (hidden 64, 2 layers), SFT's start;
* ``data/train.jsonl``: 4000 problems, columns ``prompt``, ``answer``, ``completion`` (SFT reads prompt/completion,
  RL reads prompt and passes ``answer`` to the reward function);
* ``data/heldout.jsonl``: 500 other problems, the same columns: exact-match accuracy is measured there.

Deterministic given ``--seed``; the two files share no prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import addition_task


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def make_data(out: str | Path, *, seed: int = 0, train: int = addition_task.TRAIN,
              heldout: int = addition_task.HELDOUT) -> Path:
    """Write ``base/`` and ``data/{train,heldout}.jsonl`` under ``out``; returns ``out``."""
    out = Path(out)
    addition_task.write_base_model(out / "base", seed=seed)
    train_rows, heldout_rows = addition_task.split(seed=seed, heldout=heldout, train=train)
    write_jsonl(out / "data" / "train.jsonl", train_rows)
    write_jsonl(out / "data" / "heldout.jsonl", heldout_rows)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/verifiable", help="output folder (default: outputs/verifiable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=addition_task.TRAIN)
    parser.add_argument("--heldout", type=int, default=addition_task.HELDOUT)
    args = parser.parse_args()
    path = make_data(args.out, seed=args.seed, train=args.train, heldout=args.heldout)
    print(f"wrote {path / 'base'} and {path / 'data'}")
