"""The counting quiz (recipes/tool_use/quiz_env.py), the case where credit across turns decides: its rules, its
careless SFT player, its data, and its per-turn rewards as trl_ext.PPOTrainer's rollout places them.

What must hold: a round is right when answered with the number after it; ``QuizTurnEnv`` gives 1/4 per right round
when it is answered (None for a call after the end) and nothing at the end, so its per-turn rewards add up to
``QuizEnv``'s end reward; the careless player errs only on 5-9, by repeating the number; training and held-out
quizzes are disjoint; replaying an SFT quiz through the trainer's own rollout gives the SFT row's tokens, and each
round's reward sits on the last token (``<|im_end|>``) of the turn that answered it."""

from __future__ import annotations

import random

import episode_replay
import pytest
from recipe_modules import read_jsonl, recipe_module

quiz_env = recipe_module("tool_use", "quiz_env")


def test_quiz_rules_and_rewards():
    end, turn = quiz_env.QuizEnv(), quiz_env.QuizTurnEnv()
    random.seed(0)
    for env in (end, turn):
        assert env.reset(numbers=[3, 7, 9, 0], prompt="ignored") == " Round 1: 3"
    assert end.prize == turn.prize == 0.0  # random.seed(0)'s first two draws, 0.84 and 0.76: no prize
    results, rewards = [], []
    for answer in (4, 7, 10, 1, 5):  # right, repeated (wrong), right, right, one call too many
        results.append(end.answer(answer))
        turn.answer(answer)
        rewards.append(turn.get_turn_reward())
    assert results == ["Round 2: 7", "Round 3: 9", "Round 4: 0", "The quiz is over.", "The quiz is over."]
    assert rewards == [0.25, 0.0, 0.25, 0.25, None]
    assert end.get_reward() == 0.75 == sum(r for r in rewards if r is not None)  # critic-free: the same score
    assert turn.get_reward() == 0.0 and end.right == turn.right == [True, False, True, True]
    (tool,) = quiz_env.environment_tools()
    assert tool.__name__ == "answer" and isinstance(tool.__self__, quiz_env.QuizEnv)


def test_prize_is_drawn_once_per_quiz_whatever_the_answers():
    """Half the quizzes win the prize (0.5), drawn at reset from Python's random (the trainer seeds it): QuizEnv adds
    it to the share of rounds right at the end, QuizTurnEnv gives it as its only end reward."""
    random.seed(1)
    prizes = []
    for k in range(2000):
        end, turn = quiz_env.QuizEnv(), quiz_env.QuizTurnEnv()
        end.reset(numbers=[1, 2, 3, 4])
        turn.reset(numbers=[1, 2, 3, 4])
        for n in (2, 3, 0, 0):  # two rounds right
            end.answer(n)
            turn.answer(n)
        assert end.get_reward() == 0.5 + end.prize and turn.get_reward() == turn.prize
        prizes += [end.prize, turn.prize]
    assert set(prizes) == {0.0, quiz_env.PRIZE}
    assert prizes.count(quiz_env.PRIZE) / len(prizes) == pytest.approx(quiz_env.PRIZE_CHANCE, abs=0.03)


def test_careless_player_errs_only_on_large_numbers_by_repeating_them():
    rng = random.Random(0)
    answers = {n: [quiz_env.careless_answer(n, rng) for _ in range(2000)] for n in range(10)}
    for n, given in answers.items():
        if n < quiz_env.LARGE_FROM:
            assert set(given) == {n + 1}
        else:
            assert set(given) == {n, n + 1}
            assert given.count(n) / len(given) == pytest.approx(quiz_env.REPEAT_RATE, abs=0.03)


def test_data_files(tool_use_data):
    data = tool_use_data / "data"
    sft, rl = read_jsonl(data / "quiz_sft.jsonl"), read_jsonl(data / "quiz_train.jsonl")
    heldout = read_jsonl(data / "quiz_heldout.jsonl")
    assert len(sft) == len(rl) == 6 and len(heldout) == 200
    assert all(r["prompt"] == quiz_env.prompt_messages() and len(r["numbers"]) == quiz_env.ROUNDS for r in rl)
    assert not {tuple(r["numbers"]) for r in rl} & {tuple(r["numbers"]) for r in heldout}
    assert all(len(r["input_ids"]) == len(r["completion_mask"]) <= quiz_env.MAX_POSITIONS for r in sft)
    assert [tuple(r["numbers"]) for r in rl] == quiz_env.split(seed=0, train=6, heldout=200)[0]


def replay(tokenizer, example: dict, numbers: list[int]):
    """An SFT quiz played by trl_ext's multi-turn rollout with ``environment_factory=QuizTurnEnv``."""
    return episode_replay.replay(tokenizer, example, quiz_env.QuizTurnEnv, quiz_env.prompt_messages(),
                                 {"numbers": numbers}, max_tool_calling_iterations=quiz_env.ROUNDS,
                                 response_length=quiz_env.RESPONSE_LENGTH)


def test_sft_quiz_is_the_rl_episode_with_each_round_rewarded_on_its_turn(tool_use_data):
    """Each SFT quiz replayed by the trainer's rollout: the same tokens, the action mask equal to completion_mask;
    4 per-turn rewards, each on the <|im_end|> that closes an answer turn (the last action token before an
    environment result), 0.25 exactly where the careless player answered right."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_use_data / "quiz_base")
    quizzes = quiz_env.sft_rows(quiz_env.split(seed=0, train=6, heldout=200)[0], seed=0)
    for rl_row, quiz, example in zip(read_jsonl(tool_use_data / "data" / "quiz_train.jsonl"), quizzes,
                                     read_jsonl(tool_use_data / "data" / "quiz_sft.jsonl")):
        rollout, episode, env = replay(tok, example, rl_row["numbers"])
        assert rollout.prompt_ids[0] + episode.ids == example["input_ids"]
        assert [0] * len(episode.prompt_ids) + [int(a) for a in episode.action] == example["completion_mask"]
        assert episode.messages == quiz["completion"] and episode.turns == quiz_env.ROUNDS + 1
        ends = [j for j in range(len(episode.ids) - 1) if episode.action[j] and not episode.action[j + 1]]
        assert [p for p, _ in episode.turn_rewards] == ends and len(ends) == quiz_env.ROUNDS
        assert all(episode.ids[p] == tok.eos_token_id for p in ends)
        given = [m["tool_calls"][0]["function"]["arguments"]["number"] for m in quiz["completion"] if "tool_calls" in m]
        assert [r for _, r in episode.turn_rewards] == [0.25 * (g == n + 1) for g, n in zip(given, rl_row["numbers"])]
        assert sum(r for _, r in episode.turn_rewards) == quiz_env.share_right(env)
