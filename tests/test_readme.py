"""The README starts on the GPU: at most 220 lines, "On your GPU" within the first 60, then the CPU demo and the tests
in two commands, then the documentation index; and every command it shows runs in a test. "On your GPU"'s commands
run here in the README's order at tiny size (tests/real_recipes.py: tiny models of each checkpoint's family, local
rows of each dataset; the GSM8K script on stand-in rows of GSM8K's format); `trl-ext demo` runs in
tests/recipes/test_recipe_runs.py, and `python -m pytest -q` is what CI runs."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex

import pytest

from real_recipes import ROOT, TinyWorld
from trl_ext.cli import main

README = (ROOT / "README.md").read_text()
LINES = README.splitlines()


def section(heading: str) -> str:
    start = README.index(heading + "\n")
    after = re.search(r"\n## ", README[start + len(heading):])
    return README[start:start + len(heading) + after.start()] if after else README[start:]


def commands(text: str) -> list[str]:
    """The shell commands of the ```bash blocks: comments dropped, `&&` chains split."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                out += [part.strip() for part in line.split("&&")]
    return out


def test_the_readme_starts_on_the_gpu():
    headings = [(i + 1, line) for i, line in enumerate(LINES) if line.startswith("## ")]
    assert len(LINES) <= 220
    order = [line for _, line in headings]
    assert order.index("## On your GPU") < order.index("## On a CPU: the demo and the tests") < order.index(
        "## Documentation")
    gpu_line = next(i for i, line in headings if line == "## On your GPU")
    first_command = next(i + 1 for i, line in enumerate(LINES) if line.startswith("trl-ext train recipes/"))
    assert gpu_line <= 60 and first_command <= 60
    assert commands(section("## On a CPU: the demo and the tests")) == ["trl-ext demo", "python -m pytest -q"]
    for moved in ("## Where things are", "### Run the tests", "## What is measured", "## The trainers in brief"):
        assert moved not in README  # CONTRIBUTING.md, benchmarks/README.md, docs/trainers.md


def make_gsm8k_on_standin_rows(out: str, monkeypatch) -> None:
    """`python recipes/qwen2.5-0.5b/make_gsm8k.py OUT`, its `datasets.load_dataset("openai/gsm8k", "main")` answered
    with local rows of GSM8K's format (the download is the only part that needs the Hub)."""
    import datasets

    script = ROOT / "recipes" / "qwen2.5-0.5b" / "make_gsm8k.py"
    spec = importlib.util.spec_from_file_location("make_gsm8k_readme", script)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    rows = [{"question": f"What is {i} + 3?", "answer": f"{i} + 3 = {i + 3}\n#### {i + 3}"} for i in range(8)]
    standin = datasets.DatasetDict(train=datasets.Dataset.from_list(rows), test=datasets.Dataset.from_list(rows[:4]))
    asked = []
    with monkeypatch.context() as patch:  # the download only: the training that follows opens its data for real
        patch.setattr(datasets, "load_dataset", lambda *args: asked.append(args) or standin)
        make.main(out)
    assert asked == [("openai/gsm8k", "main")]


@pytest.fixture(scope="module")
def world(tiny_env, tmp_path_factory):
    return TinyWorld(tmp_path_factory.mktemp("readme"))


def test_every_command_on_your_gpu_runs_at_tiny_size(world, tmp_path, monkeypatch, capsys):
    shown = commands(section("## On your GPU"))
    assert shown[:3] == ["trl-ext train recipes/qwen2.5-0.5b/reward.yaml",
                         "trl-ext train recipes/qwen2.5-0.5b/ppo_shared.yaml",
                         "trl-ext export outputs/qwen2.5-0.5b/ppo_shared outputs/qwen2.5-0.5b/export"]
    monkeypatch.chdir(tmp_path)  # where the commands' outputs/ go; the recipes are read from the repository
    ran = []
    for command in shown:
        argv = shlex.split(command)
        if argv[:2] == ["trl-ext", "train"]:
            world.run(argv[2])
        elif argv[:2] == ["trl-ext", "export"]:
            run_dir = world.run(world.outputs[argv[2]])
            assert main(["export", str(run_dir), argv[3]]) == 0
            export = tmp_path / argv[3]
            assert {"policy", "reward", "value", "README.md"} <= {p.name for p in export.iterdir()}
        elif argv[0] == "python" and argv[1] == "recipes/qwen2.5-0.5b/make_gsm8k.py":
            out = tmp_path / "outputs" / "qwen2.5-0.5b" / "gsm8k"
            make_gsm8k_on_standin_rows(str(out), monkeypatch)
            rows = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
            assert len(rows) == 8 and rows[1]["solution"] == "4"
            world.datasets["outputs/qwen2.5-0.5b/gsm8k"] = str(out)  # the GRPO recipe trains on this output
        else:
            pytest.fail(f"the README shows a command no test runs: {command}")
        ran.append(command)
    capsys.readouterr()
    assert ran == shown and any("grpo_gsm8k" in c for c in ran)
