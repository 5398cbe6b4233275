"""tools/mutate.py (the mutation-testing script, docs/mutation-testing.md): which mutants it plants in a small source,
that each is valid Python differing from the source in one place, and that listing them leaves the tree alone."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = '''def f(a, b, x):
    """Docstring 1."""
    if a < b and not a:
        return a + 1
    n = x.shape[-1] * x.shape[0]
    raise ValueError(f"bad {a + b}")
'''


def load_tool():
    spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / "tools" / "mutate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_mutants_of_a_small_source():
    tool = load_tool()
    mutants = tool.generate(SOURCE)
    assert [(m.line, m.kind, m.replacement) for m in mutants] == [
        (3, "compare-boundary", "(a <= b)"), (3, "compare-negate", "(a >= b)"), (3, "boolop", "(a < b or not a)"),
        (3, "unary-drop", "(a)"), (4, "return-none", "return None"), (4, "binop", "(a - 1)"), (4, "constant", "2"),
        (5, "binop", "(x.shape[-1] / x.shape[0])"), (5, "shape-index", "0"), (5, "shape-index", "(-1)"),
    ]  # nothing in the docstring or the raise
    for mutant in mutants:
        mutated = tool.apply(SOURCE, mutant)
        assert ast.dump(ast.parse(mutated)) != ast.dump(ast.parse(SOURCE))
        assert len(tool.diff(SOURCE, mutated, "f.py").splitlines()) >= 2


def test_listing_the_mutants_of_a_module_changes_no_file():
    target = ROOT / "trl_ext" / "ppo" / "objective" / "kl_controllers.py"
    before = target.read_bytes()
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "mutate.py"), "--list", "--module",
                          "ppo/objective/kl_controllers.py"], capture_output=True, text=True, check=True).stdout
    assert out.count("ppo/objective/kl_controllers.py #") == len(load_tool().generate(before.decode()))
    assert target.read_bytes() == before
