"""The verifiable addition task's checker (recipes/verifiable/arithmetic_task.py) against hand cases, and its data
generator (recipes/verifiable/addition_task.py): right answers, disjoint deterministic splits, tokenization."""

from __future__ import annotations

import pytest
from recipe_modules import recipe_module

_checker = recipe_module("verifiable", "arithmetic_task")  # the demo task's checker lives with its recipes
exact_match_reward, parse_answer, reference_answer = (
    _checker.exact_match_reward, _checker.parse_answer, _checker.reference_answer)


@pytest.mark.parametrize(("completion", "expected"), [
    (" 8 2", 82),             # what SFT teaches: digits separated by spaces, leading space
    ("8 2", 82),
    ("82", 82),               # written as one number
    ("1 0 5", 105),
    ("0", 0),
    ("0 7", 7),               # a leading zero: the number is what counts
    ("8 2</s>", 82),          # decoded without skip_special_tokens: eos is trailing junk
    ("8 2 </s><pad><pad>", 82),
    ("8 2 = 8 2", 82),        # junk after the answer, digits after the junk ignored
    ("8 2 +", 82),
    ("  8 2\n", 82),
    ("", None),
    ("   ", None),
    ("</s>", None),
    ("= 8 2", None),          # junk first: no answer
    ("+ 1", None),
])
def test_parse_answer(completion, expected):
    assert parse_answer(completion) == expected


def test_parse_answer_of_a_conversational_completion():
    assert parse_answer([{"role": "assistant", "content": " 1 4 2"}]) == 142
    with pytest.raises(TypeError, match="text or a list of messages"):
        parse_answer(42)


def test_reference_answer():
    assert [reference_answer(a) for a in ("82", "8 2", 82, " 105 ", "x", "", True, "-3")] == \
        [82, 82, 82, 105, None, None, None, None]


def test_exact_match_reward_on_hand_cases():
    completions = [" 8 2", " 8 3", "8 2</s>", "", " 1 0 5 = junk", " 6 3", "0 9"]
    answers = ["82", "82", "82", "82", "105", "not a number", "9"]
    assert exact_match_reward(completions=completions, answer=answers, prompts=["p"] * 7, trainer_state=None) == \
        [1.0, 0.0, 1.0, 0.0, 1.0, None, 1.0]


def test_exact_match_reward_refuses_mismatched_columns():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        exact_match_reward(completions=["1", "2"], answer=["1"])


@pytest.fixture(scope="module")
def task():
    return recipe_module("verifiable", "addition_task")


def operands(row: dict) -> tuple[int, int]:
    """``"4 7 + 3 5 ="`` -> ``(47, 35)``: a row's two numbers, read back from its prompt."""
    a, b = row["prompt"].replace(" ", "").rstrip("=").split("+")
    return int(a), int(b)


def test_split_is_disjoint_deterministic_and_right(task):
    train, heldout = task.split(seed=0)
    assert (len(train), len(heldout)) == (4000, 500)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in heldout}
    assert len({r["prompt"] for r in train}) == 4000
    assert task.split(seed=0) == (train, heldout)
    assert task.split(seed=1)[1] != heldout
    for r in train + heldout:
        a, b = operands(r)
        assert int(r["answer"]) == a + b
        assert len(r["completion"].split()) == 3  # three digits always
        if r in heldout or not task.units_carry(a, b):
            assert exact_match_reward([r["completion"]], [r["answer"]]) == [1.0]
    assert task.row(47, 35) == {"prompt": "4 7 + 3 5 =", "answer": "82", "completion": " 0 8 2"}
    assert task.row(3, 4) == {"prompt": "0 3 + 0 4 =", "answer": "7", "completion": " 0 0 7"}
    assert task.row(99, 99)["completion"] == " 1 9 8"


def test_the_careless_demonstrator_forgets_the_units_carry(task):
    assert [task.units_carry(*p) for p in [(47, 35), (45, 35), (40, 52), (9, 1)]] == [True, True, False, True]
    assert task.demonstrator_total(47, 35, carries=False) == 72  # 4+3 tens, (7+5) % 10 units
    assert task.demonstrator_total(47, 35, carries=True) == 82
    assert task.demonstrator_total(95, 7, carries=False) == 92
    assert task.demonstrator_total(40, 52, carries=False) == 92  # no carry to forget
    train, _ = task.split(seed=0)
    carry_rows = [r for r in train if task.units_carry(*operands(r))]
    carried = sum(exact_match_reward([r["completion"]], [r["answer"]])[0] for r in carry_rows) / len(carry_rows)
    assert 1700 < len(carry_rows) < 1900  # 45 % of 4000
    assert abs(carried - task.CARRY_RATE) < 0.03  # binomial sd over ~1800 rows: 0.011
    assert task.split(seed=0, carry_rate=1.0)[0] == [task.row(*operands(r)) for r in train]


def test_tokenizer_one_token_per_digit_and_concatenation(task):
    tok = task.build_tokenizer()
    prompt, completion = "4 7 + 3 5 =", " 1 0 5"
    ids = tok(prompt)["input_ids"]
    assert len(ids) == 6 and tok.unk_token_id not in ids
    assert tok(prompt + completion)["input_ids"] == ids + tok(completion)["input_ids"]
    assert len(tok(completion)["input_ids"]) == 3
    decoded = tok.decode(tok(completion)["input_ids"] + [tok.eos_token_id], skip_special_tokens=True)
    assert parse_answer(decoded) == 105
    assert len(task.row(99, 99)["completion"].split()) + 1 <= task.RESPONSE_LENGTH  # room for eos
