"""``trl-ext score REWARD_DIR --data FILE``: a reward model's scores of a data file.

Rows are tokenized exactly as :class:`trl_ext.RewardTrainer` tokenizes a completion for training
(:func:`trl_ext.preference.ranked_data.tokenize_completion`: ``prompt + response`` plus EOS for plain text, the chat
template for messages) and scored in right-padded batches, as the trainer scores them (the score head's output at
each sequence's last non-pad token). Three kinds of data, told apart by their columns:

* ``response`` (or ``completion``), with an optional ``prompt``: each row's reward (``score``); prints their mean.
* ``chosen`` and ``rejected`` (optional ``prompt``): a preference pair per row (``scores`` = [chosen, rejected]).
* ``responses``, a list ranked best first (optional ``prompt``): every pair of the list, as in ranked reward
  training.

For preference data it prints the pairwise accuracy (``score(better) > score(worse)``; a tie counts as wrong, as
TRL's ``accuracy`` metric) and the mean margin ``score(better) - score(worse)``, both over all pairs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UserInputError

__all__ = ["load_reward_model", "score_token_ids", "score_rows", "preference_metrics", "data_kind"]


def load_reward_model(path: str, *, dtype: str | None = None):
    """``(model, tokenizer)`` of a reward run, checkpoint, export or model directory (one-output head, merged)."""
    from .run_dir import load_merged, load_run_tokenizer, open_run

    run = open_run(path, models_too=True)
    source = run.source("reward")
    tokenizer = load_run_tokenizer(run, source)
    model = load_merged(source, dtype=dtype or run.dtype, tokenizer=tokenizer)
    return model, tokenizer


def score_token_ids(model, sequences: list[list[int]], pad_token_id: int, *, batch_size: int = 16) -> list[float]:
    """The model's score of each token sequence, in right-padded batches of ``batch_size`` (float32 values)."""
    import torch

    scores: list[float] = []
    device = next(model.parameters()).device
    with torch.no_grad():
        for start in range(0, len(sequences), batch_size):
            chunk = sequences[start:start + batch_size]
            width = max(len(ids) for ids in chunk)
            input_ids = torch.full((len(chunk), width), pad_token_id, dtype=torch.long)
            attention_mask = torch.zeros((len(chunk), width), dtype=torch.long)
            for i, ids in enumerate(chunk):
                input_ids[i, :len(ids)] = torch.tensor(ids)
                attention_mask[i, :len(ids)] = 1
            logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
            scores += logits[:, 0].float().cpu().tolist()
    return scores


def data_kind(columns: list[str], name: str) -> str:
    """``"rows"`` (prompt/response), ``"pairs"`` (chosen/rejected) or ``"ranked"`` (responses)."""
    if "responses" in columns:
        return "ranked"
    if "chosen" in columns and "rejected" in columns:
        return "pairs"
    if "response" in columns or "completion" in columns:
        return "rows"
    raise UserInputError(
        f"--data {name}: columns {sorted(columns)}: need `response` (or `completion`) with an optional `prompt`, "
        "`chosen` and `rejected`, or `responses` (ranked, best first)"
    )


def _responses(row: dict, kind: str, index: int, name: str) -> list:
    if kind == "rows":
        response = row.get("response", row.get("completion"))
        responses = [response]
    elif kind == "pairs":
        responses = [row["chosen"], row["rejected"]]
    else:
        responses = row["responses"]
        if not isinstance(responses, list) or len(responses) < 2:
            raise UserInputError(f"--data {name} row {index}: `responses` must list at least 2 responses, best first")
    if any(r is None or r == "" or r == [] for r in responses):
        raise UserInputError(f"--data {name} row {index}: an empty response")
    return responses


def score_rows(model, tokenizer, rows: list[dict], *, kind: str, name: str = "data", batch_size: int = 16
               ) -> list[list[float]]:
    """Each row's scores: one per response (``[score]`` for a prompt/response row, ``[chosen, rejected]``, or the
    ranked list's, best first)."""
    from ..preference.ranked_data import _is_messages, tokenize_completion

    flat, counts = [], []
    for index, row in enumerate(rows):
        responses = _responses(row, kind, index, name)
        conversational = _is_messages(row.get("prompt")) or _is_messages(responses[0])
        for response in responses:
            flat.append(tokenize_completion(row, response, tokenizer, conversational))
        counts.append(len(responses))
    scores = score_token_ids(model, flat, tokenizer.pad_token_id, batch_size=batch_size)
    out, position = [], 0
    for count in counts:
        out.append(scores[position:position + count])
        position += count
    return out


def preference_metrics(row_scores: list[list[float]]) -> dict:
    """Pairwise accuracy and mean margin over every (better, worse) pair of every row (lists ranked best first)."""
    wins, margins = [], []
    for scores in row_scores:
        for i in range(len(scores)):
            for j in range(i + 1, len(scores)):
                margins.append(scores[i] - scores[j])
                wins.append(scores[i] > scores[j])
    if not margins:
        raise UserInputError("--data: no preference pairs to score")
    return {"accuracy": sum(wins) / len(wins), "margin": sum(margins) / len(margins), "pairs": len(margins)}


def _check_out(out: str | None) -> None:
    if out and os.path.exists(out):
        raise UserInputError(f"--out {out}: exists; give a new file (nothing is overwritten)")


def main(args) -> int:
    """``trl-ext score`` (parsed arguments from :mod:`trl_ext.recipes.cli`)."""
    from ..recipes.data import open_split

    _check_out(args.out)
    dataset = open_split(args.data, args.split, key="--data", split_key="--split")
    kind = data_kind(list(dataset.column_names), args.data)
    rows = [dict(row) for row in dataset]
    if not rows:
        raise UserInputError(f"--data {args.data}: no rows")
    model, tokenizer = load_reward_model(args.reward, dtype=args.dtype)
    row_scores = score_rows(model, tokenizer, rows, kind=kind, name=args.data, batch_size=args.batch_size)
    if kind == "rows":
        flat = [s[0] for s in row_scores]
        print(f"{args.data}: {len(flat)} rows, mean score {sum(flat) / len(flat):.4f}, "
              f"min {min(flat):.4f}, max {max(flat):.4f}")
    else:
        metrics = preference_metrics(row_scores)
        print(f"{args.data}: {len(rows)} rows, {metrics['pairs']} pairs, accuracy {metrics['accuracy']:.4f}, "
              f"mean margin {metrics['margin']:.4f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "x") as f:
            for row, scores in zip(rows, row_scores):
                extra = {"score": scores[0]} if kind == "rows" else {"scores": scores}
                f.write(json.dumps({**row, **extra}) + "\n")
        print(f"wrote {args.out}")
    return 0
