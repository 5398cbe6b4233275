"""Mutation testing of the modules that hold the math and the safety: plant one small bug at a time (an operator,
a constant, a boolean, a returned value) in a temporary copy of the tree and check that the module's own tests
fail. A mutant the tests do not notice ("survivor") is a hole in the tests, or an equivalent change (the same
behaviour written differently); docs/mutation-testing.md lists the last run's survivors with a verdict for each.

    python tools/mutate.py                      # every module in MODULES, report in outputs/mutation/
    python tools/mutate.py --module user_code/workers.py --max-mutants 40 --timeout 90
    python tools/mutate.py --list --module ppo/objective/objectives.py    # only print the mutants

The worktree is never edited: the tree is copied once into a temporary folder and each mutant is written there
(and the original put back before the next). The tests run as ``pytest -x -q -n 0`` in a process forked from one
that has already imported torch, transformers and TRL (seconds per mutant saved); ``--spawn`` starts a fresh
interpreter per mutant instead. Not part of the test suite and not in CI: it takes tens of minutes on two cores.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODULES = {  # module under trl_ext/ -> the test files that own its behaviour (fast ones: no trainer runs)
    "ppo/objective/objectives.py": ["tests/ppo/test_objectives.py"],
    "ppo/objective/advantages.py": ["tests/ppo/test_advantages.py", "tests/ppo/test_ppo_math.py"],
    "ppo/objective/critic.py": ["tests/ppo/test_critic_free.py"],
    "ppo/objective/kl_controllers.py": ["tests/ppo/test_ppo_math.py", "tests/ppo/test_critic_free.py"],
    "rewards/scoring.py": ["tests/rewards/test_reward_contract.py"],
    "user_code/workers.py": ["tests/user_code/test_workers.py", "tests/user_code/test_worker_interrupts.py"],
    "runtime/nonfinite.py": ["tests/runtime/test_nonfinite_policy.py"],
    "ppo/objective/action_gae.py": ["tests/ppo/test_action_gae.py"],
    "ppo/episodes/tool_calls.py": ["tests/ppo/test_tool_calls.py"],
    "ppo/episodes/toolbox.py": ["tests/ppo/test_toolbox.py"],
    "ppo/episodes/multi_turn.py": ["tests/ppo/test_multi_turn.py", "tests/ppo/test_toolbox.py",
                                   "tests/ppo/test_tools_trainer.py"],
    "ppo/optimize_loop.py": ["tests/ppo/test_update_gradients.py", "tests/ppo/test_optimize_loop_alone.py"],
}

SWAP_BINOP = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
              ast.Pow: ast.Mult, ast.Mod: ast.FloorDiv}
NEGATE_CMP = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq,
              ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In}
BOUNDARY_CMP = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}


@dataclass
class Mutant:
    """One planted change: ``source[start:end]`` (an expression or statement) replaced by ``replacement``."""

    index: int
    kind: str
    line: int
    start: int
    end: int
    replacement: str
    status: str = ""  # killed | survived | timeout | error (the tests could not start)
    seconds: float = 0.0
    diff: str = ""


# ------------------------------------------------------------------------------------------------------- mutants


def _skipped_nodes(tree: ast.AST) -> set[int]:
    """Nodes whose mutation says nothing about behaviour: docstrings, annotations, `raise` statements (the error
    message), f-strings, `__all__`."""
    skip = set()

    def mark(node):
        for sub in ast.walk(node):
            skip.add(id(sub))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Raise, ast.JoinedStr)):
            mark(node)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for decorator in node.decorator_list:  # @dataclass(frozen=True) and the like
                mark(decorator)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.returns is not None:
                mark(node.returns)
            for arg in node.args.args + node.args.kwonlyargs + node.args.posonlyargs:
                if arg.annotation is not None:
                    mark(arg.annotation)
        elif isinstance(node, ast.AnnAssign):
            mark(node.annotation)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            mark(node)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                mark(first)
        if isinstance(node, (ast.ClassDef,)):  # attribute docstrings: a bare string after a field
            for stmt in node.body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    mark(stmt)
    return skip


def _variants(node: ast.AST) -> list[tuple[str, ast.AST]]:
    """The mutated copies of one node (at most two kinds per node), each as (kind, new node)."""
    out = []
    if isinstance(node, ast.BinOp) and type(node.op) in SWAP_BINOP:
        out.append(("binop", ast.BinOp(node.left, SWAP_BINOP[type(node.op)](), node.right)))
    elif isinstance(node, ast.Compare) and len(node.ops) == 1:
        op = type(node.ops[0])
        if op in NEGATE_CMP:
            out.append(("compare-negate", ast.Compare(node.left, [NEGATE_CMP[op]()], node.comparators)))
        if op in BOUNDARY_CMP:
            out.append(("compare-boundary", ast.Compare(node.left, [BOUNDARY_CMP[op]()], node.comparators)))
    elif isinstance(node, ast.BoolOp):
        out.append(("boolop", ast.BoolOp(ast.Or() if isinstance(node.op, ast.And) else ast.And(), node.values)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.Not, ast.USub)) and not (
            isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant)):
        out.append(("unary-drop", node.operand))
    elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
        out.append(("bool-flip", ast.Constant(not node.value)))
    elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        out.append(("constant", ast.Constant(node.value + 1)))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, (int, float)) and not isinstance(node.operand.value, bool):
        value = -node.operand.value
        if _is_shape_index(node):
            out.append(("shape-index", ast.Constant(0)))
        else:
            out.append(("constant", ast.Constant(value + 1)))
    elif isinstance(node, ast.Return) and node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None):
        out.append(("return-none", ast.Return(ast.Constant(None))))
    return out


def _is_shape_index(node) -> bool:
    parent = getattr(node, "_parent", None)
    return isinstance(parent, ast.Subscript) and isinstance(parent.value, ast.Attribute) \
        and parent.value.attr in ("shape",)


def generate(source: str) -> list[Mutant]:
    """Every mutant of ``source``, in source order."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            child._parent = node
    skip = _skipped_nodes(tree)
    line_starts = [0]
    for line in source.splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))

    def offset(lineno, col):  # ast columns are UTF-8 byte offsets
        line = source[line_starts[lineno - 1]:line_starts[lineno]]
        return line_starts[lineno - 1] + len(line.encode()[:col].decode())

    mutants = []
    for node in ast.walk(tree):
        if id(node) in skip or not hasattr(node, "lineno"):
            continue
        # a shape index like `shape[0]` (positive constant) swaps to -1
        if isinstance(node, ast.Constant) and isinstance(getattr(node, "_parent", None), ast.Subscript) \
                and _is_shape_index(node) and node.value == 0:
            variants = [("shape-index", ast.UnaryOp(ast.USub(), ast.Constant(1)))]
        elif isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and isinstance(
                getattr(node, "_parent", None), ast.UnaryOp):
            continue  # mutated through its unary minus
        else:
            variants = _variants(node)
        start, end = offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset)
        for kind, new in variants:
            text = ast.unparse(new)
            if not isinstance(node, ast.stmt) and not isinstance(new, ast.Constant):
                text = f"({text})"
            mutants.append(Mutant(0, kind, node.lineno, start, end, text))
    mutants.sort(key=lambda m: (m.start, m.end, m.kind))
    for i, mutant in enumerate(mutants):
        mutant.index = i
    return mutants


