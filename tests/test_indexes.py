"""Indexes that cannot drift: a package's ``__init__`` docstring, and a docs section whose code is a package's
``__init__.py``, lists none of the package's modules (and sub-packages) or every one of them. A module is listed when
the text names it as ``name.py``, ``name/`` (a sub-package), ``:mod:`.name``` or ``package.name`` in backticks."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = sorted(path.parent for path in (ROOT / "trl_ext").rglob("__init__.py"))


def entries(package: Path) -> set[str]:
    """The package's modules (``__init__`` and ``__main__`` aside) and sub-packages."""
    modules = {p.stem for p in package.glob("*.py") if p.stem not in ("__init__", "__main__")}
    return modules | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def listed(text: str, package: Path) -> set[str]:
    dotted = ".".join(package.relative_to(ROOT).parts)
    found = set()
    for name in entries(package):
        forms = [rf"(?<![\w./]){name}\.py\b", rf"(?<![\w./-]){name}/", rf":mod:`~?\.{name}`",
                 rf"`~?{re.escape(dotted)}\.{name}`"]
        if any(re.search(form, text) for form in forms):
            found.add(name)
    return found


def docs_sections():
    """(docs file, heading, text, package) of each docs section whose ``Code:`` line names a package's
    ``__init__.py``."""
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for section in re.split(r"^## ", doc.read_text(), flags=re.M)[1:]:
            match = re.search(r"^Code: `(trl_ext/[\w/]*)__init__\.py`", section, re.M)
            if match:
                yield doc.name, section.splitlines()[0], section, ROOT / match.group(1)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_package_docstring_lists_no_module_or_all(package):
    docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    names = listed(docstring, package)
    assert not names or names == entries(package), f"not listed: {sorted(entries(package) - names)}"


@pytest.mark.parametrize("doc, heading, text, package", list(docs_sections()),
                         ids=lambda v: v if isinstance(v, str) and "\n" not in v else "")
def test_docs_section_of_a_package_lists_no_module_or_all(doc, heading, text, package):
    names = listed(text, package)
    assert not names or names == entries(package), f"{doc} '{heading}': not listed: {sorted(entries(package) - names)}"


def test_the_checks_see_a_list_and_a_gap():
    """The rule's own check: a docstring naming two of three modules is a partial list; one naming all is whole."""
    package = ROOT / "trl_ext" / "ppo" / "base"
    assert listed("``base_trainer.py`` and :mod:`.base_config`", package) == {"base_trainer", "base_config"}
    assert listed("``base_trainer.py``, ``base_config.py``, ``parent_fixes.py``", package) == entries(package)
    assert listed("docs/ppo-internals.md#what-the-ppo-extends", package) == set()
