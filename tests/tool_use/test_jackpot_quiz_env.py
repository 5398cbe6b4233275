"""The jackpot quiz (recipes/tool_use/jackpot_quiz_env.py), the luck environment the dice-quiz study never tuned on.

What must hold: the screens are the dice quiz's; each episode draws its own numbers from Python's random (the row
only gives how many), never one of the held-out quizzes; a round pays 1/rounds if right plus the die's jackpot luck
(face 4: 2 * luck, the others -luck / 2: mean 0, variance luck ** 2), whatever the answer."""

from __future__ import annotations

import random
import statistics

from recipe_modules import recipe_module

dice_quiz_env = recipe_module("tool_use", "dice_quiz_env")
jackpot_quiz_env = recipe_module("tool_use", "jackpot_quiz_env")


def test_numbers_are_drawn_per_episode_and_rounds_pay_the_jackpot():
    env = jackpot_quiz_env.with_luck(1.0)()
    assert [c.__name__ for c in type(env).__mro__[:3]] == ["JackpotQuizEnv", "JackpotQuizEnv", "DiceQuizEnv"]
    random.seed(5)
    screen = env.reset(numbers=[0, 0, 0, 0], dice=[4, 0, 2, 4])
    rng = random.Random(5)
    drawn = [rng.randint(0, 8) for _ in range(4)]
    assert env.numbers == drawn and screen == f" Round 1: {drawn[0]}, die 4"
    rewards = []
    for k, answer in enumerate((drawn[0] + 1, drawn[1], drawn[2] + 1, drawn[3] + 1)):  # the second repeated: wrong
        assert env.answer(answer) == ("The quiz is over." if k == 3 else f"Round {k + 2}: {drawn[k + 1]}, die "
                                      f"{[4, 0, 2, 4][k + 1]}")
        rewards.append(env.get_turn_reward())
    assert rewards == [0.25 + 2.0, 0.0 - 0.5, 0.25 - 0.5, 0.25 + 2.0]
    assert [jackpot_quiz_env.with_luck(0.5)()._luck_paid(d) for d in range(5)] == [-0.25] * 4 + [1.0]


def test_the_tools_are_the_dice_quizs():
    """The same tool schema as the dice quiz (one ``answer``): the dice quiz's SFT model meets the prompt it learned."""
    from trl_ext.ppo.episodes.tool_rules import environment_methods

    jackpot = environment_methods(jackpot_quiz_env.JackpotQuizEnv())
    dice = environment_methods(dice_quiz_env.DiceQuizEnv())
    assert [t.__name__ for t in jackpot] == ["answer"] == [t.__name__ for t in dice]
    assert jackpot[0].__doc__ == dice[0].__doc__


def test_the_jackpot_has_mean_zero_and_twice_the_dice_quizs_variance():
    jackpot, dice = jackpot_quiz_env.with_luck(1.0)(), dice_quiz_env.with_luck(1.0)()
    faces = range(dice_quiz_env.FACES)
    assert statistics.fmean(jackpot._luck_paid(d) for d in faces) == 0.0 == statistics.fmean(
        dice._luck_paid(d) for d in faces)
    assert statistics.pvariance([jackpot._luck_paid(d) for d in faces]) == 1.0
    assert statistics.pvariance([dice._luck_paid(d) for d in faces]) == 0.5


def test_a_held_out_quiz_is_drawn_again():
    heldout = jackpot_quiz_env.heldout_quizzes(4)
    assert heldout == frozenset(dice_quiz_env.split(4)[1]) and len(heldout) == 200
    env, seen = jackpot_quiz_env.JackpotQuizEnv(), set()
    for seed in range(3000):
        random.seed(seed)
        env.reset(numbers=[0] * 4)
        seen.add(tuple(env.numbers))
        assert tuple(env.numbers) not in heldout
    # 3000 draws from 6561 quizzes would meet ~90 of the 200 held-out ones: the redraw is what keeps them out
    assert len(seen) > 2000
