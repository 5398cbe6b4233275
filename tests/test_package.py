"""The package installs, exports its trainers as subclasses of TRL's, and its CLI answers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trl_ext

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "trl_ext", *args], capture_output=True, text=True, env=env, cwd=ROOT, **kwargs
    )


def test_exports_are_subclasses_of_their_parents():
    """PPO: TRL's experimental.ppo classes where the installed TRL ships them (1.10-1.12), trl-ext's own base from
    TRL 1.13 on (or when TRL_EXT_PPO_BASE=trl-ext asks for it). Reward and DPO: always TRL's."""
    import trl

    from trl_ext.ppo import base
    from trl_ext.ppo.base.base_config import PPOBaseConfig
    from trl_ext.ppo.base.base_trainer import PPOBaseTrainer

    forced = os.environ.get(base.PPO_BASE_VARIABLE, "auto") == "trl-ext"
    if base.TRL_HAS_PPO and not forced:
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        assert base.PPO_BASE == "trl"
    else:
        PPOConfig, PPOTrainer = PPOBaseConfig, PPOBaseTrainer
        assert base.PPO_BASE == "trl-ext"
    assert (base.ParentPPOTrainer, base.ParentPPOConfig) == (PPOTrainer, PPOConfig)
    assert issubclass(trl_ext.PPOTrainer, PPOTrainer) and trl_ext.PPOTrainer is not PPOTrainer
    assert issubclass(trl_ext.PPOConfig, PPOConfig) and trl_ext.PPOConfig is not PPOConfig
    assert issubclass(trl_ext.RewardTrainer, trl.RewardTrainer) and trl_ext.RewardTrainer is not trl.RewardTrainer
    assert issubclass(trl_ext.RewardConfig, trl.RewardConfig) and trl_ext.RewardConfig is not trl.RewardConfig
    assert issubclass(trl_ext.DPOTrainer, trl.DPOTrainer) and trl_ext.DPOTrainer is not trl.DPOTrainer
    assert issubclass(trl_ext.DPOConfig, trl.DPOConfig) and trl_ext.DPOConfig is not trl.DPOConfig


def test_trl_requirement_admits_every_release_from_1_10_to_the_next_major():
    """Installing trl-ext never moves a TRL from 1.10 on (no upper bound below 2.0), and the installed TRL fits."""
    import re
    from importlib.metadata import version

    from packaging.requirements import Requirement

    dependencies = re.findall(r'^\s*"(trl\s*[<>=!~][^"]*)",', (ROOT / "pyproject.toml").read_text(), re.M)
    (trl,) = [Requirement(r) for r in dependencies]
    for release in ("1.10.0", "1.11.0", "1.12.0", "1.13.0", "1.14.2", "1.15.0", "1.16.0", "1.99.0"):
        assert trl.specifier.contains(release), release
    for release in ("1.9.2", "2.0.0"):
        assert not trl.specifier.contains(release), release
    assert trl.specifier.contains(version("trl"))


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        trl_ext.NoSuchThing  # noqa: B018


def test_cli_version_and_help():
    out = run_cli("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"trl-ext {trl_ext.__version__}"
    out = run_cli("--help")
    assert out.returncode == 0
    assert "train" in out.stdout and "check" in out.stdout


def test_tiny_models_are_deterministic(tiny_models, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from trl_ext.testing import build_tiny_models

    again = build_tiny_models(tmp_path / "again")
    for cls, a, b in (
        (AutoModelForCausalLM, tiny_models.policy, again.policy),
        (AutoModelForSequenceClassification, tiny_models.reward, again.reward),
    ):
        sa, sb = cls.from_pretrained(a).state_dict(), cls.from_pretrained(b).state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    reward = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    assert reward.config.num_labels == 1 and reward.score.out_features == 1


def test_tiny_tokenizer_roundtrip_and_chat_template(tokenizer):
    text = "the cat is very happy"
    assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == "<|user|>hello</s><|assistant|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id


DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md", ROOT / "tests" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]
GENERATED = ("benchmarks/results/", "outputs/")  # written by runs, git-ignored


def _code_spans(path):
    import re

    return [word for span in re.findall(r"`([^`\n]+)`", path.read_text()) for word in span.split()]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_paths_and_modules_exist(doc):
    """Every repository path and every `trl_ext.x.y` name that the README and the benchmarks README quote resolves."""
    import importlib
    import re

    checked = 0
    for word in _code_spans(doc):
        word = word.strip("(),;:")
        if re.fullmatch(r"(trl_ext|tests|benchmarks|recipes)/[\w./{},-]*", word) and not word.startswith(GENERATED):
            head, _, rest = word.partition("{")
            names, _, tail = rest.partition("}")
            for path in [head + name + tail for name in names.split(",")] if rest else [word]:
                assert (ROOT / path).exists(), f"{doc.name} names {path}, which does not exist"
                checked += 1
        elif re.fullmatch(r"trl_ext(\.\w+)+", word):
            parts = word.split(".")
            for cut in range(len(parts), 0, -1):
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                    break
                except ModuleNotFoundError:
                    continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            checked += 1
    if doc.name == "README.md":
        assert checked >= 5  # the docs do quote paths and modules


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve(doc):
    """Every relative markdown link of the README, the benchmarks README and docs/ points at an existing file (and, with
    an anchor, at a heading of it)."""
    import re

    def anchors(path):
        return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", path.read_text(), re.M)}

    for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (doc.parent / path).resolve() if path else doc
        assert resolved.exists(), f"{doc.name} links to {target}, which does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{doc.name} links to {target}: no such heading"


def test_models_do_not_depend_on_the_trainer_packages():
    """trl_ext.models loads models for every trainer: it imports none of them (PPO's helpers it shares live in
    trl_ext.models.positions, which trl_ext.ppo.rollout.sequences re-exports with the other sequence helpers)."""
    import ast

    for path in sorted((ROOT / "trl_ext" / "models").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                assert not module.startswith(("..ppo", "..preference", "..sft", "..recipes", "..recipe_loader", "trl_ext.ppo")), (
                    f"{path.name} imports {module}")
    from trl_ext.models.positions import first_true_indices
    from trl_ext.ppo.rollout.sequences import first_true_indices as reexported

    assert reexported is first_true_indices


def test_the_longest_first_modules_exist():
    """tests/conftest.py's LONGEST_FIRST (the modules the two xdist workers start with) names test files that exist:
    a renamed one would silently fall back to the end of the order."""
    import ast

    tree = ast.parse((ROOT / "tests" / "conftest.py").read_text())  # by path: tests/export has a conftest too
    (LONGEST_FIRST,) = [ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                        and [getattr(t, "id", None) for t in node.targets] == ["LONGEST_FIRST"]]
    assert LONGEST_FIRST and all((ROOT / path).is_file() for path in LONGEST_FIRST)
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
