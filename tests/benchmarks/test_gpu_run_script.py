"""benchmarks/gpu_run.sh, the prepared GPU run: what can be checked without a GPU and without a package registry.
The script parses (``bash -n``), refuses an unknown mode, and every ``gpu_ppo.py`` command it runs is one that
gpu_ppo's own parser takes, with known variants, and writes the result files the script then copies and prints.
(The run itself, the wheel download and the installs are the GPU machine's: tests/test_gpu_ppo_benchmark.py runs
gpu_ppo.py's code on CPU.)"""

from __future__ import annotations

import re
import shlex
import subprocess

from benchmark_scripts import BENCH, loaded_script

SCRIPT = BENCH / "gpu_run.sh"


def test_the_script_parses_and_refuses_an_unknown_mode():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    proc = subprocess.run(["bash", str(SCRIPT), "no-such-mode"], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr and "wheels|run|graphs" in proc.stderr


def modes() -> dict[str, list[list[str]]]:
    """mode -> the argument lists of the ``python3 benchmarks/gpu_ppo.py`` commands of its ``case`` branch
    (continuation lines joined, ``$out`` as ``OUT``, up to the ``||`` that follows the command)."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    branches = re.findall(r"^\s+(\w+)\)(.*?);;", text, flags=re.S | re.M)
    commands = {}
    for mode, body in branches:
        commands[mode] = []
        for line in body.splitlines():
            if "benchmarks/gpu_ppo.py" in line:
                words = shlex.split(line.replace("$out", "OUT").split("||")[0])
                commands[mode].append(words[words.index("benchmarks/gpu_ppo.py") + 1:])
    return commands


def test_every_gpu_ppo_command_is_one_gpu_ppo_takes():
    commands = modes()
    assert sorted(commands) == ["graphs", "run", "wheels"]
    assert commands["wheels"] == [] and len(commands["run"]) == 2 and len(commands["graphs"]) == 2
    text = SCRIPT.read_text()
    with loaded_script("gpu_ppo") as gpu_ppo:
        for mode in ("run", "graphs"):
            for argv in commands[mode]:
                a = gpu_ppo.parse_args(argv)
                assert not a.smoke and a.workload == "uneven" and a.shape in gpu_ppo.SHAPES
                assert set(a.variants.split(",")) <= set(gpu_ppo.VARIANTS), a.variants
                if a.out:  # graphs: the result where the script then reads the children's log
                    assert a.out == f"OUT/graphs_{a.shape}.json" and f'"$out/graphs_{a.shape}.log"' in text
                else:  # run: gpu_ppo's own result path, which the script copies and prints
                    assert f"benchmarks/results/gpu_ppo{a.suffix}_{a.workload}." in text
                    assert a.trl112_site == "/tmp/trl112" and "trl112" in a.variants.split(",")
    assert [gpu_ppo.parse_args(argv).profile for argv in commands["run"]] == ["fast", None]
