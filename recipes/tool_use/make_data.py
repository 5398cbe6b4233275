"""Step 1 of the tool-use task: the base model and the data (recipes/tool_use/README.md).

    python recipes/tool_use/make_data.py     # -> outputs/tool_use/base, outputs/tool_use/data/

* ``base/``: the tokenizer (TRL's Qwen2.5 chat template, digits one per token) and a randomly initialised tiny
  Llama (hidden 64, 2 layers, 384 positions), SFT's start;
* ``data/train.jsonl``: 2000 problems, columns ``prompt`` (chat messages) and ``answer``: RL's prompts;
* ``data/heldout.jsonl``: 200 other problems, the same columns: exact match is measured there;
* ``data/sft_tools.jsonl``: the training problems as SFT transcripts with the tool, in TRL's conversational
  prompt-completion format: ``prompt`` (the user message), ``completion`` (assistant tool call, tool result,
  assistant answer) and ``tools`` (the ``add`` schema as JSON, which TRL's SFTTrainer hands the chat template, so
  the prompt renders exactly as RL renders it with ``tools=[add]``);
* ``data/sft_no_tools.jsonl``: the same problems answered at once (``prompt``, ``completion``; no tools);
* ``guess_base/``, ``data/guess_sft.jsonl``, ``data/guess_train.jsonl``: the guessing game (guess_env.py): its
  tokenizer and random tiny Llama (512 positions: a game is longer), 1000 SFT games (``prompt``, ``completion``,
  ``tools``) and 1000 RL rows (``prompt``, ``secret``, which ``GuessEnv.reset`` reads).

Deterministic given ``--seed``; held-out and training problems are disjoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guess_env
import tool_task

GUESS_SFT, GUESS_RL = 1000, 1000


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def sft_rows(pairs, *, with_tools: bool) -> list[dict]:
    """SFT transcripts (conversational prompt-completion) of ``pairs``, with or without the tool."""
    if not with_tools:
        return [{"prompt": tool_task.prompt_messages(a, b), "completion": tool_task.direct_transcript(a, b)}
                for a, b in pairs]
    schema = tool_task.tools_json()
    return [{"prompt": tool_task.prompt_messages(a, b), "completion": tool_task.tool_transcript(a, b),
             "tools": schema} for a, b in pairs]


def make_data(out: str | Path, *, seed: int = 0, train: int = tool_task.TRAIN,
              heldout: int = tool_task.HELDOUT) -> Path:
    """Write ``base/`` and ``data/*.jsonl`` under ``out``; returns ``out``."""
    out = Path(out)
    tool_task.write_base_model(out / "base", seed=seed)
    train_pairs, heldout_pairs = tool_task.split(seed=seed, train=train, heldout=heldout)
    write_jsonl(out / "data" / "train.jsonl", [tool_task.row(a, b) for a, b in train_pairs])
    write_jsonl(out / "data" / "heldout.jsonl", [tool_task.row(a, b) for a, b in heldout_pairs])
    write_jsonl(out / "data" / "sft_tools.jsonl", sft_rows(train_pairs, with_tools=True))
    write_jsonl(out / "data" / "sft_no_tools.jsonl", sft_rows(train_pairs, with_tools=False))
    guess_env.write_base_model(out / "guess_base", seed=seed)
    write_jsonl(out / "data" / "guess_sft.jsonl", guess_env.sft_rows(min(train, GUESS_SFT), seed=seed))
    write_jsonl(out / "data" / "guess_train.jsonl", guess_env.rl_rows(min(train, GUESS_RL), seed=seed + 1))
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/tool_use", help="output folder (default: outputs/tool_use)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=tool_task.TRAIN)
    parser.add_argument("--heldout", type=int, default=tool_task.HELDOUT)
    args = parser.parse_args()
    path = make_data(args.out, seed=args.seed, train=args.train, heldout=args.heldout)
    print(f"wrote {path / 'base'} and {path / 'data'}")
