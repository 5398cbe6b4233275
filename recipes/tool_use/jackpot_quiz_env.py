"""The jackpot quiz: a luck environment the dice-quiz study never tuned on, where its recommended settings are tried.

The counting quiz of dice_quiz_env.py, on the same screens (the dice quiz's SFT model plays it), with two changes:

* each episode draws its own numbers (Python's ``random``; the row only says how many rounds), so the k samples of
  one prompt play different quizzes and a group's mean mixes their difficulty: luck on screen that RLOO's and GRPO's
  baselines meet as noise. A draw that is one of the held-out quizzes (``dice_quiz_env.split``, seed 0) is drawn again;
* the die pays a jackpot: face ``FACES - 1`` pays ``JACKPOT * luck``, every other face ``MISS * luck`` (mean 0 as the
  dice quiz's, variance ``luck ** 2``, twice its, and skewed).

Both are shown before the answer and no answer changes them. :func:`with_luck` makes the class of one luck size.
"""

from __future__ import annotations

import random
from functools import cache

import dice_quiz_env
from dice_quiz_env import FACES
from quiz_env import HIGHEST

JACKPOT, MISS = 2.0, -0.5  # (2 + 4 * -0.5) / 5 = 0


@cache
def heldout_quizzes(rounds: int) -> frozenset[tuple[int, ...]]:
    return frozenset(dice_quiz_env.split(rounds)[1])


class JackpotQuizEnv(dice_quiz_env.DiceQuizEnv):
    """The quiz of the module docstring at luck :attr:`luck`."""

    def reset(self, numbers=(0,) * 4, dice=None, **kwargs) -> str:
        """Draw ``len(numbers)`` numbers (the row's values are not used), then start the quiz on them."""
        drawn = tuple(random.randint(0, HIGHEST) for _ in numbers)
        while drawn in heldout_quizzes(len(drawn)):
            drawn = tuple(random.randint(0, HIGHEST) for _ in numbers)
        return super().reset(numbers=drawn, dice=dice, **kwargs)

    def _luck_paid(self, die: int) -> float:
        return self.luck * (JACKPOT if die == FACES - 1 else MISS)


def with_luck(luck: float, shown: bool = True) -> type:
    """The jackpot quiz of luck ``luck`` (``shown=False``: paid by a die never shown, as dice_quiz_env's control)."""
    return dice_quiz_env.with_luck(luck, shown, base=JackpotQuizEnv)


__all__ = ["JackpotQuizEnv", "JACKPOT", "MISS", "with_luck"]
