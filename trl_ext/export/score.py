"""``trl-ext score REWARD_DIR --data FILE``: a reward model's scores of a data file. How it works:
docs/internals-recipes.md#trl-ext-score."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import UserInputError

__all__ = ["load_reward_model", "score_token_ids", "padded_batch", "score_rows", "preference_metrics", "data_kind",
           "score_with_reward_funcs"]

RESPONSE_COLUMNS = ("response", "completion")


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
            input_ids, attention_mask = padded_batch(sequences[start:start + batch_size], pad_token_id, left=False)
            logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
            scores += logits[:, 0].float().cpu().tolist()
    return scores


def padded_batch(sequences: list[list[int]], pad_token_id: int, *, left: bool):
    """``(input_ids, attention_mask)`` of token id lists padded to the longest with ``pad_token_id``, on the left
    (``left``: prompts to generate from, ``trl-ext sample``) or on the right (sequences to score)."""
    import torch

    width = max(len(ids) for ids in sequences)
    input_ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, ids in enumerate(sequences):
        cols = slice(width - len(ids), width) if left else slice(0, len(ids))
        input_ids[i, cols] = torch.tensor(ids)
        attention_mask[i, cols] = 1
    return input_ids, attention_mask


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


def score_with_reward_funcs(funcs: list, rows: list[dict], *, tokenizer=None, entries=None, columns=None
                            ) -> dict[str, list[float]]:
    """Each reward function's reward of each prompt/response row (NaN where it said None), by the functions' metric
    names. The functions are called once, on all rows, with the PPO trainer's keywords
    (:mod:`trl_ext.rewards.contract`): ``prompts`` (the ``prompt`` column, or ``""``), ``completions`` (the
    ``response``/``completion`` column; a text response to a chat prompt becomes ``[{"role": "assistant",
    "content": text}]``), ``completion_ids`` (the response tokenized by ``tokenizer`` without special tokens; None
    without one), every other column, and ``trainer_state``/``log_extra``/``log_metric`` (None and no-ops).
    ``entries`` name the functions in signature errors; ``columns`` are the data's columns."""
    from ..rewards.contract import call_reward_funcs, reward_func_names
    from ..rewards.resolve import check_reward_func

    columns = list(columns if columns is not None else (rows[0].keys() if rows else []))
    passed = [c for c in columns if c not in RESPONSE_COLUMNS]
    names = reward_func_names(funcs)
    for func, entry in zip(funcs, entries or names):
        check_reward_func(func, entry, passed)
    prompts = [row.get("prompt", "") for row in rows]
    completions = []
    for row, prompt in zip(rows, prompts):
        response = row.get("response", row.get("completion"))
        if isinstance(prompt, list) and isinstance(response, str):
            response = [{"role": "assistant", "content": response}]
        completions.append(response)
    completion_ids = None
    if tokenizer is not None:
        texts = [c if isinstance(c, str) else "".join(m.get("content", "") for m in c) for c in completions]
        completion_ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    inputs = {"prompts": prompts, "completions": completions,
              "completion_ids": completion_ids if completion_ids is not None else [None] * len(rows)}
    inputs.update({c: [row.get(c) for row in rows] for c in passed if c != "prompt"})
    inputs.update(trainer_state=None, log_extra=lambda *args, **kwargs: None,
                  log_metric=lambda *args, **kwargs: None)
    results = call_reward_funcs({i: (name, func) for i, (name, func) in enumerate(zip(names, funcs))}, inputs)
    return {name: results[i] for i, name in enumerate(names)}


def _print_function_means(name: str, rewards: dict[str, list[float]]) -> None:
    import math

    for func_name, values in rewards.items():
        scored = [v for v in values if not math.isnan(v)]
        mean = f"mean {sum(scored) / len(scored):.4f}" if scored else "no row scored"
        print(f"{name}: {func_name}: {mean} over {len(scored)} rows ({len(values) - len(scored)} None)")


def main(args) -> int:
    """``trl-ext score`` (parsed arguments from :mod:`trl_ext.cli`)."""
    from ..recipe_loader.data import open_split

    specs = getattr(args, "reward_funcs", None)
    if not args.reward and not specs:
        raise UserInputError("score: give a reward model (REWARD_DIR), --reward-funcs, or both")
    _check_out(args.out)
    funcs = []
    if specs:
        from ..rewards.resolve import parse_reward_spec, resolve_reward_funcs
        from ..user_code.entries import entry_from_text

        parsed = [parse_reward_spec(entry_from_text(s, f"--reward-funcs {s}"), i, key="--reward-funcs")
                  for i, s in enumerate(specs)]
        funcs = resolve_reward_funcs(parsed, ".", key="--reward-funcs")  # before any data or model loads
    dataset = open_split(args.data, args.split, key="--data", split_key="--split")
    kind = data_kind(list(dataset.column_names), args.data)
    if funcs and kind != "rows":
        raise UserInputError(f"--reward-funcs scores prompt/response rows; --data {args.data} holds {kind} "
                             f"(columns: {', '.join(dataset.column_names)})")
    rows = [dict(row) for row in dataset]
    if not rows:
        raise UserInputError(f"--data {args.data}: no rows")
    model = tokenizer = None
    if args.reward:
        model, tokenizer = load_reward_model(args.reward, dtype=args.dtype)
    elif getattr(args, "tokenizer", None):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    func_rewards = {}
    if funcs:
        func_rewards = score_with_reward_funcs(funcs, rows, tokenizer=tokenizer, entries=[p.where for p in parsed],
                                               columns=list(dataset.column_names))
        _print_function_means(args.data, func_rewards)
    row_scores = None
    if model is not None:
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
        import math

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "x") as f:
            for i, row in enumerate(rows):
                extra = {}
                if row_scores is not None:
                    scores = row_scores[i]
                    extra = {"score": scores[0]} if kind == "rows" else {"scores": scores}
                if func_rewards:
                    extra["rewards"] = {name: None if math.isnan(v[i]) else v[i] for name, v in func_rewards.items()}
                f.write(json.dumps({**row, **extra}) + "\n")
        print(f"wrote {args.out}")
    return 0
