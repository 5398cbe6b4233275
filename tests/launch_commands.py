"""`accelerate launch` command lines for the multi-process tests.

The suite runs on two pytest-xdist workers (pyproject.toml), so two launches may overlap: each gets its own free
rendezvous port instead of accelerate's fixed default (29500), which the second launch would find taken.
"""

import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_launch(config: str) -> list[str]:
    """`python -m accelerate.commands.launch --config_file recipes/accelerate/CONFIG --main_process_port PORT`."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "recipes" / "accelerate" / config), "--main_process_port", str(free_port())]
