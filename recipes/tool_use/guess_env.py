"""The multi-turn environment case of the tool-use task: a number-guessing game scored at the end.

TRL's ``environment_factory`` contract (``GRPOTrainer(environment_factory=GuessEnv)``, and
``trl_ext.PPOTrainer(environment_factory=...)``, recipe key ``environment_factory: guess_env.py:GuessEnv``): one
instance per rollout; ``reset(**row)`` gets the dataset row (its ``secret`` column) and returns text appended to the
user message; the public method ``guess`` is the tool the model calls (its schema comes from the type hints and the
docstring); ``get_reward()`` scores the finished episode from the environment's state (an extra reward source).

The secret is a number from 1 to :data:`HIGH`; each guess is answered ``"higher"``, ``"lower"`` or ``"correct"``.
The reward is 1.0 for finding it with the first guess, 0.1 less for every further guess, and 0.0 when the episode
ends without finding it (``max_tool_calling_iterations`` = :data:`MAX_GUESSES`). A binary search needs at most 4
guesses for 8 numbers, 2.6 on average (mean reward 0.84); a player that guesses uniformly among the numbers the
answers so far allow needs 3.1 on average and more than 4 in 16 % of the games (mean reward 0.70 under the cap).

The SFT warm start (``sft_guess.yaml``) imitates that uniform player on games that end within the cap
(:func:`transcript`, :func:`sft_rows`; make_data.py tokenizes them as RL's episodes, the environment's answers out of
the loss); RL (``grpo_guess.yaml``: GRPO with ``environment_factory: guess_env.py:GuessEnv``) then plays for the
reward; evaluate.py ``--game`` measures both (README, "The environment case").
"""

from __future__ import annotations

import random

HIGH = 8
MAX_GUESSES = 4
INSTRUCTION = f"I picked a number from 1 to {HIGH}. Find it with the guess tool."


class GuessEnv:
    """A guessing game (module docstring); ``GuessEnv()`` is the factory TRL calls, one instance per rollout."""

    def __init__(self):
        self.secret, self.guesses, self.found = None, 0, False

    def reset(self, secret: int = 1, **kwargs) -> str:
        """Start a game with the row's ``secret``; the returned text is appended to the user message."""
        self.secret, self.guesses, self.found = int(secret), 0, False
        return f" You have {MAX_GUESSES} guesses."

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The number to guess.

        Returns:
            "higher" if the secret is higher, "lower" if it is lower, "correct" if it is the number.
        """
        if self.found:
            return "correct"
        self.guesses += 1
        if number == self.secret:
            self.found = True
            return "correct"
        return "higher" if self.secret > number else "lower"

    def get_reward(self) -> float:
        """1.0 for a first-guess find, 0.1 less per further guess; 0.0 when the secret was not found."""
        return max(0.0, 1.0 - 0.1 * (self.guesses - 1)) if self.found else 0.0


#: Positions of the game's model: the prompt with the tool schema (~255 tokens) + up to 4 guesses (~35 tokens each)
#: and the final answer + room.
MAX_POSITIONS = 512
#: Completion tokens of a whole game (4 guesses and their answers, the final message) + room.
RESPONSE_LENGTH = 176


def write_base_model(directory, seed: int = 0):
    """The game's tokenizer (``build_tool_tokenizer`` with its sentences) and a random tiny Llama (hidden 64, 2
    layers, :data:`MAX_POSITIONS` positions), saved to ``directory``."""
    from tool_task import write_base_model as write

    from trl_ext.testing.tools import build_tool_tokenizer

    lines = [INSTRUCTION + " You have 4 guesses.", "higher", "lower", "correct", "Found it: 5.",
             '{"name": "guess", "arguments": {"number": 3}}']
    return write(directory, seed=seed, tokenizer=build_tool_tokenizer(lines), max_positions=MAX_POSITIONS)


def prompt_messages() -> list[dict]:
    """The prompt of every game (``reset`` appends the number of guesses)."""
    return [{"role": "user", "content": INSTRUCTION}]


def row(secret: int) -> dict:
    """A dataset row: ``prompt`` and ``secret`` (passed to ``reset``)."""
    return {"prompt": prompt_messages(), "secret": secret}


def transcript(secret: int, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """(prompt as RL shows it after ``reset``, completion) of one game of the SFT player: each guess uniform among
    the numbers still possible, until correct, then ``"Found it: N."``."""
    env = GuessEnv()
    prompt = [{"role": "user", "content": INSTRUCTION + env.reset(secret=secret)}]
    low, high, completion = 1, HIGH, []
    while not env.found:
        number = rng.randint(low, high)
        answer = env.guess(number)
        completion += [{"role": "assistant", "content": "", "tool_calls": [
                           {"type": "function", "function": {"name": "guess", "arguments": {"number": number}}}]},
                       {"role": "tool", "name": "guess", "content": answer}]
        if answer == "higher":
            low = number + 1
        elif answer == "lower":
            high = number - 1
    completion.append({"role": "assistant", "content": f"Found it: {secret}."})
    return prompt, completion


def environment_tools() -> list:
    """The tools RL offers in a game: the public methods of a ``GuessEnv`` instance, as the trainer takes them from
    its environment (``guess``, bound); the chat template renders their schemas in the prompt."""
    from trl_ext.ppo.episodes.tool_rules import environment_methods

    return environment_methods(GuessEnv())


def sft_rows(n: int, seed: int = 0) -> list[dict]:
    """``n`` SFT games as messages (``prompt``, ``completion``), secrets uniform in 1..HIGH, games of more than
    :data:`MAX_GUESSES` guesses left out; make_data.py tokenizes them as RL's episodes."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < n:
        prompt, completion = transcript(rng.randint(1, HIGH), rng)
        if len(completion) <= 2 * MAX_GUESSES + 1:  # games within the cap only
            rows.append({"prompt": prompt, "completion": completion})
    return rows


def rl_rows(n: int, seed: int = 1) -> list[dict]:
    """``n`` RL rows with secrets uniform in 1..HIGH."""
    rng = random.Random(seed)
    return [row(rng.randint(1, HIGH)) for _ in range(n)]
