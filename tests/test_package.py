"""The package installs, exports its trainers as subclasses of TRL's, and its CLI answers."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import trl_ext
from trl_ext._moved_modules import MOVED

ROOT = Path(__file__).resolve().parents[1]


def run_cli(*args, **kwargs):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "trl_ext", *args], capture_output=True, text=True, env=env, cwd=ROOT, **kwargs
    )


def test_exports_are_subclasses_of_trl():
    import trl
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    assert issubclass(trl_ext.PPOTrainer, PPOTrainer) and trl_ext.PPOTrainer is not PPOTrainer
    assert issubclass(trl_ext.PPOConfig, PPOConfig) and trl_ext.PPOConfig is not PPOConfig
    assert issubclass(trl_ext.RewardTrainer, trl.RewardTrainer) and trl_ext.RewardTrainer is not trl.RewardTrainer
    assert issubclass(trl_ext.RewardConfig, trl.RewardConfig) and trl_ext.RewardConfig is not trl.RewardConfig
    assert issubclass(trl_ext.DPOTrainer, trl.DPOTrainer) and trl_ext.DPOTrainer is not trl.DPOTrainer
    assert issubclass(trl_ext.DPOConfig, trl.DPOConfig) and trl_ext.DPOConfig is not trl.DPOConfig


def test_unknown_attribute():
    with pytest.raises(AttributeError, match="NoSuchThing"):
        trl_ext.NoSuchThing  # noqa: B018


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_module_paths_import_the_moved_module(old):
    """trl-ext 0.1.0's flat paths (pickled in old checkpoints, imported by user code) give the moved module itself."""
    import importlib

    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__spec__.name == MOVED[old] == module.__name__


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


DOCS = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
GENERATED = ("benchmarks/results/", "outputs/")  # written by runs, git-ignored


def _code_spans(path):
    import re

    return [word for span in re.findall(r"`([^`\n]+)`", path.read_text()) for word in span.split()]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_paths_and_modules_exist(doc):
    """Every repository path and every `trl_ext.x.y` name that the README and the benchmarks README quote resolves."""
    import importlib
    import re
    import warnings

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
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # 0.1.0 paths, quoted on purpose
                for cut in range(len(parts), 0, -1):
                    try:
                        obj = importlib.import_module(".".join(parts[:cut]))
                        break
                    except ModuleNotFoundError:
                        continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            checked += 1
    assert checked >= 5  # the docs do quote paths and modules
