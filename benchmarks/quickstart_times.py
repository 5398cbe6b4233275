"""Wall time of each CPU quickstart command (docs/quickstart-cpu.md), run as a newcomer runs them: on a fresh clone.

    python benchmarks/quickstart_times.py                        # the demo quickstart
    python benchmarks/quickstart_times.py --quickstart verifiable
    python benchmarks/quickstart_times.py --quickstart demo verifiable --json benchmarks/results/quickstart.json

What it does: ``git clone`` of this repository's committed HEAD into a temporary folder; the commands of the
quickstart sections of docs/quickstart-cpu.md (the ```bash blocks under "### The demo step by step" and "### Reward functions: a verifiable
task", read from the clone's copy, so the figures belong to the text they time) run one after the other from the
clone's root, each through the shell, with this Python environment and ``PYTHONPATH`` pointing at the clone (so the
clone's ``trl_ext`` runs, as after ``pip install -e .`` there). A chain ``a && b`` is timed as two commands. The tiny
models are built into a fresh folder (``TRL_EXT_TINY_DIR``), so the first command pays for building them, as on a new
machine; ``HF_HUB_OFFLINE=1`` keeps a machine without network from waiting on Hub retries.

It prints each command's wall time and exit code, the headline line of each ``trl-ext train`` summary (the main
metric, first -> last) and the last line of any other command, with the 1-minute load average just before it (the
previous command's own load included), then the machine: CPU, cores, load average before and after, versions,
commit. A loaded machine makes the times longer (the old figures, taken under load average 8-11, were
15-40x an idle machine's): when the 1-minute load average is above ``--max-load`` (default 1.0) before the run
starts, the script refuses to time anything (exit code 3). The quickstart times in benchmarks/README.md come from this script.
Stops at the first failing command.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = "docs/quickstart-cpu.md"  # where the quickstarts' commands are written
SECTIONS = {"demo": "### The demo step by step", "verifiable": "## Reward functions: a verifiable task"}


def quickstart_commands(readme: str, heading: str) -> list[str]:
    """The shell commands of the ```bash blocks in the section of ``readme`` under ``heading`` (up to the next heading),
    continuation lines joined, comments dropped, ``&&`` chains split."""
    start = readme.index(heading + "\n")
    after = re.search(r"\n#{2,6} ", readme[start + len(heading):])  # the next heading (a bash comment has one #)
    section = readme[start:start + len(heading) + after.start() if after else len(readme)]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        text = block.replace("\\\n", " ")
        for line in text.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                commands += [part.strip() for part in line.split("&&")]
    return commands


def machine() -> dict:
    cpu = "unknown"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = {}
    for name in ("torch", "transformers", "trl"):
        try:
            versions[name] = __import__(name).__version__
        except ImportError:
            versions[name] = None
    return {"cpu": cpu, "cores": os.cpu_count(), "python": sys.version.split()[0], **versions}


def note_of(command: str, output: str) -> str:
    """The line worth printing beside a command's time: a train summary's headline, else the last output line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if re.match(r"[a-z_/]+: \S+ \(first of \d+ logged\) -> ", line):
            return line.split("   [")[0]
    return lines[-1][:160] if lines else ""


def run_quickstart(name: str, clone: Path, env: dict, log_dir: Path) -> list[dict]:
    commands = quickstart_commands((clone / DOC).read_text(), SECTIONS[name])
    results = []
    for i, command in enumerate(commands):
        print(f"[{name} {i + 1}/{len(commands)}] $ {command}", flush=True)
        load = round(os.getloadavg()[0], 2)
        start = time.perf_counter()
        proc = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        (log_dir / f"{name}_{i + 1}.log").write_text(proc.stdout + "\n--- stderr ---\n" + proc.stderr)
        note = note_of(command, proc.stdout)
        results.append({"quickstart": name, "command": command, "seconds": round(seconds, 1),
                        "exit_code": proc.returncode, "note": note, "load_before": load})
        print(f"    {seconds:7.1f} s  exit {proc.returncode}  load {load}  {note}", flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            break
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quickstart", nargs="+", choices=sorted(SECTIONS), default=["demo"])
    p.add_argument("--repo", default=str(REPO), help="the repository to clone (default: this one)")
    p.add_argument("--keep", action="store_true", help="keep the clone (its outputs/ and logs) and print where")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.add_argument("--max-load", type=float, default=1.0,
                   help="refuse to time anything when the 1-minute load average is above this at the start")
    args = p.parse_args(argv)
    load = os.getloadavg()[0]
    if load > args.max_load:
        print(f"quickstart_times: the 1-minute load average is {load:.2f} (> --max-load {args.max_load}): the times "
              "would not be what a user sees; wait for an idle machine (or raise --max-load and say so)",
              file=sys.stderr)
        return 3

    work = Path(tempfile.mkdtemp(prefix="trl-ext-quickstart-"))
    clone = work / "trl-ext"
    subprocess.run(["git", "clone", "--quiet", args.repo, str(clone)], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PYTHONPATH": str(clone), "TRL_EXT_TINY_DIR": str(work / "tiny-models"),
           "HF_HUB_OFFLINE": "1", "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    info = {**machine(), "commit": commit, "load_before": [round(x, 2) for x in os.getloadavg()],
            "started_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "clone": str(clone)}
    imported = subprocess.run([sys.executable, "-c", "import trl_ext; print(trl_ext.__file__)"], env=env,
                              cwd=work, capture_output=True, text=True, check=True).stdout.strip()
    if not imported.startswith(str(clone)):
        raise SystemExit(f"the clone's trl_ext is not the one imported ({imported}): check PYTHONPATH")
    print(f"fresh clone of {args.repo} at {commit} in {clone}", flush=True)
    results = []
    for name in args.quickstart:
        results += run_quickstart(name, clone, env, work)
    info["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print("\nquickstart  seconds  load before  command")
    for r in results:
        print(f"{r['quickstart']:<11} {r['seconds']:7.1f}  {r['load_before']:11.2f}  {r['command']}")
    for name in args.quickstart:
        total = sum(r["seconds"] for r in results if r["quickstart"] == name)
        print(f"{name}: {total:.0f} s in all")
    print(f"machine: {info['cpu']}, {info['cores']} cores; load average (1/5/15 min) {info['load_before']} before, "
          f"{info['load_after']} after; python {info['python']}, torch {info['torch']}, transformers "
          f"{info['transformers']}, trl {info['trl']}; commit {commit}; {info['started_utc']} UTC")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"machine": info, "results": results}, indent=1))
    if args.keep:
        print(f"kept: {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["exit_code"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
