"""Shelve trl_ext/ppo/ by role and rename the recipe loader package (issue 30, step C), as one mechanical change.

    python tools/shelve_ppo.py            # from the repository root: git mv, rewrite imports, extend the old paths
    python tools/shelve_ppo.py --dry-run  # print the moves only

Idempotent: a file already at its new place is skipped, imports already pointing to new places are left alone, so
it can be re-run after merging branches that still use the old layout (then run it again and commit). What it does:

1. ``git mv`` each file of :data:`MOVES` (``ppo/rollout.py`` first, so that ``ppo/rollout/`` can become a package);
   writes the new packages' ``__init__.py`` when missing;
2. rewrites every relative import in ``trl_ext/`` (resolved from the file's old place to its new one) and every
   dotted (``trl_ext.ppo.rollout_engine.X``) or path (``trl_ext/ppo/rollout_engine.py``) mention of a moved module in
   ``trl_ext/``, ``tests/``, ``benchmarks/``, ``docs/``, ``recipes/``, ``README.md`` and ``tools/`` (not the parity
   tests, which keep importing the old paths, and not a line with the word "formerly", which names them on purpose);
3. adds each old module path to ``trl_ext/_moved_modules.py``'s ``MOVED`` (so user code and pickles keep importing)
   and points its existing entries at the new places;
4. the demo task's checker leaves the library: ``trl_ext/rewards/arithmetic_task.py`` becomes
   ``recipes/verifiable/arithmetic_task.py`` (its recipes name it ``arithmetic_task.py:exact_match_reward``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# old path -> new path (repository-relative). Order matters: ppo/rollout.py leaves before ppo/rollout/ is created.
MOVES = {
    "trl_ext/ppo/rollout.py": "trl_ext/ppo/rollout/containers.py",
    "trl_ext/ppo/rollout_chunk.py": "trl_ext/ppo/rollout/chunk.py",
    "trl_ext/ppo/rollout_engine.py": "trl_ext/ppo/rollout/engine.py",
    "trl_ext/ppo/rollout_logprobs.py": "trl_ext/ppo/rollout/logprobs.py",
    "trl_ext/ppo/rollout_steps.py": "trl_ext/ppo/rollout/steps.py",
    "trl_ext/ppo/memory_budget.py": "trl_ext/ppo/rollout/memory_budget.py",
    "trl_ext/ppo/allocator_margin.py": "trl_ext/ppo/rollout/allocator_margin.py",
    "trl_ext/ppo/sequences.py": "trl_ext/ppo/rollout/sequences.py",
    "trl_ext/ppo/prompt_stream.py": "trl_ext/ppo/rollout/prompt_stream.py",
    "trl_ext/ppo/dynamic_sampling.py": "trl_ext/ppo/rollout/dynamic_sampling.py",
    "trl_ext/ppo/reward_funcs.py": "trl_ext/ppo/rollout/reward_funcs.py",
    "trl_ext/ppo/objectives.py": "trl_ext/ppo/objective/objectives.py",
    "trl_ext/ppo/losses.py": "trl_ext/ppo/objective/losses.py",
    "trl_ext/ppo/advantages.py": "trl_ext/ppo/objective/advantages.py",
    "trl_ext/ppo/critic_free.py": "trl_ext/ppo/objective/critic_free.py",
    "trl_ext/ppo/kl_controllers.py": "trl_ext/ppo/objective/kl_controllers.py",
    "trl_ext/ppo/masked_stats.py": "trl_ext/ppo/objective/masked_stats.py",
}
PACKAGE_RENAMES = {"trl_ext/recipes": "trl_ext/recipe_loader"}  # the loader package: not a second `recipes`
OUT_OF_LIBRARY = {"trl_ext/rewards/arithmetic_task.py": "recipes/verifiable/arithmetic_task.py"}

NEW_PACKAGES = {
    "trl_ext/ppo/rollout/__init__.py": '''"""PPO's rollout: sampling the responses and what scoring them needs, one module per part.

