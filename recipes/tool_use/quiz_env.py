"""The multi-turn case where credit across turns decides: a counting quiz whose every round is rewarded when answered.

An episode is :data:`ROUNDS` rounds. Each round the environment shows a number from 0 to :data:`HIGHEST` and the
model answers it with the ``answer`` tool; the right answer is the number after it (``n + 1``, one digit). The
environment shows the next round's number in the tool's result, and after the last round says the quiz is over; the
model then ends with a short message. At the end a prize of :data:`PRIZE` is drawn with chance :data:`PRIZE_CHANCE`,
whatever the answers were: the part of an episode's return that no action changes, as a user's mood or a dice roll
in a real environment. The share of rounds right is what the policy controls; its optimum is 1.0.

Two environments, the same game (TRL's ``environment_factory`` contract: one instance per episode, ``reset(**row)``
reads the row's ``numbers``, the public method ``answer`` is the tool):

* :class:`QuizEnv` scores the episode at the end only: ``get_reward()`` is the share of rounds right plus the prize.
* :class:`QuizTurnEnv` scores each round when it is answered: ``get_turn_reward()`` (trl-ext's addition to TRL's
  contract, docs/tools.md) gives ``1 / ROUNDS`` for a right answer and 0 for a wrong one, and ``get_reward()`` is
  the prize. A value model (GAE) sees each round's reward on the last token of the turn that answered it, and the
  prize after the final message; critic-free estimators (RLOO, GRPO) get the episode's sum, which is
  :class:`QuizEnv`'s end reward, so for them the two environments are one.

The SFT warm start imitates a careless player (:func:`careless_answer`): right on the small numbers (0 to
``LARGE_FROM - 1``); on the large ones it repeats the number shown :data:`REPEAT_RATE` of the time and answers right
otherwise. Its greedy policy answers the small rounds right and the large ones wrong; RL has to flip the large
numbers' answers, each from a few right samples, while four rounds and the prize share one critic-free score.
"""

from __future__ import annotations

import random

ROUNDS = 4
HIGHEST = 8
LARGE_FROM = 5
REPEAT_RATE = 0.7
PRIZE, PRIZE_CHANCE = 1.0, 0.5
INSTRUCTION = f"A quiz of {ROUNDS} rounds: answer each number with the number after it, with the answer tool."
FINAL = "Done."
OVER = "The quiz is over."


def round_text(k: int, number: int) -> str:
    """What the environment shows for round ``k`` (1-based)."""
    return f"Round {k}: {number}"


class QuizEnv:
    """The counting quiz (module docstring), scored at the end: ``get_reward()`` is the share of rounds right plus
    the prize draw."""

    def __init__(self):
        self.numbers, self.round, self.right, self.prize = [], 0, [], 0.0

    def reset(self, numbers=(0,) * ROUNDS, **kwargs) -> str:
        """Start a quiz on the row's ``numbers`` and draw its prize (Python's ``random``, which ``trl-ext train`` seeds
        from ``seed``); the returned text (round 1) is appended to the user message."""
        self.numbers, self.round, self.right = [int(n) for n in numbers], 0, []
        self.prize = PRIZE if random.random() < PRIZE_CHANCE else 0.0
        return " " + round_text(1, self.numbers[0])

    def answer(self, number: int) -> str:
        """Answer the current round of the quiz.

        Args:
            number: The answer to the current round.

        Returns:
            The next round's number, or "The quiz is over." after the last round.
        """
        if self.round >= len(self.numbers):
            return OVER
        self.right.append(number == self.numbers[self.round] + 1)
        self.round += 1
        if self.round == len(self.numbers):
            return OVER
        return round_text(self.round + 1, self.numbers[self.round])

    def get_reward(self) -> float:
        """The share of rounds right (:func:`share_right`), plus the prize."""
        return share_right(self) + self.prize


def share_right(env: QuizEnv) -> float:
    """The share of ``env``'s rounds answered right (0 for rounds never answered): the part of the reward the policy
    controls (a function, not a method: an environment's public methods are the model's tools)."""
    return sum(env.right) / len(env.numbers)