def apply(source: str, mutant: Mutant) -> str:
    mutated = source[:mutant.start] + mutant.replacement + source[mutant.end:]
    ast.parse(mutated)  # a mutant must stay valid Python
    return mutated


def diff(source: str, mutated: str, name: str) -> str:
    lines = difflib.unified_diff(source.splitlines(), mutated.splitlines(), name, name, n=0, lineterm="")
    return "\n".join(line for line in lines if not line.startswith(("---", "+++")))


# ------------------------------------------------------------------------------------------------------- running


def _preimport():
    """Heavy third-party imports done once before forking (never trl_ext: each child imports the mutated copy)."""
    import datasets  # noqa: F401
    import peft  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    import trl  # noqa: F401


def run_tests(copy_root: Path, tests: list[str], timeout: float, log: Path, spawn: bool) -> str:
    """``killed`` (tests failed), ``survived`` (passed), ``timeout`` (killed after ``timeout`` s: counts as
    detected) or ``error`` (pytest could not run them: exit code 2-5)."""
    args = [*tests, "-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-W", "ignore"]
    env = dict(os.environ, PYTHONPATH=str(copy_root), PYTHONDONTWRITEBYTECODE="1")
    if spawn:
        import subprocess

        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "pytest", *args], cwd=copy_root, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return "timeout"
    else:
        pid = os.fork()
        if pid == 0:  # child: a new session (so the timeout kills its workers too), the copy first on the path
            try:
                os.setsid()
                # a run started in the background of a shell ignores SIGINT, and so would the tests' own
                # subprocesses (the pool's Ctrl-C test): give them Python's usual KeyboardInterrupt back
                signal.signal(signal.SIGINT, signal.default_int_handler)
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                os.chdir(copy_root)
                os.environ.update(env)
                sys.path.insert(0, str(copy_root))
                sys.dont_write_bytecode = True
                import pytest

                code = int(pytest.main(args))
            except BaseException:  # noqa: BLE001 - whatever happens in the child, it must not return
                code = 99
            os._exit(code)
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                os.waitpid(pid, 0)
                return "timeout"
            time.sleep(0.2)
    if code == 0:
        return "survived"
    return "killed" if code == 1 else "error"


