"""The verifiable task: two-digit addition, checked by a program (no reward model).

* **Prompt**: ``"4 7 + 3 5 ="``: two numbers 0..99, zero-padded to two digits, one token per digit (6 tokens).
* **Answer** (the dataset's ``answer`` column): the sum as a plain number, ``"82"`` (0..198).
* **Completion** the model should write: the sum as three digits separated by spaces, ``" 0 8 2"``, then the
  end-of-sequence token: 3 digits + eos, so RL's ``response_length`` is 5 (room for one token of junk). Three digits
  always, so that each digit has one position whatever the sum.
* **Checker**: :func:`arithmetic_task.exact_match_reward` (1.0 when the completion's leading digits
  read as the right number, else 0.0), :func:`~arithmetic_task.parse_answer`.

There are 10,000 problems. :func:`split` shuffles them with a seed and cuts a held-out set (500) and a training set
(4,000) that share no problem.

**The SFT data comes from a careless demonstrator** (:func:`demonstrator_total`): it adds correctly, except that on
the problems whose units digits carry (``4 7 + 3 5``: 7 + 5 >= 10, 45 % of all problems) it forgets the carry into
the tens on 70 % of them (``0 7 2`` instead of ``0 8 2``; :data:`CARRY_RATE` = 0.3 carry). The ``answer`` column is
always the true sum. A tiny Llama (hidden 64, 2 layers) trained on that to the end of its learning-rate schedule
imitates it: right on every sum without a units carry, and greedy picks the forgotten carry where there is one, so
the warm start gets about 0.55-0.6 of the held-out sums right greedily whatever the seed, and samples the right
carry about a fifth of the time, which is what RL with the exact-match reward then learns to prefer.

The tokenizer is word-level over the digits, ``+`` and ``=`` (``trl_ext.testing.word_level_tokenizer``, as the gold
task's; ``trl_ext.testing``'s BPE tokenizer knows digits only as words): ``tokenizer(prompt + completion)`` equals
``tokenizer(prompt) + tokenizer(completion)``.
"""

from __future__ import annotations

import random
from pathlib import Path

WORDS = tuple(str(d) for d in range(10)) + ("+", "=")
#: The longest answer (3 digits) + the end-of-sequence token + one token of room.
RESPONSE_LENGTH = 5
HELDOUT = 500
TRAIN = 4000
#: The share of the training problems with a units carry whose SFT completion carries (:func:`demonstrator_total`).
CARRY_RATE = 0.3


def make_prompt(a: int, b: int) -> str:
    """``(47, 35)`` -> ``"4 7 + 3 5 ="``."""
    if not (0 <= a <= 99 and 0 <= b <= 99):
        raise ValueError(f"operands must be in 0..99, got {a} and {b}")
    return f"{a // 10} {a % 10} + {b // 10} {b % 10} ="


def completion_text(total: int) -> str:
    """A sum as the model writes it after the prompt, three digits: ``82`` -> ``" 0 8 2"``."""
    if not 0 <= total <= 198:
        raise ValueError(f"a sum of two numbers 0..99 is in 0..198, got {total}")
    return " " + " ".join(f"{total:03d}")


def units_carry(a: int, b: int) -> bool:
    """True when the units digits of ``a`` and ``b`` sum to 10 or more (``47 + 35``: 7 + 5)."""
    return a % 10 + b % 10 >= 10


def demonstrator_total(a: int, b: int, carries: bool) -> int:
    """The careless demonstrator's sum: ``a + b``, or where the units carry and ``carries`` is False, the sum with
    that carry forgotten (``47 + 35`` -> 72: the tens digit misses its +1)."""
    if carries or not units_carry(a, b):
        return a + b
    return (a // 10 + b // 10) * 10 + (a % 10 + b % 10) % 10


def row(a: int, b: int, total: int | None = None) -> dict:
    """One problem as a dataset row: ``prompt``, ``answer`` (the true sum as a plain number) and the SFT
    ``completion`` (``total``'s digits; default the true sum)."""
    return {"prompt": make_prompt(a, b), "answer": str(a + b), "completion": completion_text(a + b if total is None
                                                                                               else total)}


def split(seed: int = 0, heldout: int = HELDOUT, train: int = TRAIN,
          carry_rate: float = CARRY_RATE) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): the 10,000 problems shuffled with ``seed``; the first ``heldout`` are held out,
    the next ``train`` are the training set. Disjoint by construction, deterministic given ``seed``. The training
    rows' completions are the careless demonstrator's (each units-carry problem carried with probability
    ``carry_rate``, drawn from the same seeded generator); the held-out rows' are the true sums."""
    if heldout + train > 10_000:
        raise ValueError(f"only 10000 problems: heldout {heldout} + train {train} is too many")
    problems = [(a, b) for a in range(100) for b in range(100)]
    rng = random.Random(seed)
    rng.shuffle(problems)
    train_rows = [row(a, b, demonstrator_total(a, b, rng.random() < carry_rate))
                  for a, b in problems[heldout:heldout + train]]
    return train_rows, [row(*p) for p in problems[:heldout]]


def build_tokenizer():
    """A word-level tokenizer over :data:`WORDS` (one token per digit/symbol) with pad/eos/bos/unk
    (:func:`trl_ext.testing.word_level_tokenizer`: decoded text keeps its spaces)."""
    from trl_ext.testing import word_level_tokenizer

    return word_level_tokenizer(WORDS, model_max_length=16)


def write_base_model(directory: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Save the tokenizer and a randomly initialised tiny Llama (~70k parameters) to ``directory``."""
    from trl_ext.testing import build_causal_lm

    directory = Path(directory)
    tokenizer = build_tokenizer()
    model = build_causal_lm(tokenizer, seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                            max_position_embeddings=16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
