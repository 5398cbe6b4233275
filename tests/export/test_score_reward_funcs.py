"""`trl-ext score --reward-funcs`: a sample file scored by reward functions (the recipe's entry forms), with or
without a reward model; the functions are called as the PPO trainer calls them."""

import json

import pytest

from trl_ext.cli import main

REWARDS_PY = '''
def exact(completions, answer, **kwargs):
    return [None if a is None else float(c.strip() == a) for c, a in zip(completions, answer)]
'''
ROWS = [
    {"prompt": "2+2=", "completion": " 4", "answer": "4"},
    {"prompt": "3+3=", "completion": " 7", "answer": "6"},
    {"prompt": "1+1=", "completion": " 2", "answer": "2"},
    {"prompt": "say hi", "completion": " hi", "answer": None},
]


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "checks.py").write_text(REWARDS_PY)
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return path


OVERLONG = json.dumps({"name": "trl.rewards.get_soft_overlong_punishment",
                       "kwargs": {"max_completion_len": 2, "soft_punish_cache": 1}})


def overlong_by_hand(tokenizer_dir) -> list[float]:
    """DAPO's soft overlong punishment of ROWS' completions (max 2 tokens, cache 1): 0 up to 1 token, -1 beyond 2,
    linear in between."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    lengths = [len(tok(r["completion"], add_special_tokens=False)["input_ids"]) for r in ROWS]
    assert len(set(lengths)) > 1  # the rows differ in length: the values below differ
    return [0.0 if n <= 1 else -1.0 if n > 2 else -(n - 1) / 1 for n in lengths]


def test_reward_functions_score_a_sample_file(data, tmp_path, capsys, tiny_models):
    rc = main(["score", "--data", str(data), "--reward-funcs", "checks.py:exact", OVERLONG,
               "--tokenizer", str(tiny_models.tokenizer), "--out", str(tmp_path / "scored.jsonl")])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"{data}: exact: mean 0.6667 over 3 rows (1 None)" in out  # 2 of the 3 answered rows are right
    expected = overlong_by_hand(tiny_models.tokenizer)
    scored = [json.loads(line) for line in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert [r["rewards"]["exact"] for r in scored] == [1.0, 0.0, 1.0, None]
    assert [r["rewards"]["soft_overlong_punishment_reward"] for r in scored] == expected
    assert f"soft_overlong_punishment_reward: mean {sum(expected) / 4:.4f} over 4 rows (0 None)" in out


def test_with_a_reward_model_too(data, capsys, tiny_models, tmp_path):
    """Functions and a model at once: the model's scores are those of the model alone (within 1e-5) and each
    function's values are its own, row by row; the printed mean score is the written scores' mean."""
    rc = main(["score", str(tiny_models.reward), "--data", str(data), "--out", str(tmp_path / "model.jsonl")])
    assert rc == 0
    capsys.readouterr()
    rc = main(["score", str(tiny_models.reward), "--data", str(data), "--reward-funcs", "checks.py:exact", OVERLONG,
               "--out", str(tmp_path / "both.jsonl")])
    out = capsys.readouterr().out
    assert rc == 0
    alone, both = ([json.loads(line) for line in (tmp_path / name).read_text().splitlines()]
                   for name in ("model.jsonl", "both.jsonl"))
    assert [r["completion"] for r in both] == [r["completion"] for r in ROWS]
    assert len({round(r["score"], 4) for r in alone}) > 1  # the rows score differently: a shuffle would show
    for row_alone, row_both in zip(alone, both):
        assert row_both["score"] == pytest.approx(row_alone["score"], abs=1e-5)
    assert [r["rewards"]["exact"] for r in both] == [1.0, 0.0, 1.0, None]
    expected = overlong_by_hand(tiny_models.reward)  # no --tokenizer: the reward model's
    assert [r["rewards"]["soft_overlong_punishment_reward"] for r in both] == expected
    mean = sum(r["score"] for r in both) / 4
    assert f"4 rows, mean score {mean:.4f}" in out and "exact: mean 0.6667 over 3 rows (1 None)" in out


@pytest.mark.parametrize("argv, expected", [
    (["--reward-funcs", "checks.py:nope"], "--reward-funcs entry 1 'checks.py:nope': file 'checks.py' has no "
     "function 'nope'"),
    (["--reward-funcs", "trl.rewards:accuracy_reward"], None),  # needs a `solution` column (or math_verify)
    ([], "score: give a reward model (REWARD_DIR), --reward-funcs, or both"),
])
def test_problems_are_one_line(data, capsys, argv, expected):
    rc = main(["score", "--data", str(data), *argv])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "Traceback" not in err
    if expected is None:
        assert "'trl.rewards:accuracy_reward'" in err and ("math_verify" in err or "needs 'solution'" in err), err
    else:
        assert err == f"trl-ext: error: {expected}", err
