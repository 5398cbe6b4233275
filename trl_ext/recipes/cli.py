"""The ``trl-ext`` command line (also ``python -m trl_ext``).

Commands:
  train RECIPE [--key value ...]   train an SFT, reward, DPO or PPO model from a YAML recipe
  check RECIPE [--key value ...]   validate a recipe without loading any model; print the resolved settings
  plot OUTPUT_DIR [OUTPUT_DIR ...] draw the runs' logged curves into PNG files (needs matplotlib: trl-ext[plot])

Bad input exits with code 2 and one line on stderr (no traceback). SIGINT (Ctrl-C) or SIGTERM during training saves
a checkpoint at the end of the current step and exits with 130 / 143 and a line saying where the checkpoint is
(resume with `--resume_from_checkpoint true`). NaN/inf scores or losses exit with code 3 and a line naming the
update and the quantity.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from .. import __version__
from ..errors import UserInputError

EXIT_USAGE = 2
EXIT_NONFINITE = 3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-ext",
        description="Train SFT, reward, DPO and PPO models with TRL's trainers plus trl-ext's extensions.",
        epilog="Run `trl-ext COMMAND --help` for a command's options. "
        "Multi-GPU: `accelerate launch -m trl_ext train RECIPE`.",
    )
    parser.add_argument("--version", action="version", version=f"trl-ext {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_ in (
        ("train", "train a model from a YAML recipe"),
        ("check", "validate a recipe without loading any model and print the resolved settings"),
    ):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("recipe", help="path to a YAML recipe")
        p.add_argument("overrides", nargs=argparse.REMAINDER, help="`--key value` pairs overriding recipe keys")
    help_ = "draw the main curves of finished or running runs (their trainer_state.json) into PNG files"
    p = sub.add_parser("plot", help=help_, description=help_ + '; needs matplotlib: pip install "trl-ext[plot]"')
    p.add_argument("runs", nargs="+", metavar="OUTPUT_DIR", help="output_dir of a run (several are overlaid)")
    p.add_argument("--out", default="plots", help="folder for the PNG files, one per kind of run (default: plots)")
    p.add_argument("--smoothing", type=float, default=0.0,
                   help="exponential moving average weight in [0, 1) (as wandb's slider; default 0: raw)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    # bitsandbytes logs a warning at import on AVX512-BF16 CPUs (an optional hub kernel it cannot fetch). trl-ext
    # avoids that code path for training anyway (trl_ext.models.quantization), so keep it out of the one-line errors.
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    # transformers 5 deprecates `gradient_checkpointing`, which TRL 1.12's configs set by default: not the user's.
    warnings.filterwarnings("ignore", message="`gradient_checkpointing` is deprecated", category=FutureWarning)
    try:
        return _run(args)
    except UserInputError as err:
        print(f"trl-ext: error: {err}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from .loader import resolve_recipe

    if args.command == "plot":
        from .plots import plot_runs

        for path in plot_runs(args.runs, args.out, smoothing=args.smoothing):
            print(path)
        return 0
    overrides = [tok for tok in args.overrides if tok != "--"]
    if args.command == "check":
        recipe = resolve_recipe(args.recipe, overrides, for_check=True)
        from .data_rows import check_local_data

        check_local_data(recipe)  # local data: columns, rows and prompt lengths too (no network, no model)
        print(f"# {args.recipe}: OK ({recipe.trainer} recipe, {type(recipe.training_args).__name__})")
        for note in recipe.notes:
            print(f"# note: {note}")
        if recipe.trainer == "ppo" and recipe.pipeline.shared_base:
            from .loader import shared_value_is_fresh

            base = recipe.model_args.model_name_or_path
            value = recipe.value_model_args.model_name_or_path
            value = "fresh adapter and head" if shared_value_is_fresh(value, base) else f"adapter {value}"
            print(f"# shared base {base}: policy adapter; reward: adapter {recipe.reward_model_args.model_name_or_path}"
                  f" (frozen); value: {value}; reference: adapters disabled")
        for role, margs in (("reward model", recipe.reward_model_args), ("value model", recipe.value_model_args)):
            if margs is not None and not (recipe.trainer == "ppo" and recipe.pipeline.shared_base):
                quant = "4-bit" if margs.load_in_4bit else "8-bit" if margs.load_in_8bit else margs.dtype
                lora = f", LoRA r={margs.lora_r}" if margs.use_peft else ""
                print(f"# {role}: {margs.model_name_or_path} ({quant}{lora})")
        print(recipe.to_yaml(), end="")
        return 0
    recipe = resolve_recipe(args.recipe, overrides)
    from ..runtime.interruption import TrainingInterrupted
    from ..runtime.nonfinite import NonFiniteError
    from .pipeline import run

    try:
        run(recipe)
    except TrainingInterrupted as stop:  # raised by every process, after the checkpoint is saved
        _print_once(f"trl-ext: {stop}")
        return stop.exit_code
    except NonFiniteError as err:
        _print_once(f"trl-ext: error: {err}")
        return EXIT_NONFINITE
    return 0


def _print_once(message: str) -> None:
    """Print on stderr from the first process only (under `accelerate launch`/`torchrun` every rank gets here)."""
    import os

    if os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
