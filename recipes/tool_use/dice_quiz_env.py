"""The counting quiz with luck on screen: the case where a value model can pay.

Each round shows a number to answer, as in quiz_env.py (right: the number after it), and a die from 0 to
:data:`FACES` - 1, drawn for each episode when its round is shown. When the round is answered the environment pays
``1 / rounds`` for a right answer plus ``luck * (die - 2) / 2``: luck that the state shows before the action and that
no action changes. A value model that reads the die takes it out of the round's advantage; the k samples of one quiz
(RLOO, GRPO) roll other dice, so their group mean cannot. ``luck`` 0 is the quiz without a prize. The control
``shown=False`` pays the luck of a second die that the screen never shows (the shown one is drawn as before and pays
nothing): the same text, the same luck, nothing for a value model to read.

:func:`with_luck` makes the environment class of one luck size (TRL's ``environment_factory``: a class, one instance
per episode). Rounds come from the row (``numbers``: 4 or 8 of them), so one SFT model plays both horizons.
"""

from __future__ import annotations

import random

import quiz_env
from quiz_env import FINAL, LARGE_FROM, OVER

FACES = 5
LUCK = 1.0  # the luck of the shipped recipes (gae_dice.yaml): where the value model pays (benchmarks README)
#: Positions of the dice quiz's model: the prompt with the tool schema (~240 tokens) + an 8-round quiz + room.
MAX_POSITIONS = 768
#: Completion tokens of a quiz of ``rounds`` rounds (each answer about 19 tokens, each result about 16, the final
#: message) + room.
RESPONSE_LENGTH = {4: 224, 8: 400}


def instruction(rounds: int) -> str:
    return f"A quiz of {rounds} rounds: answer each number with the number after it, with the answer tool."


def round_text(k: int, number: int, die: int) -> str:
    """What the environment shows for round ``k`` (1-based): the number to answer and the round's die."""
    return f"Round {k}: {number}, die {die}"


class DiceQuizEnv:
    """The quiz of the module docstring at luck :attr:`luck` (:func:`with_luck` for another)."""

    luck = LUCK
    luck_shown = True

    def __init__(self):
        self.numbers, self.dice, self.right, self.scored, self.fixed = [], [], [], 0, None
        self.hidden_dice: list[int] = []  # with luck_shown False: the dice that pay, one per round, never shown

    def reset(self, numbers=(0,) * 4, dice=None, **kwargs) -> str:
        """Start a quiz on the row's ``numbers`` and roll round 1's die (Python's ``random``, which ``trl-ext train``
        seeds from ``seed``; a row's ``dice`` column fixes them instead); the returned text is appended to the user
        message."""
        self.numbers, self.right, self.scored = [int(n) for n in numbers], [], 0
        self.fixed = None if dice is None else [int(d) for d in dice]
        self.dice, self.hidden_dice = [self._roll(0)], []
        return " " + round_text(1, self.numbers[0], self.dice[0])

    def _roll(self, k: int) -> int:
        return random.randrange(FACES) if self.fixed is None else self.fixed[k]

    def answer(self, number: int) -> str:
        """Answer the current round of the quiz.

        Args:
            number: The answer to the current round.

        Returns:
            The next round's number and die, or "The quiz is over." after the last round.
        """
        k = len(self.right)
        if k >= len(self.numbers):
            return OVER
        self.right.append(number == self.numbers[k] + 1)
        if not self.luck_shown:
            self.hidden_dice.append(random.randrange(FACES))
        if k + 1 == len(self.numbers):
            return OVER
        self.dice.append(self._roll(k + 1))
        return round_text(k + 2, self.numbers[k + 1], self.dice[k + 1])

    def get_turn_reward(self) -> float | None:
        """The round just answered: ``1 / rounds`` if right, plus its luck; None when the turn answered none."""
        if self.scored == len(self.right):
            return None
        k, self.scored = self.scored, len(self.right)
        die = self.dice[k] if self.luck_shown else self.hidden_dice[k]
        return (1.0 if self.right[k] else 0.0) / len(self.numbers) + self._luck_paid(die)

    def _luck_paid(self, die: int) -> float:
        """The luck a round pays whatever its answer: ``luck * (die - 2) / 2`` (mean 0 over the faces)."""
        return self.luck * (die - 2) / 2

    def get_reward(self) -> float:
        """Nothing at the end: every round was paid when it was answered."""
        return 0.0


def with_luck(luck: float, shown: bool = True, base: type | None = None) -> type:
    """The environment class ``base`` (default :class:`DiceQuizEnv`) at luck ``luck``, paid by the die on screen or
    (``shown=False``) by one never shown; named as ``base``, so its metrics keep one name."""
    base = base or DiceQuizEnv
    return type(base.__name__, (base,), {"luck": float(luck), "luck_shown": shown, "__module__": base.__module__})


def share_right(env: DiceQuizEnv) -> float:
    """The share of ``env``'s rounds answered right: the part of the reward the policy controls (its optimum 1)."""
    return sum(env.right) / len(env.numbers)


def row(numbers) -> dict:
    """A dataset row: ``prompt`` and ``numbers`` (passed to ``reset``)."""
    return {"prompt": [{"role": "user", "content": instruction(len(numbers))}], "numbers": list(numbers)}


def transcript(numbers, rng: random.Random) -> tuple[list[dict], list[dict], list[int]]:
    """(prompt as RL shows it after ``reset``, completion, dice) of one quiz of the careless player (quiz_env.py), the
    dice rolled from ``rng``."""
    env, dice = DiceQuizEnv(), [rng.randrange(FACES) for _ in numbers]
    prompt = [{"role": "user", "content": instruction(len(numbers)) + env.reset(numbers=numbers, dice=dice)}]
    return prompt, quiz_env.careless_completion(env, numbers, rng), dice


def split(rounds: int, seed: int = 0, train: int = 1000, heldout: int = 200) -> tuple[list[tuple], list[tuple]]:
    """Disjoint training and held-out quizzes of ``rounds`` numbers (quiz_env's split, its own draw per horizon)."""
    return quiz_env.split(seed * 1000 + rounds, train, heldout, rounds)


def sft_rows(quizzes, seed: int = 0) -> list[dict]:
    """The careless player's transcripts of ``quizzes`` (``prompt``, ``completion``, and the ``dice`` rolled)."""
    rng = random.Random(seed)
    return [dict(zip(("prompt", "completion", "dice"), transcript(q, rng))) for q in quizzes]


def environment_tools() -> list:
    """The tools RL offers in a quiz: ``answer``, bound to a :class:`DiceQuizEnv`, as the trainer takes it."""
    from trl_ext.ppo.episodes.tool_rules import environment_methods

    return environment_methods(DiceQuizEnv())


def write_base_model(directory, seed: int = 0):
    """The dice quiz's tokenizer (``build_tool_tokenizer`` with its sentences) and a random tiny Llama (hidden 64, 2
    layers, :data:`MAX_POSITIONS` positions), saved to ``directory``."""
    from tool_task import write_base_model as write

    from trl_ext.testing.tools import build_tool_tokenizer

    lines = [instruction(4) + " " + round_text(1, 3, 4), instruction(8), round_text(2, 7, 0), OVER, FINAL,
             '{"name": "answer", "arguments": {"number": 3}}']
    return write(directory, seed=seed, tokenizer=build_tool_tokenizer(lines), max_positions=MAX_POSITIONS)


__all__ = ["DiceQuizEnv", "FACES", "LARGE_FROM", "with_luck", "share_right", "row", "split", "sft_rows"]
