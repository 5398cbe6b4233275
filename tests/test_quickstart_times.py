"""benchmarks/quickstart_times.py reads the commands it times from docs/quickstart-cpu.md: each quickstart section must still
give it the commands a newcomer runs, with every recipe and script they name present (else the script, which only
runs by hand, would time the wrong thing unseen)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quickstart_times():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import quickstart_times
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return quickstart_times


def test_demo_commands_in_readme_order(quickstart_times):
    commands = quickstart_times.quickstart_commands((ROOT / quickstart_times.DOC).read_text(),
                                                    quickstart_times.SECTIONS["demo"])
    assert commands[:2] == ["trl-ext train recipes/demo/reward.yaml", "trl-ext train recipes/demo/ppo.yaml"]
    assert any(c.startswith("trl-ext export ") for c in commands) and any(c.startswith("trl-ext sample ") for c in commands)
    # `&&` chains split into their commands; no comment survives
    assert "trl-ext train recipes/demo/ppo_shared.yaml" in commands and not [c for c in commands if "#" in c]


@pytest.mark.parametrize("section", ["demo", "verifiable"])
def test_every_file_a_quickstart_command_names_exists(quickstart_times, section):
    commands = quickstart_times.quickstart_commands((ROOT / quickstart_times.DOC).read_text(),
                                                    quickstart_times.SECTIONS[section])
    assert commands
    named = [p for c in commands for p in re.findall(r"\b(?:recipes|benchmarks)/\S+\.(?:yaml|py|jsonl)", c)]
    assert named and all((ROOT / p).exists() for p in named), [p for p in named if not (ROOT / p).exists()]


def test_a_continued_line_is_one_command(quickstart_times):
    readme = "### Run the demo\n\n```bash\ntrl-ext sample a \\\n    --limit 4   # four\n# a comment\n```\n## Next\n"
    assert quickstart_times.quickstart_commands(readme, "### Run the demo") == ["trl-ext sample a      --limit 4"]


def test_a_loaded_machine_times_nothing(quickstart_times, monkeypatch, capsys):
    """Above --max-load the script refuses before cloning (exit 3): times taken under load are not what a user sees."""
    import subprocess

    monkeypatch.setattr(quickstart_times.os, "getloadavg", lambda: (5.0, 4.0, 3.0))
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("cloned or ran under load"))
    assert quickstart_times.main(["--max-load", "1.0"]) == 3
    assert "load average is 5.00 (> --max-load 1.0)" in capsys.readouterr().err