* ``containers.py``: ``Rollout`` (one update's episodes, filled by the steps), ``MicroBatchOutput``,
  ``UpdateStats``: what the steps pass along.
* ``steps.py``: the trainer's sampling and scoring steps (``generate_rollouts``, ``score_rollouts``,
  ``compute_ref_logprobs``, ``compute_values``, ``compute_scores``), mixed into ``PPOTrainer``.
* ``logprobs.py``: the sampled tokens' log-probs taken while ``generate`` samples them; the reference pass's logits.
* ``engine.py``: ``rollout_engine``: transformers' continuous batching as the sampler.
* ``chunk.py``: ``local_rollout_forward_batch_size: auto``, the largest chunk whose memory budget fits.
* ``memory_budget.py``: the bytes each part of a PPO run holds, from the model's shape and the settings.
* ``allocator_margin.py``: what CUDA's caching allocator reserves beyond the allocated peak, planned with the budget.
* ``sequences.py``: truncation at the stop token, padded forward passes, ``first_true_indices``.
* ``prompt_stream.py``: the endless, resumable prompt stream.
* ``dynamic_sampling.py``: DAPO's dynamic sampling (``DynamicSampling``): more rounds, informative groups only.
* ``reward_funcs.py``: reward functions in the rollout (``RewardFunctionScoring``), the trainer's side of
  :mod:`trl_ext.rewards`.
"""

from .containers import MicroBatchOutput, Rollout, UpdateStats

__all__ = ["MicroBatchOutput", "Rollout", "UpdateStats"]
''',
    "trl_ext/ppo/objective/__init__.py": '''"""PPO's objective: the math of the update, pure functions and small classes, each with its source.

* ``objectives.py``: the policy objectives (loss aggregation, asymmetric/dual/two-sided clipping, GSPO, CISPO,
  entropy, KL estimators) and ``ObjectiveConfig``.
* ``losses.py``: the value loss (three clip modes), the ptx LM loss, the loss result types.
* ``advantages.py``: GAE, and the critic-free RLOO, GRPO/Dr. GRPO, REINFORCE++/-baseline.
* ``critic_free.py``: ``CriticFree`` (a critic-free estimator in the trainer), ``NoValueModel``, prompt groups.
* ``kl_controllers.py``: fixed, adaptive and doubling KL coefficients.
* ``masked_stats.py``: masked mean, variance and whitening.
"""
''',
}

TEXT_DIRS = ("trl_ext", "tests", "benchmarks", "docs", "recipes", "tools")
TEXT_FILES = ("README.md",)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".cfg", ".sh"}
SKIP_TEXT = {"tools/shelve_ppo.py", "trl_ext/_moved_modules.py"}
KEEP_MARKER = "formerly"  # a line with this word names old paths on purpose: left as it is
# The parity tests stay byte for byte as they are: they import the old paths, through trl_ext/_moved_modules.py.
PARITY_FILES = {"tests/ppo/test_ppo_trainer.py", "tests/ppo/test_ppo_base.py",
                "tests/ppo/test_objectives_trl_parity.py", "tests/ppo/test_v0_1_checkpoint.py",
                "tests/ppo/v0_1_checkpoint.py", "tests/ppo_reference.py"}


def git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)


def module_of(path: str) -> str:
    """``trl_ext/ppo/rollout.py`` -> ``trl_ext.ppo.rollout``; a package's ``__init__.py`` -> the package."""
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_map() -> dict[str, str]:
    """Old dotted module -> new dotted module, for every moved file and renamed package."""
    out = {module_of(old): module_of(new) for old, new in MOVES.items()}
    for old, new in PACKAGE_RENAMES.items():
        out[old.replace("/", ".")] = new.replace("/", ".")
    return out


def new_submodules() -> dict[str, set]:
    """New package -> the names of its submodules (a dotted mention ``pkg.sub`` of one is already new)."""
    subs: dict[str, set] = {}
    for new in MOVES.values():
        mod = module_of(new)
        pkg, _, name = mod.rpartition(".")
        subs.setdefault(pkg, set()).add(name)
    return subs


def map_module(name: str, mapping: dict[str, str], packages: set) -> str:
    """The new name of module ``name`` (exact match for files; prefix match for renamed packages)."""
    if name in mapping:
        return mapping[name]
    for old in packages:
        if name.startswith(old + "."):
            return mapping[old] + name[len(old):]
    return name


