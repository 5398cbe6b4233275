"""GSM8K (``openai/gsm8k``, config ``main``) as prompt/solution data for ``grpo_gsm8k.yaml``.

Each row becomes ``prompt`` (chat messages: a system message asking for reasoning and the final answer in
``\\boxed{}``, then the question) and ``solution`` (the number after GSM8K's ``####``, thousands separators
removed), the columns ``trl.rewards.accuracy_reward`` reads. Writes ``train.jsonl`` (7473 rows) and ``test.jsonl``
(1319 rows) into the output folder (default ``outputs/qwen2.5-0.5b/gsm8k``, which the recipe names)::

    python recipes/qwen2.5-0.5b/make_gsm8k.py [OUT_DIR]

Needs the Hugging Face Hub once (the download); the recipe then reads the local files.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SYSTEM = ("You are a careful math tutor. Reason step by step, then give the final answer as a number in "
          "\\boxed{}, for example \\boxed{42}.")


def gsm8k_solution(answer: str) -> str:
    """The final number of a GSM8K answer (the text after ``####``), without thousands separators."""
    match = re.search(r"####\s*(.+?)\s*$", answer.strip())
    if not match:
        raise ValueError(f"not a GSM8K answer (no '####'): {answer[-80:]!r}")
    return match.group(1).replace(",", "").replace("$", "").strip()


def to_row(example: dict) -> dict:
    """One GSM8K example (``question``, ``answer``) as a recipe row (``prompt`` messages, ``solution``)."""
    return {
        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": example["question"].strip()}],
        "solution": gsm8k_solution(example["answer"]),
    }


def main(out_dir: str = "outputs/qwen2.5-0.5b/gsm8k") -> None:
    import datasets

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = datasets.load_dataset("openai/gsm8k", "main")
    for split in ("train", "test"):
        with open(out / f"{split}.jsonl", "w") as f:
            for example in data[split]:
                f.write(json.dumps(to_row(example)) + "\n")
        print(f"wrote {out / f'{split}.jsonl'} ({len(data[split])} rows)")


if __name__ == "__main__":
    main(*sys.argv[1:2])
