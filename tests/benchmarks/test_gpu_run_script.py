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
    assert proc.returncode == 2 and "usage:" in proc.stderr and "wheels|run" in proc.stderr


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
    assert sorted(commands) == ["run", "wheels"]
    assert commands["wheels"] == [] and len(commands["run"]) == 2
    text = SCRIPT.read_text()
    with loaded_script("gpu_ppo") as gpu_ppo:
        runs = [gpu_ppo.parse_args(argv) for argv in commands["run"]]
        for a in runs:
            assert not a.smoke and a.workload == "uneven" and a.shape in gpu_ppo.SHAPES
            variants = a.variants.split(",")
            assert {gpu_ppo.base_variant(v) for v in variants} <= set(gpu_ppo.VARIANTS), a.variants
            assert a.out.startswith("OUT/") and f'"$out"/{a.out.removeprefix("OUT/").removesuffix(".json")}.md' in text
            if "trl112" in variants:
                assert a.trl112_site == "/tmp/trl112"
            if any(v.endswith(gpu_ppo.BEFORE) for v in variants):  # the earlier code that `wheels` unpacks
                assert a.before_site == ".before" and "tar -x -C .before" in text
            assert a.child_timeout < int(re.search(rf"timeout (\d+) python3 \S+ --shape {a.shape}", text).group(1))
    assert [a.profile for a in runs] == ["fast", None]
    assert runs[0].variants.split(",")[-1] == "graphs"  # last: a capture that hangs costs only itself