class QuizTurnEnv(QuizEnv):
    """The same quiz, each round scored when it is answered, the prize at the end (module docstring)."""

    def __init__(self):
        super().__init__()
        self.scored = 0

    def reset(self, numbers=(0,) * ROUNDS, **kwargs) -> str:
        self.scored = 0
        return super().reset(numbers, **kwargs)

    def get_turn_reward(self) -> float | None:
        """``1 / ROUNDS`` if the round the last turn answered was right, else 0; None when that turn answered none
        (a call after the quiz ended)."""
        if self.scored == len(self.right):
            return None
        self.scored = len(self.right)
        return (1.0 if self.right[-1] else 0.0) / len(self.numbers)

    def get_reward(self) -> float:
        """The prize alone: every round was scored when it was answered."""
        return self.prize


#: Positions of the quiz's model: the prompt with the tool schema (~230 tokens) + a whole quiz + room.
MAX_POSITIONS = 512
#: Completion tokens of a whole quiz (4 answers of 19 tokens, the environment's results, the final message: about
#: 195) + room.
RESPONSE_LENGTH = 224


def careless_answer(number: int, rng: random.Random) -> int:
    """The SFT player's answer: ``number + 1``, except on numbers >= :data:`LARGE_FROM`, where it repeats the number
    :data:`REPEAT_RATE` of the time."""
    if number >= LARGE_FROM and rng.random() < REPEAT_RATE:
        return number
    return number + 1


def prompt_messages() -> list[dict]:
    """The prompt of every quiz (``reset`` appends round 1)."""
    return [{"role": "user", "content": INSTRUCTION}]


def row(numbers) -> dict:
    """A dataset row: ``prompt`` and ``numbers`` (passed to ``reset``)."""
    return {"prompt": prompt_messages(), "numbers": list(numbers)}


def transcript(numbers, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(prompt as RL shows it after ``reset``, completion) of one quiz of the careless player."""
    env = QuizEnv()
    prompt = [{"role": "user", "content": INSTRUCTION + env.reset(numbers=numbers)}]
    return prompt, careless_completion(env, numbers, rng)


def careless_completion(env, numbers, rng: random.Random) -> list[dict]:
    """The careless player's turns in ``env`` (already reset on ``numbers``): each round's ``answer`` call and its
    result, then the final message."""
    completion = []
    for number in numbers:
        given = careless_answer(number, rng)
        completion += [{"role": "assistant", "content": "", "tool_calls": [
                           {"type": "function", "function": {"name": "answer", "arguments": {"number": given}}}]},
                       {"role": "tool", "name": "answer", "content": env.answer(given)}]
    return completion + [{"role": "assistant", "content": FINAL}]


def split(seed: int = 0, train: int = 1000, heldout: int = 200,
          rounds: int = ROUNDS) -> tuple[list[tuple], list[tuple]]:
    """Disjoint training and held-out quizzes: tuples of ``rounds`` numbers, uniform in 0..HIGHEST."""
    rng = random.Random(seed)
    seen, quizzes = set(), []
    while len(quizzes) < train + heldout:
        q = tuple(rng.randint(0, HIGHEST) for _ in range(rounds))
        if q not in seen:
            seen.add(q)
            quizzes.append(q)
    return quizzes[heldout:], quizzes[:heldout]


def sft_rows(quizzes, seed: int = 0) -> list[dict]:
    """The careless player's transcripts of ``quizzes`` (``prompt``, ``completion``)."""
    rng = random.Random(seed)
    return [dict(zip(("prompt", "completion"), transcript(q, rng))) for q in quizzes]


def environment_tools() -> list:
    """The tools RL offers in a quiz: ``answer``, bound to a :class:`QuizEnv`, as the trainer takes it."""
    from trl_ext.ppo.episodes.tool_rules import environment_methods

    return environment_methods(QuizEnv())


def write_base_model(directory, seed: int = 0):
    """The quiz's tokenizer (``build_tool_tokenizer`` with its sentences) and a random tiny Llama (hidden 64, 2
    layers, :data:`MAX_POSITIONS` positions), saved to ``directory``."""
    from tool_task import write_base_model as write

    from trl_ext.testing.tools import build_tool_tokenizer

    lines = [INSTRUCTION + " " + round_text(1, 3), round_text(2, 7), OVER, FINAL,
             '{"name": "answer", "arguments": {"number": 3}}']
    return write(directory, seed=seed, tokenizer=build_tool_tokenizer(lines), max_positions=MAX_POSITIONS)
