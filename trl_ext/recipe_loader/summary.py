"""The summary ``trl-ext train`` prints when a run ends: where the model, the resolved recipe and the metrics went, the
run's headline figures (the main metric of its kind, first and last logged value) and the commands to run next
(``export``, ``sample`` or ``score``, ``plot``) with this run's paths filled in.

:func:`run_summary` builds the text from the resolved recipe and the trainer's log history; it writes nothing.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from .loader import RECIPE_FILENAME

#: The metrics whose first and last values head the summary, per kind of run, the first one logged (docs/metrics.md).
MAIN_METRIC = {
    # with per-turn rewards what an episode earned (the final score and its turns' rewards); else the reward of the
    # policy's responses (the weighted sum with reward_funcs)
    "ppo": ("episodes/reward_mean", "objective/scores"),
    "reward": ("accuracy",),  # chosen scored above rejected, fraction of pairs in the batch
    "dpo": ("rewards/margins",),  # implicit reward of chosen minus rejected
    "sft": ("loss",),  # token cross-entropy
}


#: Printed before a PPO run's first update: how to read the metric lines that follow (TRL's names, kept).
PPO_LEGEND = ("trl-ext: one line of metrics per update; objective/scores: the reward of the policy's responses "
              "(higher is better), objective/kl: KL from the reference (nats per response), eps: episodes (responses) "
              "per second; every metric: docs/metrics.md")


def headline(log_history: list[dict], kind: str) -> tuple[str, float, float, int] | None:
    """``(metric, first, last, number of logged values)`` of the kind's main metric (the first of
    :data:`MAIN_METRIC`'s that the run logged; ``loss`` when it logged none), or None when it logged none of them."""
    for key in dict.fromkeys((*MAIN_METRIC.get(kind, ()), "loss")):
        values = [entry[key] for entry in log_history if isinstance(entry.get(key), (int, float))]
        if values:
            return key, float(values[0]), float(values[-1]), len(values)
    return None


def _local_prompts(recipe) -> str | None:
    """The recipe's dataset when it is a local file or folder (something `trl-ext sample --prompts` can read)."""
    name = recipe.script_args.dataset_name or ""
    return name if name and Path(name).exists() else None


def _has_prompt_column(data: str) -> bool:
    """Whether the first row of a local ``.jsonl`` file (or a folder's ``train.jsonl``) has a ``prompt`` column; other
    formats are not opened here (False: the summary shows a placeholder instead)."""
    import json

    path = Path(data)
    path = path / "train.jsonl" if path.is_dir() else path
    try:
        with open(path, encoding="utf-8") as f:
            return "prompt" in json.loads(f.readline())
    except (OSError, ValueError, TypeError):
        return False


def next_commands(recipe) -> list[str]:
    """Shell commands to run next, with this run's paths (quoted where needed)."""
    out = recipe.training_args.output_dir
    q = shlex.quote
    commands = [f"trl-ext export {q(out)} {q(str(out).rstrip('/') + '-export')}"]
    data = _local_prompts(recipe)
    if recipe.trainer == "reward":
        if data:
            commands.append(f"trl-ext score {q(out)} --data {q(data)}")
    else:  # a policy: PPO and DPO data have a `prompt` column; SFT data may not (text, messages)
        prompts = q(data) if data and (recipe.trainer in ("ppo", "dpo") or _has_prompt_column(data)) \
            else "PROMPTS.jsonl"
        reward = getattr(recipe.training_args, "reward_model_path", None) if recipe.trainer == "ppo" else None
        score = f" --reward {q(reward)}" if reward and Path(reward).exists() else ""
        commands.append(f"trl-ext sample {q(out)} --prompts {prompts} --limit 4{score} "
                        f"--out {q(str(Path(out) / 'samples.jsonl'))} --overwrite")
    commands.append(f"trl-ext plot {q(out)}")
    return commands


def run_summary(recipe, log_history: list[dict], seconds: float) -> str:
    """The lines ``trl-ext train`` prints at the end of a run (see the module docstring)."""
    out = Path(recipe.training_args.output_dir)
    args = recipe.model_args
    what = {"ppo": "policy", "reward": "reward model"}.get(recipe.trainer, "model")
    what += " (LoRA adapter)" if getattr(args, "use_peft", False) else ""
    rows = [(what, f"{out}/"), ("resolved recipe", out / RECIPE_FILENAME),
            ("metrics (all logged)", out / "trainer_state.json")]
    if recipe.trainer == "ppo" and (out / "completions.jsonl").is_file():
        rows.append(("completions", out / "completions.jsonl"))
    width = max(len(label) for label, _ in rows) + 1
    lines = [f"trl-ext: {recipe.trainer} run done in {seconds:.0f} s"]
    lines.extend(f"  {label + ':':<{width}} {path}" for label, path in rows)
    head = headline(log_history, recipe.trainer)
    if head is not None:
        key, first, last, n = head
        lines.append(f"  {key}: {first:.4g} (first of {n} logged) -> {last:.4g} (last)   [docs/metrics.md]")
    lines.append("next:")
    lines.extend(f"  {command}" for command in next_commands(recipe))
    return "\n".join(lines)
