"""``trl-ext plot``: the main curves of finished or running runs, from their ``trainer_state.json``, as PNG files.

For people without wandb. A run is an output directory: its ``trainer_state.json`` (written at the end of
``trl-ext train``) or, while it is running, the one in its latest complete ``checkpoint-N``. Its kind (sft, reward,
dpo, ppo) comes from the ``trl_ext_recipe.yaml`` next to it, or from the metrics it logged. Each kind gets one figure,
``<kind>.png``, with one panel per metric of :data:`PANELS` and every run of that kind overlaid (evaluation metrics,
``eval_<name>``, dashed in the run's colour).

:func:`load_run` and :func:`series` read the data (no matplotlib needed); :func:`plot_runs` draws. matplotlib is an
optional extra: ``pip install "trl-ext[plot]"``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserInputError
from ..runtime.checkpoints import COMPLETE_MARKER, latest_checkpoint
from .loader import RECIPE_FILENAME

#: Metrics drawn for each kind of run, in panel order (TRL's names; absent ones are skipped).
PANELS = {
    "ppo": ["objective/scores", "objective/kl", "objective/kl_coef", "objective/rlhf_reward", "loss/policy_avg",
            "loss/value_avg", "loss/ptx_avg", "objective/entropy",
            # critic-free estimators (docs/critic-free.md)
            "objective/group_scores_std", "objective/frac_groups_equal_scores", "loss/kl_avg"],
    "reward": ["loss", "accuracy", "margin", "mean_reward"],
    "dpo": ["loss", "rewards/accuracies", "rewards/margins", "rewards/chosen", "rewards/rejected"],
    "sft": ["loss", "mean_token_accuracy", "entropy"],
}
EXTRA_HINT = 'pip install "trl-ext[plot]"'


@dataclass
class Run:
    """One run's logged metrics.

    Attributes:
        path: the directory given.
        state_file: the ``trainer_state.json`` read (the run's own, or its latest checkpoint's while it runs).
        kind: ``"sft"``, ``"reward"``, ``"dpo"``, ``"ppo"`` or ``"other"``.
        log_history: ``trainer_state.json``'s ``log_history`` (one dict per logging step).
        finished: False when the state came from a checkpoint (the run is still going, or stopped early).
    """

    path: Path
    state_file: Path
    kind: str
    log_history: list = field(default_factory=list)
    finished: bool = True
    name: str = ""

    @property
    def label(self) -> str:
        """The legend entry: the folder's name, with the checkpoint read while the run is not finished."""
        return (self.name or self.path.name) + ("" if self.finished else f" ({self.state_file.parent.name})")


def load_run(path: str | os.PathLike) -> Run:
    """Read a run's ``trainer_state.json``: in ``path``, else in its latest complete ``checkpoint-N``; ``path`` may
    also be a checkpoint folder or the JSON file itself. One-line :class:`~trl_ext.errors.UserInputError` naming
    ``path`` when there is none."""
    path = Path(path)
    if path.is_file() and path.name == COMPLETE_MARKER:
        state_file, run_dir = path, path.parent
    elif (path / COMPLETE_MARKER).is_file():
        state_file, run_dir = path / COMPLETE_MARKER, path
    elif path.is_dir() and latest_checkpoint(str(path)):
        state_file, run_dir = Path(latest_checkpoint(str(path))) / COMPLETE_MARKER, path
    elif not path.exists():
        raise UserInputError(f"plot: '{path}' does not exist")
    else:
        raise UserInputError(
            f"plot: '{path}' has no {COMPLETE_MARKER} (nor a complete checkpoint-N with one); give a run's output_dir"
        )
    try:
        history = json.loads(state_file.read_text())["log_history"]
    except (OSError, ValueError, KeyError) as err:
        raise UserInputError(f"plot: cannot read the log history of '{state_file}': {err}") from None
    finished = state_file.parent == run_dir and not run_dir.name.startswith("checkpoint-")
    return Run(path=run_dir, state_file=state_file, kind=run_kind(run_dir, history), log_history=history,
               finished=finished)


