"""``trl-ext demo``: the CPU demo in one command, on its defaults: the reward model, PPO against it, the export,
samples from the exported policy and the plots, each step the ``trl-ext`` command docs/quickstart-cpu.md lists (printed
before it runs), then one summary of what each step wrote and what its numbers mean.

The demo's recipes and data are the clone's ``recipes/demo`` (looked for in the current directory, then beside the
installed package). Its outputs go under ``--out`` (default ``outputs/demo``, the step-by-step commands' paths); any of
them already there stops the demo before it starts, unless ``--overwrite``.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import time
from pathlib import Path
from typing import Callable

from ..errors import UserInputError
from .summary import headline

#: What the demo writes under --out, in step order.
OUTPUTS = ("reward", "ppo", "export", "samples.jsonl", "plots")
PPO_TAIL = 10  # docs/quickstart-cpu.md's PPO figure: mean objective/scores of the last 10 updates


def demo_folder() -> Path:
    """``recipes/demo`` of the current directory (a clone's root), else of the clone the package is installed from."""
    for root in (Path("."), Path(__file__).resolve().parents[2]):
        if (root / "recipes" / "demo" / "ppo.yaml").is_file():
            return root / "recipes" / "demo"
    raise UserInputError("demo: recipes/demo not found in the current directory; run `trl-ext demo` from a clone of "
                         "the trl-ext repository (the demo's recipes and data are not part of the installed package)")


def steps(demo: Path, out: Path, overwrite: bool) -> list[tuple[str, list[str]]]:
    """(what, trl-ext argv) of each step: the step-by-step commands of docs/quickstart-cpu.md, with --out's paths."""
    forced = ["--overwrite"] if overwrite else []
    data = demo / "data"
    return [
        ("reward model", ["train", str(demo / "reward.yaml"), "--output_dir", str(out / "reward"),
                          "--dataset_name", str(data / "preferences.jsonl")]),
        ("PPO", ["train", str(demo / "ppo.yaml"), "--output_dir", str(out / "ppo"),
                 "--reward_model_path", str(out / "reward"), "--dataset_name", str(data / "prompts.jsonl")]),
        ("export", ["export", str(out / "ppo"), str(out / "export"), *forced]),
        ("sample", ["sample", str(out / "export"), "--prompts", str(data / "prompts.jsonl"), "--limit", "4",
                    "--reward", str(out / "export" / "reward"), "--out", str(out / "samples.jsonl"), *forced]),
        ("plot", ["plot", str(out / "reward"), str(out / "ppo"), "--out", str(out / "plots")]),
    ]


def check_outputs(out: Path, overwrite: bool) -> None:
    """Refuse (before anything runs) when a demo output is already there and --overwrite was not given."""
    if out.exists() and not out.is_dir():
        raise UserInputError(f"demo: --out {out} is a file; give a folder")
    there = [str(out / name) for name in OUTPUTS if (out / name).exists()
             and (not (out / name).is_dir() or any((out / name).iterdir()))]
    if there and not overwrite:
        raise UserInputError(f"demo: {', '.join(there)} already exist (an earlier demo?); --overwrite replaces them, "
                             "or --out DIR writes elsewhere")
    if importlib.util.find_spec("matplotlib") is None:  # the last step draws: say so before minutes of training
        raise UserInputError('demo: its last step draws the curves with matplotlib, which is not installed; '
                             'pip install "trl-ext[plot]"')


def run_demo(args, run_command: Callable[[list[str]], int]) -> int:
    """Run every step through ``run_command`` (the CLI's own dispatch, given by trl_ext.cli), then the summary."""
    out = Path(args.out)
    check_outputs(out, args.overwrite)
    demo = demo_folder()
    seconds = {}
    for number, (what, argv) in enumerate(steps(demo, out, args.overwrite), 1):
        print(f"\ntrl-ext demo, step {number}/5, {what}: trl-ext {shlex.join(argv)}", flush=True)
        start = time.monotonic()
        code = run_command(argv)
        seconds[what] = time.monotonic() - start
        if code != 0:
            print(f"trl-ext demo: stopped at step {number} ({what}), exit code {code}", flush=True)
            return code
    print("\n" + summary(out, seconds), flush=True)
    return 0


def _history(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "trainer_state.json").read_text())["log_history"]


def summary(out: Path, seconds: dict[str, float]) -> str:
    """What each step wrote and what its numbers mean, read back from the files the steps wrote."""
    accuracy = headline(_history(out / "reward"), "reward")
    scores = [h["objective/scores"] for h in _history(out / "ppo") if "objective/scores" in h]
    tail = sum(scores[-PPO_TAIL:]) / len(scores[-PPO_TAIL:])
    export = json.loads((out / "export" / "trl_ext_export.json").read_text())
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    plots = sorted(p.name for p in (out / "plots").glob("*.png"))
    rewards = [sample["score"] for sample in samples]
    took = {what: f"{s:.0f} s" if s >= 10 else f"{s:.1f} s" for what, s in seconds.items()}
    lines = [
        f"trl-ext demo: done in {sum(seconds.values()):.0f} s; everything is under {out}/",
        f"  1. reward model  {out / 'reward'}/ ({took['reward model']}): pairwise accuracy on its preference pairs "
        f"(chosen scored above rejected) {accuracy[1]:.2f} -> {accuracy[2]:.2f}, first -> last logged batch",
        f"  2. PPO policy    {out / 'ppo'}/ ({took['PPO']}): objective/scores, the reward model's score of the "
        f"policy's responses, {scores[0]:+.2f} at update 1 -> {tail:+.2f} (mean of the last {PPO_TAIL} of "
        f"{len(scores)} updates; higher: more \"happy\" words)",
        f"  3. export        {out / 'export'}/{{{','.join(export['roles'])}}} ({took['export']}): standalone "
        + ", ".join(f"{role}: {entry['class']}" for role, entry in export["roles"].items())
        + " (from_pretrained, no trl-ext needed)",
        f"  4. samples       {out / 'samples.jsonl'} ({took['sample']}): {len(samples)} prompts, the "
        f"exported policy's response to each and its reward: mean {sum(rewards) / len(rewards):+.2f} "
        f"({', '.join(f'{r:+.1f}' for r in rewards)})",
        f"  5. plots         {out / 'plots'}/{{{','.join(plots)}}}: every logged curve of both runs",
        "  The same steps one by one: docs/quickstart-cpu.md, \"The demo step by step\"; what each metric means: "
        "docs/metrics.md",
    ]
    return "\n".join(lines)
