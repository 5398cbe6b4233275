"""The ``trl-ext`` command line (also ``python -m trl_ext``), above the packages whose commands it runs:
``recipe_loader`` (demo, train, check, plan, plot) and ``export`` (export, sample, score). How it works: docs/internals.md#the-command-line."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import __version__
from .errors import UserInputError

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
        p.add_argument("--verbose", action="store_true", help="also show the known, harmless warnings of the "
                       "libraries underneath (hidden by default; may also follow the recipe)")
        p.add_argument("overrides", nargs=argparse.REMAINDER, help="`--key value` pairs overriding recipe keys")
    help_ = "a PPO recipe's memory budget (config.json only): whether it fits a GPU and the fastest settings that do"
    p = sub.add_parser("plan", help=help_, description=help_ + "; exits 0 if it fits as written, 1 if not")
    p.add_argument("recipe", help="path to a YAML recipe (PPO)")
    p.add_argument("--gpu-memory", type=float, default=None, metavar="GIB",
                   help="memory of the GPU (whole process), GiB (default 24); may also follow the recipe")
    p.add_argument("--prompt-length", type=int, default=None, metavar="N",
                   help="prompt length in tokens to plan for (default 512; the pipeline does not truncate prompts)")
    p.add_argument("overrides", nargs=argparse.REMAINDER, help="`--key value` pairs overriding recipe keys")
    help_ = "draw the main curves of finished or running runs (their trainer_state.json) into PNG files"
    p = sub.add_parser("plot", help=help_, description=help_ + '; needs matplotlib: pip install "trl-ext[plot]"')
    p.add_argument("runs", nargs="+", metavar="OUTPUT_DIR", help="output_dir of a run (several are overlaid)")
    p.add_argument("--out", default=None, help="folder for the PNG files, one per kind of run (default: "
                   "OUTPUT_DIR/plots of the first run)")
    p.add_argument("--smoothing", type=float, default=0.0,
                   help="exponential moving average weight in [0, 1) (as wandb's slider; default 0: raw)")
    _add_export_parsers(sub)
    help_ = "run the README's demo in one command: reward model, PPO, export, sample and plot, then a summary"
    p = sub.add_parser("demo", help=help_, description=help_ + (
        ". Needs a clone of the repository (recipes/demo) and matplotlib; runs offline on a CPU in about a minute. "
        "Each step is the trl-ext command printed before it."))
    p.add_argument("--out", default="outputs/demo", help="folder for the demo's outputs: reward/, ppo/, export/, "
                   "samples.jsonl, plots/ (default: outputs/demo, as the step-by-step commands)")
    p.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier demo (refused "
                   "otherwise, before anything runs)")
    return parser


def _add_export_parsers(sub) -> None:
    """`export`, `sample`, `score` (their code: trl_ext/export/)."""
    help_ = "write a run's models as standalone full-precision transformers models (no peft, no trl-ext needed)"
    p = sub.add_parser("export", help=help_, description=help_ + (
        ". Writes OUT_DIR/policy (AutoModelForCausalLM), OUT_DIR/reward and OUT_DIR/value "
        "(AutoModelForSequenceClassification, one output), each with the tokenizer, OUT_DIR/trl_ext_export.json "
        "(where each came from) and OUT_DIR/README.md (a model card). LoRA adapters are merged into their base "
        "reloaded unquantized (also for 4-/8-bit runs); a centred reward head keeps its bias (loads with "
        "trust_remote_code=True). OUT_DIR must be new or empty (or --overwrite); nothing is written on error."))
    p.add_argument("run", metavar="RUN_DIR", help="output_dir of `trl-ext train` (SFT, reward, DPO, PPO) or a "
                   "checkpoint-N folder of it")
    p.add_argument("out", metavar="OUT_DIR", help="new folder for the exported models")
    p.add_argument("--roles", nargs="+", metavar="ROLE", choices=["policy", "reward", "value"],
                   help="which models (default: all the run has: policy; reward; PPO: policy, value (in "
                   "checkpoints and shared-base outputs), reward (the recipe's reward_model_path))")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "auto"],
                   help="dtype of the saved weights (default: the recipe's dtype, float32 unless set; auto: the base "
                   "checkpoint's)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a non-empty OUT_DIR (only once the new export is complete)")
    p.add_argument("--base", metavar="MODEL", help="the base model the run's LoRA adapters were trained on, when it is "
                   "no longer where adapter_config.json says (policy adapters; shared-base reward/value adapters)")
    p.add_argument("--push-to-hub", metavar="REPO", help="then upload OUT_DIR (the models and the model card, "
                   "README.md) to this Hub model repo, created if needed (huggingface_hub: HF_TOKEN or "
                   "`hf auth login`)")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repo private")

    help_ = "generate responses from a run's (or an export's) policy with the run's sampling settings"
    p = sub.add_parser("sample", help=help_, description=help_ + (
        ". Writes one JSON line per sample ({prompt, response, sample} and, with --reward, score) to --out and "
        "prints them. PPO runs sample as PPO did (temperature, response_length, stop token); other runs use "
        "the model's generation_config unless options say otherwise."))
    p.add_argument("run", metavar="RUN_DIR", help="a trl-ext run, checkpoint or export (or a causal-LM directory)")
    p.add_argument("--prompts", required=True, metavar="FILE",
                   help="prompts: a .jsonl/.json/.csv/.parquet file, a save_to_disk folder or a dataset name, "
                   "with a `prompt` column (text or chat messages)")
    p.add_argument("--split", default="train", help="split of --prompts (default: train)")
    p.add_argument("--out", default="samples.jsonl", help="JSON-lines file to write (default: samples.jsonl; "
                   "an existing file is refused unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--reward", metavar="MODEL_DIR",
                   help="score each sample with this reward model (a reward run, export or model directory)")
    p.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    p.add_argument("--num-samples", type=int, default=1, help="samples per prompt (default: 1)")
    p.add_argument("--max-new-tokens", type=int, help="override the run's response length")
    p.add_argument("--temperature", type=float, help="override the run's temperature")
    p.add_argument("--limit", type=int, help="only the first N prompts")
    p.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "auto"],
                   help="dtype to run in (default: a run's recipe dtype; an export's or model's own)")

    help_ = "score a data file with a reward model and/or reward functions"
    p = sub.add_parser("score", help=help_, description=help_ + (
        ". prompt/response rows: prints the mean score (and, with --reward-funcs, each function's mean); preference "
        "rows (chosen/rejected, or `responses` ranked best first): prints pairwise accuracy and mean margin (better "
        "minus worse, over all pairs). With --out, writes the rows with their scores (`score`, or `scores` per "
        "response; `rewards` per function) as JSON lines; nothing else is written."))
    p.add_argument("reward", metavar="REWARD_DIR", nargs="?", help="a reward run or checkpoint, an export (its "
                   "reward model) or a one-output sequence-classification model directory (optional with "
                   "--reward-funcs)")
    p.add_argument("--reward-funcs", nargs="+", metavar="SPEC", help="reward functions as in a recipe's "
                   "reward_funcs: module:function, path/to/file.py:function (relative to the working directory), "
                   "or JSON: '{\"name\": \"trl.rewards.get_soft_overlong_punishment\", \"kwargs\": {...}}', "
                   "'{\"url\": \"http://host:port/path\"}'")
    p.add_argument("--tokenizer", metavar="DIR", help="tokenizer for the functions' completion_ids when there is no "
                   "REWARD_DIR (default: the reward model's)")
    p.add_argument("--data", required=True, metavar="FILE", help="a .jsonl/.json/.csv/.parquet file, a "
                   "save_to_disk folder or a dataset name")
    p.add_argument("--split", default="train", help="split of --data (default: train)")
    p.add_argument("--out", help="JSON-lines file for the scored rows (an existing file is refused)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per forward pass (default: 16)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "auto"],
                   help="dtype to run in (default: a run's recipe dtype; an export's or model's own)")


def config_option_as_recipe(argv: list[str]) -> list[str]:
    """``trl-ext train --config RECIPE`` (TRL's ``trl grpo --config x.yaml``) as ``trl-ext train RECIPE``; also for
    check and plan. A recipe given both ways is refused."""
    if not argv or argv[0] not in ("train", "check", "plan"):
        return argv
    rest = argv[1:]
    for i, token in enumerate(rest):
        name, eq, value = token.partition("=")
        if name != "--config":
            continue
        if not eq and i + 1 >= len(rest):
            raise UserInputError("--config needs the recipe file: --config RECIPE")
        value = value if eq else rest[i + 1]
        others = rest[:i] + rest[i + (1 if eq else 2):]
        j = 0
        while j < len(others) and others[j].partition("=")[0] in ("--verbose", "--gpu-memory", "--prompt-length"):
            j += 1 if others[j] == "--verbose" or "=" in others[j] else 2  # the command's own options
        if j < len(others) and not others[j].startswith("-"):
            raise UserInputError(f"the recipe is given twice: --config {value} and {others[j]}; give one")
        return [argv[0], value, *others]
    return argv


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        argv = config_option_as_recipe(list(sys.argv[1:] if argv is None else argv))
    except UserInputError as err:
        print(f"trl-ext: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    from .runtime.quiet_console import quiet_console

    if getattr(args, "overrides", None) and "--verbose" in args.overrides:  # `train RECIPE --verbose`
        args.overrides = [tok for tok in args.overrides if tok != "--verbose"]
        args.verbose = True
    # known third-party warnings off the console (narrow filters) and no idle DeepSpeed import: runtime/quiet_console
    quiet_console(verbose=getattr(args, "verbose", False))
    try:
        return _run(args)
    except UserInputError as err:
        print(f"trl-ext: error: {err}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    from .recipe_loader.loader import resolve_recipe

    if args.command == "demo":  # each step through this dispatch, as its trl-ext command (trl_ext/recipe_loader/demo.py)
        from .recipe_loader.demo import run_demo

        return run_demo(args, lambda argv: _run(build_parser().parse_args(argv)))

    if args.command in ("export", "sample", "score"):  # trl_ext/export/{export_models,sample,score}.py
        import importlib

        module = {"export": "export_models", "sample": "sample", "score": "score"}[args.command]
        importlib.import_module(".export.run_dir", __package__).quiet_libraries()
        return importlib.import_module(f".export.{module}", __package__).main(args)
    if args.command == "plot":
        from .recipe_loader.plots import plot_runs

        out = args.out if args.out is not None else Path(args.runs[0]) / "plots"  # beside the (first) run
        for path in plot_runs(args.runs, out, smoothing=args.smoothing):
            print(path)
        return 0
    overrides = [tok for tok in args.overrides if tok != "--"]
    if args.command == "plan":
        from .recipe_loader.plan import run_plan

        return run_plan(args.recipe, overrides, gpu_memory=args.gpu_memory, prompt_length=args.prompt_length)
    if args.command == "check":
        return _check(args, overrides)
    recipe = resolve_recipe(args.recipe, overrides)
    from .runtime.interruption import TrainingInterrupted
    from .runtime.nonfinite import NonFiniteError
    from .recipe_loader.pipeline import run
    from .recipe_loader.summary import PPO_LEGEND, run_summary

    if recipe.trainer == "ppo" and os.environ.get("RANK", "0") == "0":
        print(PPO_LEGEND, flush=True)  # `eps` & co. explained where they are printed
    start = time.monotonic()
    try:
        trainer = run(recipe)
    except TrainingInterrupted as stop:  # raised by every process, after the checkpoint is saved
        _print_once(f"trl-ext: {stop}")
        return stop.exit_code
    except NonFiniteError as err:
        _print_once(f"trl-ext: error: {err}")
        return EXIT_NONFINITE
    if os.environ.get("RANK", "0") == "0":  # where it all went and what to run next (trl_ext/recipe_loader/summary.py)
        print(run_summary(recipe, trainer.state.log_history, time.monotonic() - start), flush=True)
    return 0


def _check(args: argparse.Namespace, overrides: list[str]) -> int:
    """`trl-ext check`: validate without loading a model; print notes, what was not checked and the recipe."""
    from .recipe_loader.loader import resolve_recipe

    recipe = resolve_recipe(args.recipe, overrides, for_check=True)
    from .recipe_loader.data_rows import check_local_data

    check_local_data(recipe)  # local data: columns, rows and prompt lengths too (no network, no model)
    from .recipe_loader.lora_targets import check_recipe_lora_targets

    notes = recipe.notes + check_recipe_lora_targets(recipe)  # models built on the meta device, no weights
    from .recipe_loader.plan import full_value_model_note

    notes += [note for note in [full_value_model_note(recipe, args.recipe, overrides)] if note]
    print(f"# {args.recipe}: OK ({recipe.trainer} recipe, {type(recipe.training_args).__name__})")
    for note in notes:
        print(f"# note: {note}")
    from .recipe_loader.recipe_paths import hub_names

    for what, name in hub_names(recipe):  # check never goes online: say what it could not see
        print(f"# not checked: {what} '{name}' is a Hub name (check works offline; train downloads it and checks "
              "it then)")
    if recipe.trainer == "ppo" and recipe.pipeline.shared_base:
        from .recipe_loader.loader import shared_value_is_fresh

        base = recipe.model_args.model_name_or_path
        value = "none (critic-free advantage_estimator)"
        if recipe.value_model_args is not None:
            value = recipe.value_model_args.model_name_or_path
            value = "fresh adapter and head" if shared_value_is_fresh(value, base) else f"adapter {value}"
        reward = "none (reward_funcs only)" if recipe.reward_model_args is None else \
            f"adapter {recipe.reward_model_args.model_name_or_path} (frozen)"
        print(f"# shared base {base}: policy adapter; reward: {reward}; value: {value}; reference: adapters "
              "disabled")
    for role, margs in (("reward model", recipe.reward_model_args), ("value model", recipe.value_model_args)):
        if margs is not None and not (recipe.trainer == "ppo" and recipe.pipeline.shared_base):
            quant = "4-bit" if margs.load_in_4bit else "8-bit" if margs.load_in_8bit else margs.dtype
            how = ", frozen" if role == "reward model" else ", trained in full"
            lora = f", LoRA r={margs.lora_r}" if margs.use_peft else how
            print(f"# {role}: {margs.model_name_or_path} ({quant}{lora})")
    if recipe.reward_funcs:
        from .rewards.resolve import reward_func_name

        from .models.paths import looks_local

        names = ", ".join(reward_func_name(f) for f in recipe.reward_funcs)
        columns = "the dataset's columns" if looks_local(recipe.script_args.dataset_name or "") else \
            "the trainer's keywords; the hub dataset's columns are checked by train"
        print(f"# reward functions: {names} (imported; signatures fit {columns})")
    from .recipe_loader.tool_keys import tool_lines

    for line in tool_lines(recipe):  # tools and environments: imported, schemas rendered, environments built once
        print(f"# {line}")
    print(recipe.to_yaml(), end="")
    return 0


def _print_once(message: str) -> None:
    """Print on stderr from the first process only (under `accelerate launch`/`torchrun` every rank gets here)."""
    if os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