def run_kind(run_dir: Path, log_history: list) -> str:
    """The trainer of a run: the ``trainer`` of its resolved recipe, else guessed from the metrics it logged."""
    for folder in (run_dir, run_dir.parent):
        recipe = folder / RECIPE_FILENAME
        if recipe.is_file():
            import yaml

            trainer = (yaml.safe_load(recipe.read_text()) or {}).get("trainer")
            if trainer in PANELS:
                return trainer
    keys = {k for entry in log_history for k in entry}
    if "objective/scores" in keys:
        return "ppo"
    if "rewards/margins" in keys:
        return "dpo"
    if "margin" in keys:
        return "reward"
    if "mean_token_accuracy" in keys:
        return "sft"
    return "other"


def series(log_history: list, key: str) -> tuple[list[float], list[float]]:
    """``(steps, values)`` of one metric in a log history, in logging order; ``eval_<key>`` for evaluations.

    Entries without the key are skipped, and so is the final summary entry (``train_runtime``, ...)."""
    steps, values = [], []
    for entry in log_history:
        if key in entry and "train_runtime" not in entry and isinstance(entry[key], (int, float)):
            steps.append(entry.get("step", len(steps)))
            values.append(float(entry[key]))
    return steps, values


def panels_for(runs: list[Run], kind: str) -> list[str]:
    """The metrics to draw for ``runs`` (all of one kind): :data:`PANELS` that any of them logged (for ``other``:
    every numeric metric)."""
    logged = {k for run in runs for entry in run.log_history for k, v in entry.items() if isinstance(v, (int, float))}
    if kind in PANELS:
        return [k for k in PANELS[kind] if k in logged or f"eval_{k}" in logged]
    skip = {"step", "epoch", "learning_rate", "total_flos"}
    return sorted(k for k in logged if not k.startswith(("eval_", "train_")) and k not in skip)[:8]


def plot_runs(paths: list[str | os.PathLike], out_dir: str | os.PathLike, smoothing: float = 0.0) -> list[Path]:
    """Draw the runs in ``paths`` into ``out_dir/<kind>.png`` (one figure per kind, runs overlaid); returns the files.

    ``smoothing`` in [0, 1) is an exponential moving average's weight on the past (as wandb's slider); the raw
    curve is then drawn faintly behind the smoothed one.
    """
    if not 0.0 <= smoothing < 1.0:
        raise UserInputError(f"plot: --smoothing {smoothing} must lie in [0, 1)")
    runs = [load_run(p) for p in paths]  # errors about the inputs come before the one about matplotlib
    labels = [run.label for run in runs]
    for run in runs:  # same folder name in two places: add the parent folder
        if labels.count(run.label) > 1:
            run.name = f"{run.path.parent.name}/{run.path.name}"
    try:
        import matplotlib
    except ImportError:
        raise UserInputError(f"plot: matplotlib is not installed; {EXTRA_HINT}") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in dict.fromkeys(run.kind for run in runs):
        group = [run for run in runs if run.kind == kind]
        keys = panels_for(group, kind)
        if not keys:
            continue
        cols = min(3, len(keys))
        rows = -(-len(keys) // cols)
        fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
        colors = plt.get_cmap("tab10")
        for ax, key in zip(axes.flat, keys):
            for i, run in enumerate(group):
                color = colors(i % 10)
                steps, values = series(run.log_history, key)
                if steps:
                    if smoothing:
                        ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
                    ax.plot(steps, _ema(values, smoothing), color=color, linewidth=1.4, label=run.label)
                steps, values = series(run.log_history, f"eval_{key}")
                if steps:
                    ax.plot(steps, values, color=color, linestyle="--", marker="o", markersize=3,
                            label=f"{run.label} (eval)")
            ax.set_title(key, fontsize=10)
            ax.set_xlabel("update" if kind == "ppo" else "step", fontsize=8)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
        for ax in list(axes.flat)[len(keys):]:
            ax.set_visible(False)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        for ax in list(axes.flat)[1:len(keys)]:  # runs that logged nothing in the first panel
            for h, lab in zip(*ax.get_legend_handles_labels()):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
        fig.suptitle(f"{kind}: {', '.join(run.label for run in group)}", fontsize=10)
        fig.tight_layout(rect=(0, 0.05 + 0.02 * (len(labels) // 4), 1, 0.97))
        path = out_dir / f"{kind}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


def _ema(values: list[float], weight: float) -> list[float]:
    if not weight:
        return values
    out, last = [], values[0]
    for v in values:
        last = weight * last + (1 - weight) * v
        out.append(last)
    return out
