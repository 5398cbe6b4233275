"""How much of a package is prose: docstring lines and comment-only lines against all its lines.

    python tools/prose_share.py            # trl_ext/: the share, and the longest docstrings
    python tools/prose_share.py PATH --top 20

Docstrings are the string statements ``ast`` finds first in a module, class or function; a comment line holds
only a comment. Inline comments after code count as code. Blank lines count in the total.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
from pathlib import Path


def file_prose(path: Path) -> tuple[int, int, int, list[tuple[int, str]]]:
    """(lines, docstring lines, comment lines, [(docstring length, where)]) of one file."""
    text = path.read_text()
    lines = text.count("\n") + (not text.endswith("\n"))
    tree = ast.parse(text)
    doc_lines, docs = set(), []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                span = range(first.lineno, first.end_lineno + 1)
                doc_lines.update(span)
                docs.append((len(span), f"{path}:{first.lineno} {getattr(node, 'name', '<module>')}"))
    comments = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT and tok.line.strip().startswith("#"):
            comments.add(tok.start[0])
    return lines, len(doc_lines), len(comments - doc_lines), docs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", default=str(Path(__file__).resolve().parents[1] / "trl_ext"))
    p.add_argument("--top", type=int, default=10, help="list the N longest docstrings")
    a = p.parse_args(argv)
    total = doc = comment = 0
    docs = []
    for path in sorted(Path(a.path).rglob("*.py")):
        n, d, c, ds = file_prose(path)
        total, doc, comment, docs = total + n, doc + d, comment + c, docs + ds
    print(f"{total} lines: docstrings {doc} ({100 * doc / total:.1f} %), comments {comment} "
          f"({100 * comment / total:.1f} %), prose {100 * (doc + comment) / total:.1f} %")
    for length, where in sorted(docs, reverse=True)[:a.top]:
        print(f"  {length:4d}  {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
