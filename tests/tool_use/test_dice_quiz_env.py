"""The quiz with a die on screen (recipes/tool_use/dice_quiz_env.py), the case where a value model can pay: its rules,
its luck, its data, and its per-turn rewards as trl_ext.PPOTrainer's rollout places them.

What must hold: each round shows its die with its number, before the answer; answering pays 1/rounds if right plus
luck * (die - 2) / 2, the die's part whatever the answer; the dice are rolled per episode (Python's random) unless a
row fixes them; luck 0 is the quiz without a prize; training and held-out quizzes are disjoint, 4 and 8 rounds; an SFT
quiz replayed through the trainer's rollout gives the SFT row's tokens with each round's reward on its turn's end."""

from __future__ import annotations

import json
import random

import episode_replay
import pytest
from recipe_modules import recipe_module

dice_quiz_env = recipe_module("tool_use", "dice_quiz_env")


def read(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def test_rules_and_rewards():
    env = dice_quiz_env.with_luck(1.0)()
    assert type(env).__name__ == "DiceQuizEnv" and env.luck == 1.0
    assert env.reset(numbers=[3, 7, 9, 0], dice=[4, 0, 2, 1], prompt="ignored") == " Round 1: 3, die 4"
    results, rewards = [], []
    for answer in (4, 7, 10, 1, 5):  # right, repeated (wrong), right, right, one call too many
        results.append(env.answer(answer))
        rewards.append(env.get_turn_reward())
    assert results == ["Round 2: 7, die 0", "Round 3: 9, die 2", "Round 4: 0, die 1", "The quiz is over.",
                       "The quiz is over."]
    # 0.25 per right round, plus luck * (die - 2) / 2: +1, -1, 0, -0.5
    assert rewards == [0.25 + 1.0, 0.0 - 1.0, 0.25 + 0.0, 0.25 - 0.5, None]
    assert env.get_reward() == 0.0 and dice_quiz_env.share_right(env) == 0.75
    (tool,) = dice_quiz_env.environment_tools()
    assert tool.__name__ == "answer" and isinstance(tool.__self__, dice_quiz_env.DiceQuizEnv)


def test_the_control_pays_a_die_never_shown():
    """``shown=False``: the same screens, and each answered round paid the luck of a die drawn at the answer (Python's
    random), whatever die the screen showed."""
    def play(shown_dice):
        random.seed(3)
        env = dice_quiz_env.with_luck(1.0, shown=False)()
        screens = [env.reset(numbers=[3, 7, 9, 0], dice=shown_dice)]
        rewards = []
        for answer in (4, 7, 10, 1):
            screens.append(env.answer(answer))
            rewards.append(env.get_turn_reward())
        return screens, rewards, env.hidden_dice

    screens, rewards, hidden = play([4, 0, 2, 1])
    assert screens[:2] == [" Round 1: 3, die 4", "Round 2: 7, die 0"]
    rng = random.Random(3)
    assert hidden == [rng.randrange(dice_quiz_env.FACES) for _ in range(4)]
    assert rewards == [right + (die - 2) / 2 for right, die in zip((0.25, 0.0, 0.25, 0.25), hidden)]
    assert play([0, 4, 4, 0])[1] == rewards  # other dice on screen: the same pay
    assert dice_quiz_env.with_luck(1.0)().luck_shown and hidden != [4, 0, 2, 1]


def test_without_luck_the_rewards_are_the_rounds_right():
    env = dice_quiz_env.with_luck(0.0)()
    random.seed(0)
    env.reset(numbers=[1, 6, 2, 8, 0, 5, 3, 3])
    total = 0.0
    for n in (2, 6, 3, 9, 1, 5, 4, 4):
        env.answer(n)
        total += env.get_turn_reward()
    assert total == dice_quiz_env.share_right(env) == 6 / 8


def test_dice_are_rolled_per_episode_whatever_the_answers():
    """Python's random rolls each round's die as the round is shown: the same seed gives the same dice to any
    answers; the dice are uniform on 0..4."""
    def dice(seed, answers):
        random.seed(seed)
        env = dice_quiz_env.DiceQuizEnv()
        env.reset(numbers=[0, 1, 2, 3])
        for a in answers:
            env.answer(a)
        return env.dice

    assert dice(5, [1, 2, 3, 4]) == dice(5, [0, 0, 0, 0]) != dice(6, [1, 2, 3, 4])
    random.seed(0)
    rolls = [d for _ in range(500) for d in dice(random.randrange(10**9), [1, 2, 3, 4])]
    assert set(rolls) == set(range(dice_quiz_env.FACES))
    assert sum(rolls) / len(rolls) == pytest.approx(2.0, abs=0.1)  # the luck's mean is 0


@pytest.fixture(scope="module")
def dice_data(tmp_path_factory):
    work = tmp_path_factory.mktemp("dice")
    recipe_module("tool_use", "make_data").write_dice_quiz(work, train=6)
    return work


def test_data_files(dice_data):
    sft = read(dice_data / "data" / "dice_sft.jsonl")
    assert len(sft) == 12
    assert all(len(r["input_ids"]) == len(r["completion_mask"]) <= dice_quiz_env.MAX_POSITIONS for r in sft)
    for rounds in (4, 8):
        rl, heldout = (read(dice_data / "data" / f"dice_{part}{rounds}.jsonl") for part in ("train", "heldout"))
        assert len(rl) == 6 and len(heldout) == 200
        assert all(len(r["numbers"]) == rounds and "dice" not in r for r in rl)  # RL rolls the dice per episode
        assert rl[0]["prompt"] == [{"role": "user", "content": dice_quiz_env.instruction(rounds)}]
        assert not {tuple(r["numbers"]) for r in rl} & {tuple(r["numbers"]) for r in heldout}


@pytest.mark.parametrize("rounds", [4, 8])
def test_sft_quiz_is_the_rl_episode_with_each_round_paid_on_its_turn(dice_data, rounds):
    """SFT quizzes replayed by the trainer's rollout with their dice: the same tokens, the action mask equal to
    completion_mask; each round's reward on the <|im_end|> closing its answer turn: 1/rounds if right plus its
    luck (the default luck, LUCK)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dice_data / "dice_base")
    make_data = recipe_module("tool_use", "make_data")
    quizzes = dice_quiz_env.sft_rows(dice_quiz_env.split(rounds, seed=0, train=6, heldout=200)[0], seed=rounds)
    sft = {tuple(r["input_ids"]): r for r in read(dice_data / "data" / "dice_sft.jsonl")}
    for rl_row, quiz in zip(read(dice_data / "data" / f"dice_train{rounds}.jsonl"), quizzes):
        row = make_data.episode_sft_row(tok, quiz["prompt"], quiz["completion"], dice_quiz_env.environment_tools())
        example = sft[tuple(row["input_ids"])]  # the SFT file holds this quiz
        rollout, episode, env = episode_replay.replay(
            tok, example, dice_quiz_env.DiceQuizEnv, rl_row["prompt"], {"numbers": rl_row["numbers"],
                                                                         "dice": quiz["dice"]},
            max_tool_calling_iterations=rounds, response_length=dice_quiz_env.RESPONSE_LENGTH[rounds])
        assert rollout.prompt_ids[0] + episode.ids == example["input_ids"]
        assert [0] * len(episode.prompt_ids) + [int(a) for a in episode.action] == example["completion_mask"]
        assert episode.messages == quiz["completion"] and episode.turns == rounds + 1
        ends = [j for j in range(len(episode.ids) - 1) if episode.action[j] and not episode.action[j + 1]]
        assert [p for p, _ in episode.turn_rewards] == ends and len(ends) == rounds
        given = [m["tool_calls"][0]["function"]["arguments"]["number"] for m in quiz["completion"] if "tool_calls" in m]
        expected = [(g == n + 1) / rounds + dice_quiz_env.LUCK * (d - 2) / 2
                    for g, n, d in zip(given, rl_row["numbers"], quiz["dice"])]
        assert [r for _, r in episode.turn_rewards] == pytest.approx(expected)