def move_files(dry: bool) -> dict[str, str]:
    """git mv everything; returns old file path -> new file path of every .py under trl_ext that moved."""
    moved: dict[str, str] = {}
    for old, new in {**MOVES, **OUT_OF_LIBRARY}.items():
        if (ROOT / old).exists() and not (ROOT / new).exists():
            print(f"git mv {old} {new}")
            if not dry:
                (ROOT / new).parent.mkdir(parents=True, exist_ok=True)
                git("mv", old, new)
        elif (ROOT / old).exists():
            print(f"CONFLICT: {old} and {new} both exist (a merge kept the old file); merge it into {new} by hand")
        moved[old] = new
    for old, new in PACKAGE_RENAMES.items():
        if (ROOT / old).is_dir() and not any((ROOT / new).rglob("*.py")):
            print(f"git mv {old} {new}")
            if not dry:
                git("mv", old, new)
        elif (ROOT / old).is_dir():  # a merged branch added files under the old name: each joins the new package
            for path in sorted(p for p in (ROOT / old).rglob("*") if p.is_file() and "__pycache__" not in p.parts):
                rel = path.relative_to(ROOT).as_posix()
                target = new + rel[len(old):]
                if (ROOT / target).exists():
                    print(f"CONFLICT: {rel} and {target} both exist; merge them by hand")
                    continue
                print(f"git mv {rel} {target}")
                if not dry:
                    (ROOT / target).parent.mkdir(parents=True, exist_ok=True)
                    git("mv", rel, target)
        for path in (ROOT / new).rglob("*.py") if (ROOT / new).exists() else []:
            rel = path.relative_to(ROOT).as_posix()
            moved[old + rel[len(new):]] = rel
    for path, text in NEW_PACKAGES.items():
        if not (ROOT / path).exists():
            print(f"write {path}")
            if not dry:
                (ROOT / path).write_text(text)
                git("add", path)
    return moved


RELATIVE = re.compile(r"^(\s*from\s+)(\.+)([\w.]*)(\s+import\s+)", re.M)


def exists(module: str) -> bool:
    path = ROOT / module.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def resolve(package: str, dots: str, target: str) -> str:
    base = package.split(".")
    base = base[: len(base) - (len(dots) - 1)]
    return ".".join(base + ([target] if target else []))


def relative(from_package: str, module: str) -> str:
    here, there = from_package.split("."), module.split(".")
    common = 0
    while common < min(len(here), len(there)) and here[common] == there[common]:
        common += 1
    return "." * (len(here) - common + 1) + ".".join(there[common:])


