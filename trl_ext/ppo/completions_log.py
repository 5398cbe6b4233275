"""``log_completions: true``: each update's prompts, completions, rewards and advantages in ``completions.jsonl``,
a wandb table and the console (TRL GRPO's ``log_completions``); the columns: docs/reward-functions.md, "The
completions log". A missing reward is NaN; ``score`` is taken before ``missing_eos_penalty`` and ``reward_clip``;
with ``tools`` an ``episode`` column holds the episode's text, tool results between ``[observation]`` and
``[/observation]``."""

from __future__ import annotations

import json
import math
import os

import torch
from accelerate.utils import gather_object

from .objective.masked_stats import masked_mean

__all__ = ["COMPLETIONS_FILE", "CompletionsLog"]

COMPLETIONS_FILE = "completions.jsonl"


def _plain(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN
    return value


class CompletionsLog:
    """The completions log of one trainer (see the module docstring), built once from its config when
    ``log_completions`` is on; the trainer's step ``log_update`` calls :meth:`log` after each update's metrics.

    Args:
        tokenizer: decodes prompts and completions of a run without ``reward_funcs``.
        accelerator: rows are gathered from every process; the main process writes them.
        output_dir, report_to, num_to_print, missing_eos_penalty: the config's ``output_dir``, ``report_to``,
            ``num_completions_to_print`` and ``missing_eos_penalty``.
    """

    def __init__(self, tokenizer, accelerator, *, output_dir: str, report_to=None, num_to_print: int | None = None,
                 missing_eos_penalty: float | None = None):
        self.tokenizer, self.accelerator = tokenizer, accelerator
        self.output_dir, self.path = output_dir, os.path.join(output_dir, COMPLETIONS_FILE)
        self.wandb = "wandb" in (report_to or [])
        self.num_to_print, self.missing_eos_penalty = num_to_print, missing_eos_penalty

    @classmethod
    def from_args(cls, args, tokenizer, accelerator) -> "CompletionsLog":
        return cls(tokenizer, accelerator, output_dir=args.output_dir, report_to=args.report_to,
                   num_to_print=args.num_completions_to_print, missing_eos_penalty=args.missing_eos_penalty)

    def rows(self, rollout, step: int) -> list[dict]:
        """This process's rows of update ``step``."""
        mask = ~rollout.padding_mask
        advantages = masked_mean(rollout.advantages, mask, axis=1).tolist()
        scores = rollout.reward_scores
        if scores is not None:
            prompts, completions = scores.prompts, scores.completions
            rewards = {name: scores.per_reward[:, i].tolist() for i, name in enumerate(scores.names)}
            score = scores.score.tolist()
            extras = scores.extra_columns
        else:
            prompts = self.tokenizer.batch_decode(rollout.queries, skip_special_tokens=True)
            completions = self.tokenizer.batch_decode(rollout.postprocessed_responses, skip_special_tokens=True)
            rewards, score, extras = {}, rollout.scores.tolist(), {}
            penalty = self.missing_eos_penalty
            if penalty is not None:  # undo the penalty: the reward model's own score
                score = [s + penalty * (not eos) for s, eos in zip(score, rollout.contain_eos_token.tolist())]
        episodes = rollout.episodes.marked_texts(self.tokenizer) if rollout.episodes is not None else None
        rows = []
        for j in range(len(completions)):
            row = {"step": step, "prompt": prompts[j], "completion": completions[j]}
            if episodes is not None:  # tools: the whole episode, observation spans marked
                row["episode"] = episodes[j]
            row.update({name: values[j] for name, values in rewards.items()})
            row["score"] = score[j]
            row["advantage"] = advantages[j]
            row.update({column: values[j] for column, values in extras.items() if j < len(values)})
            rows.append({key: _plain(value) for key, value in row.items()})
        return rows

    def log(self, rollout, step: int) -> None:
        """Gather every process's rows and, on the main process, write, log and print them."""
        with torch.no_grad():
            rows = gather_object(self.rows(rollout, step))
        if not self.accelerator.is_main_process:
            return
        os.makedirs(self.output_dir, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
        if self.wandb:
            import wandb

            if wandb.run is not None:
                columns = list(rows[0]) if rows else []
                table = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
                wandb.log({"completions": table})  # no step=: HF's callback owns wandb's step (as TRL's GRPO)
        shown = rows if self.num_to_print is None else rows[: self.num_to_print]
        for row in shown:
            rewards = ", ".join(f"{key}={value:.3g}" if isinstance(value, float) else f"{key}={value}"
                                for key, value in row.items() if key not in ("step", "prompt", "completion"))
            print(f"[step {row['step']}] {row['prompt']!r} -> {row['completion']!r} | {rewards}", flush=True)
