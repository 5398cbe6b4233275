"""The checker of the verifiable addition task (recipes/verifiable): parse a completion's answer, score exact match.

A prompt of the task is ``"4 7 + 3 5 ="`` (two numbers 0..99, one token per digit, zero-padded to two digits) and its
``answer`` column the sum as a plain number, ``"82"``. The model answers with the sum's digits separated by spaces,
``"8 2"``, then the end-of-sequence token.

:func:`exact_match_reward` follows TRL's reward-function contract (``GRPOTrainer(reward_funcs=...)``, and
``trl_ext.PPOTrainer(reward_funcs=...)``): it takes ``completions`` and the dataset's ``answer`` column, one value
per completion, ignores every other keyword (``prompts``, ``completion_ids``, ``trainer_state``, ...) and returns
one float per completion: 1.0 when the completion's answer equals the reference, else 0.0; ``None`` ("not
applicable") only where the reference itself is not a number.
"""

from __future__ import annotations

import re

# The answer: the digits at the start of the completion, spaces between them allowed. Whatever follows the first
# character that is neither a digit nor a space (an end-of-sequence token left in the text, "=", a word) is ignored.
_LEADING_DIGITS = re.compile(r"\s*(\d[\d ]*)")


def _text(completion) -> str:
    """A completion as text: a string, or a conversational completion (a list of messages: the last one's content)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"a completion must be text or a list of messages, got {type(completion).__name__}")


def parse_answer(completion) -> int | None:
    """The number a completion answers, or None when it starts with no digit.

    The leading digits, spaces between them allowed, read as one number; anything after them (``</s>``, ``=``, more
    words) is trailing junk and ignored. A digit after the junk does not count: ``"8 2 = 8 2"`` answers 82.

    >>> parse_answer(" 8 2"), parse_answer("8 2</s>"), parse_answer("1 0 9 + 1"), parse_answer("= 8 2")
    (82, 82, 109, None)
    """
    match = _LEADING_DIGITS.match(_text(completion))
    return None if match is None else int(match.group(1).replace(" ", ""))


def reference_answer(answer) -> int | None:
    """The dataset's ``answer`` value as a number (``82``, ``"82"`` or ``"8 2"``), None when it is not one."""
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer
    text = str(answer).replace(" ", "").strip()
    return int(text) if text.isdigit() else None


def exact_match_reward(completions, answer, **kwargs) -> list[float | None]:
    """1.0 where a completion's answer (:func:`parse_answer`) equals the row's ``answer`` as a number, else 0.0 (no
    answer at all scores 0.0); None where the reference answer is not a number. TRL's reward-function contract:
    ``completions`` and ``answer`` have one value per completion; other keywords are ignored."""
    if len(completions) != len(answer):
        raise ValueError(f"exact_match_reward: {len(completions)} completions but {len(answer)} answers")
    out: list[float | None] = []
    for completion, ref in zip(completions, answer):
        expected = reference_answer(ref)
        out.append(None if expected is None else float(parse_answer(completion) == expected))
    return out