def rewrite_relative_imports(moved: dict[str, str], mapping: dict[str, str], packages: set) -> None:
    """Every ``from .x import y`` of trl_ext/ that does not name an existing module from where its file is now is
    read from the file's old place and pointed at the new layout (so a file merged in with old-style imports, at its
    new place or its old one, is fixed, and one already fixed is left alone)."""
    old_of = {new: old for old, new in moved.items()}
    for path in sorted((ROOT / "trl_ext").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        is_package = path.name == "__init__.py"
        old_module, new_module = module_of(old_of.get(rel, rel)), module_of(rel)
        old_pkg = old_module if is_package else old_module.rpartition(".")[0]
        new_pkg = new_module if is_package else new_module.rpartition(".")[0]
        text = path.read_text()

        def fix(m, old_pkg=old_pkg, new_pkg=new_pkg):
            dots, target = m.group(2), m.group(3)
            if exists(resolve(new_pkg, dots, target)):
                return m.group(0)
            new_abs = map_module(resolve(old_pkg, dots, target), mapping, packages)
            return f"{m.group(1)}{relative(new_pkg, new_abs)}{m.group(4)}"

        new_text = RELATIVE.sub(fix, text)
        if new_text != text:
            path.write_text(new_text)


def dotted_pattern(old: str, new: str, subs: dict[str, set], is_package: bool) -> re.Pattern:
    """``old`` as a whole dotted name; not when it is already the new package followed by one of its submodules."""
    guard = ""
    if new.startswith(old + ".") or old in subs:
        names = subs.get(old, set()) | ({new[len(old) + 1:].split(".")[0]} if new.startswith(old + ".") else set())
        guard = r"(?!\.(?:" + "|".join(sorted(names)) + r")\b)"
    tail = r"(?![\w])" if not is_package else r"(?![\w])"
    return re.compile(r"(?<![\w.])" + re.escape(old) + tail + guard)


def rewrite_mentions(mapping: dict[str, str], packages: set) -> None:
    """Dotted and path mentions of moved modules in the text files of the repository."""
    subs = new_submodules()
    rules = []
    for old, new in sorted(mapping.items(), key=lambda kv: -len(kv[0])):
        rules.append((dotted_pattern(old, new, subs, old in packages), new))
        old_path, new_path = old.replace(".", "/"), new.replace(".", "/")
        if old in packages:
            rules.append((re.compile(r"(?<![\w/])" + re.escape(old_path) + r"(?![\w])"), new_path))
        else:
            rules.append((re.compile(r"(?<![\w/])" + re.escape(old_path) + r"\.py\b"), new_path + ".py"))
    for old, new in OUT_OF_LIBRARY.items():
        rules.append((re.compile(re.escape(module_of(old)) + r":"), Path(new).name + ":"))  # recipe entries
        rules.append((re.compile(r"from " + re.escape(module_of(old)) + r" import"), f"from {Path(new).stem} import"))
        rules.append((re.compile(r"(?:\.\./\.\./)?" + re.escape(old) + r"\b"), new))
        rules.append((re.compile(re.escape(module_of(old)) + r"(?![\w])"), Path(new).stem))
    files = [ROOT / f for f in TEXT_FILES if (ROOT / f).exists()]
    for d in TEXT_DIRS:
        files += [p for p in (ROOT / d).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        if rel in SKIP_TEXT or rel in PARITY_FILES or rel.startswith("tests/data/"):
            continue
        text = path.read_text()
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if KEEP_MARKER in line:  # prose that names an old path on purpose
                continue
            for pattern, repl in rules:
                line = pattern.sub(repl, line)
            lines[i] = line
        new_text = "\n".join(lines)
        if new_text != text:
            path.write_text(new_text)


def extend_moved_modules(mapping: dict[str, str], packages: set) -> None:
    """Old paths keep importing: point MOVED's entries at the new places and add every old path of this move."""
    path = ROOT / "trl_ext" / "_moved_modules.py"
    text = path.read_text()
    start, end = text.index("MOVED = {"), text.index("}\n", text.index("MOVED = {"))
    block = text[start:end]
    entries = dict(re.findall(r'"([\w.]+)": "([\w.]+)"', block))
    entries = {old: map_module(new, mapping, packages) for old, new in entries.items()}
    real = {module_of(p.relative_to(ROOT).as_posix()) for p in (ROOT / "trl_ext").rglob("*.py")}
    for old, new in mapping.items():
        if old not in real:  # an old file name that is now a package (ppo/rollout/) imports as that package
            entries.setdefault(old, new)
    entries = {old: new for old, new in entries.items() if old not in real}
    for pkg in packages:  # every module of a renamed package
        new_pkg = mapping[pkg]
        for py in (ROOT / new_pkg.replace(".", "/")).rglob("*.py"):
            mod = module_of(py.relative_to(ROOT).as_posix())
            if mod != new_pkg:
                entries.setdefault(pkg + mod[len(new_pkg):], mod)
    lines = ["MOVED = {"] + [f'    "{old}": "{new}",' for old, new in sorted(entries.items())]
    text = text[:start] + "\n".join(lines) + "\n" + text[end:]
    path.write_text(text)


def main(argv: list[str]) -> int:
    dry = "--dry-run" in argv
    mapping = module_map()
    packages = {old.replace("/", ".") for old in PACKAGE_RENAMES}
    moved = move_files(dry)
    if dry:
        return 0
    rewrite_relative_imports(moved, mapping, packages)
    rewrite_mentions(mapping, packages)
    extend_moved_modules(mapping, packages)
    print("done: review `git diff`, run the tests, commit")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
