"""The ``trl-ext`` command line (also ``python -m trl_ext``).

Commands:
  train RECIPE [--key value ...]   train a reward, DPO or PPO model from a YAML recipe
  check RECIPE [--key value ...]   validate a recipe without loading any model; print the resolved settings

Bad input exits with code 2 and one line on stderr (no traceback).
"""

from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import UserInputError

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-ext",
        description="Train reward, DPO and PPO models with TRL's trainers plus trl-ext's extensions.",
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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return _run(args)
    except UserInputError as err:
        print(f"trl-ext: error: {err}", file=sys.stderr)
        return EXIT_USAGE


def _run(args: argparse.Namespace) -> int:
    raise UserInputError(f"`trl-ext {args.command}` is not implemented yet (recipes land in a later release).")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
