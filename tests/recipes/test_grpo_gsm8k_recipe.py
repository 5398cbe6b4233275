"""recipes/qwen2.5-0.5b/grpo_gsm8k.yaml: `trl-ext check` with local stand-ins for its data (GSM8K rows converted by
its make_gsm8k.py), offline, with math_verify (the `dev` extra) for its accuracy reward; its format reward; and the
one line `check` gives where accuracy_reward cannot run (math_verify hidden)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from trl_ext.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "qwen2.5-0.5b" / "grpo_gsm8k.yaml"
GSM8K_ROWS = [  # GSM8K's own format: reasoning, then `#### answer`
    {"question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
                 "How many clips did Natalia sell altogether in April and May?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"},
    {"question": "A shop sells 1,200 pens a day. How many pens does it sell in 3 days?",
     "answer": "1,200 * 3 = 3,600\n#### 3,600"},
]


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"gsm8k_test_{name}", RECIPE.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def standin_data(tmp_path):
    """The folder make_gsm8k.py writes, with two converted GSM8K rows per split."""
    make = load_script("make_gsm8k")
    rows = [make.to_row(r) for r in GSM8K_ROWS]
    assert [r["solution"] for r in rows] == ["72", "3600"]
    assert rows[0]["prompt"][0]["role"] == "system" and rows[0]["prompt"][1]["content"].startswith("Natalia")
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    for split in ("train", "test"):
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def check(capsys, tmp_path, data, *overrides):
    rc = main(["check", str(RECIPE), "--dataset_name", str(data), "--output_dir", str(tmp_path / "out"),
               *overrides])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert not any("Traceback" in line for line in err)
    return rc, captured.out, err[-1] if err else ""


def without_math_verify(monkeypatch):
    """This process as on a machine without math_verify (the `dev` extra installs it)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("math_verify", "latex2sympy2_extended") else real(name, *a))


def test_recipe_passes_check_with_local_standins(standin_data, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc, out, err = check(capsys, tmp_path, standin_data)
    assert rc == 0, err
    assert "# reward functions: accuracy_reward, boxed_format_reward" in out
    assert "(ppo recipe, PPOConfig)" in out
    assert not (tmp_path / "out").exists()
    # the converted solution is what accuracy_reward compares a boxed answer with
    from trl.rewards import accuracy_reward

    answers = ["so \\boxed{3600}.", "\\boxed{3,600}", "3600", "\\boxed{72}"]
    assert accuracy_reward([[{"role": "assistant", "content": a}] for a in answers], ["3600"] * 4) == [
        1.0, 1.0, 0.0, 0.0]


def test_check_says_in_one_line_that_accuracy_reward_cannot_run_without_math_verify(standin_data, tmp_path, capsys,
                                                                                     monkeypatch):
    monkeypatch.chdir(ROOT)
    without_math_verify(monkeypatch)
    rc, out, err = check(capsys, tmp_path, standin_data)
    assert rc == 2 and err == (
        "trl-ext: error: recipe: key 'reward_funcs' entry 1 'trl.rewards:accuracy_reward': cannot run here: it "
        "needs the math_verify and latex2sympy2_extended packages, not installed "
        "(pip install \"math-verify[antlr4_13_2]\")")


def test_a_dataset_without_solution_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("trl_ext.rewards.resolve.REQUIREMENTS", {})
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"}) + "\n")
    rc, _, err = check(capsys, tmp_path, data, "--dataset_test_split", "train")
    assert rc == 2 and err.startswith(
        "trl-ext: error: recipe: key 'reward_funcs' entry 1 'trl.rewards:accuracy_reward': function 'accuracy_reward' "
        "needs 'solution', which is neither an argument the trainer passes nor a column of the dataset (the "
        "dataset's columns: prompt, answer)"), err


def test_format_reward():
    rewards = load_script("gsm8k_rewards")
    completions = [[{"role": "assistant", "content": c}] for c in (
        "48 + 24 = 72, so \\boxed{72}.", "\\boxed{7} or \\boxed{72}", "it is 72", "\\boxed{72} because 48 + 24")]
    assert rewards.boxed_format_reward(completions=completions) == [1.0, 0.5, 0.0, 0.5]
    sys.modules.pop("gsm8k_test_gsm8k_rewards", None)