def mutate_module(module: str, copy_root: Path, args, out_dir: Path) -> dict:
    target = copy_root / "trl_ext" / module
    source = target.read_text()
    mutants = generate(source)
    total = len(mutants)
    if args.only:
        mutants = [m for m in mutants if m.index in set(args.only)]
    elif args.max_mutants and total > args.max_mutants:
        mutants = sorted(random.Random(args.seed).sample(mutants, args.max_mutants), key=lambda m: m.index)
    tests = args.tests or MODULES[module]
    name = module.replace("/", "_").removesuffix(".py")
    print(f"[{module}] {total} mutants, running {len(mutants)} against {' '.join(tests)}", flush=True)
    baseline = run_tests(copy_root, tests, args.timeout * 3, out_dir / f"{name}.baseline.log", args.spawn)
    if baseline != "survived":
        print(f"[{module}] the unmutated tests do not pass ({baseline}): skipped", flush=True)
        return dict(module=module, total=total, baseline=baseline, mutants=[])
    try:
        for mutant in mutants:
            mutated = apply(source, mutant)
            mutant.diff = diff(source, mutated, f"trl_ext/{module}")
            target.write_text(mutated)
            began = time.monotonic()
            mutant.status = run_tests(copy_root, tests, args.timeout, out_dir / f"{name}.{mutant.index}.log",
                                      args.spawn)
            mutant.seconds = round(time.monotonic() - began, 1)
            print(f"[{module}] #{mutant.index} line {mutant.line} {mutant.kind}: {mutant.status} "
                  f"({mutant.seconds} s)", flush=True)
            if mutant.status == "killed":
                (out_dir / f"{name}.{mutant.index}.log").unlink()
    finally:
        target.write_text(source)
    return dict(module=module, total=total, baseline=baseline, mutants=[asdict(m) for m in mutants])


def write_report(results: list[dict], out_dir: Path) -> Path:
    lines = ["# Mutation run", "", "| module | mutants (of) | killed | timeout | survived | error |",
             "|---|---|---|---|---|---|"]
    for r in results:
        count = {s: sum(m["status"] == s for m in r["mutants"]) for s in ("killed", "timeout", "survived", "error")}
        lines.append(f"| trl_ext/{r['module']} | {len(r['mutants'])} ({r['total']}) | {count['killed']} | "
                     f"{count['timeout']} | {count['survived']} | {count['error']} |")
    for r in results:
        survivors = [m for m in r["mutants"] if m["status"] in ("survived", "error")]
        if survivors:
            lines += ["", f"## Survivors in trl_ext/{r['module']}", ""]
            for m in survivors:
                lines += [f"- #{m['index']} line {m['line']} ({m['kind']}, {m['status']}):", "", "```diff", m["diff"],
                          "```", ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out_dir / "report.json").write_text(json.dumps(results, indent=1))
    return path


def copy_tree(dest: Path) -> Path:
    """The package, its tests and pyproject.toml (what pytest needs) copied to ``dest``, without caches."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    for part in ("trl_ext", "tests", "recipes"):
        shutil.copytree(ROOT / part, dest / part, ignore=ignore, symlinks=True)
    shutil.copy2(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", action="append", choices=sorted(MODULES),
                        help="a module under trl_ext/ (repeatable; default: all)")
    parser.add_argument("--max-mutants", type=int, default=80, help="sample this many per module (0: all)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample")
    parser.add_argument("--timeout", type=float, default=90, help="seconds per mutant before it counts as timeout")
    parser.add_argument("--out", type=Path, default=ROOT / "outputs" / "mutation", help="report folder")
    parser.add_argument("--only", type=int, action="append", help="run only these mutant indices (one module)")
    parser.add_argument("--tests", nargs="+", help="run these test files or node ids instead of the module's")
    parser.add_argument("--list", action="store_true", help="print the mutants and exit")
    parser.add_argument("--spawn", action="store_true", help="a fresh interpreter per mutant instead of a fork")
    args = parser.parse_args(argv)
    modules = args.module or list(MODULES)
    if args.list:
        for module in modules:
            source = (ROOT / "trl_ext" / module).read_text()
            for m in generate(source):
                print(f"{module} #{m.index} line {m.line} {m.kind}\n{diff(source, apply(source, m), module)}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill`: still remove the temporary copy
    if not args.spawn:
        _preimport()
    results = []
    with tempfile.TemporaryDirectory(prefix="trl-ext-mutants-") as tmp:
        copy_root = copy_tree(Path(tmp))
        for module in modules:
            result = mutate_module(module, copy_root, args, args.out)
            results.append(result)
            (args.out / f"{module.replace('/', '_').removesuffix('.py')}.json").write_text(json.dumps(result, indent=1))
    print(f"report: {write_report(results, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
