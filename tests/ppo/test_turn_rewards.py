"""Environments' per-turn rewards (``get_turn_reward``, trl_ext/ppo/episodes/turn_rewards.py) on scripted episodes:
the turns are forced (a scripted sampler in place of the trainer's ``sample_turn``; its log-probs are the policy's,
teacher-forced), so the tokens, the tool results and the rewards are known. Which token gets which reward; the
rewards and GAE's returns of the update against a computation by hand; critic-free estimators get the episode's sum;
an environment without the method, or whose method says None, gives exactly the numbers of a run without the
feature."""

import re

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from trl_ext import PPOConfig, PPOTrainer
from trl_ext.errors import UserInputError
from trl_ext.ppo.episodes.turn_rewards import turn_reward_tensor
from trl_ext.ppo.objective.action_gae import gae_over_steps
from trl_ext.ppo.objective.advantages import GRPO_STD_EPS
from trl_ext.ppo.rollout.engine import teacher_forced_logprobs

from ppo_helpers import first_rollout, seed_all

SECRET = 5
PLANS = [[2, 4, 5], [3, 1, 5]]
"""Each episode's guesses, by its row in the batch: a guess per turn, then the answer `Found it.`."""


class Game:
    """Guess the secret (1 to 8); the final reward is 1.0 for finding it (TRL's contract only)."""

    def reset(self, secret: int = SECRET, **row):
        self.secret, self.last, self.found, self.pending = int(secret), None, False, None

    def guess(self, number: int) -> str:
        """Guess the secret number.

        Args:
            number: The number to guess.

        Returns:
            "higher", "lower" or "correct".
        """
        distance = abs(number - self.secret)
        if distance == 0:
            self.found, self.pending = True, 1.0
            return "correct"
        self.pending = None if self.last is None else (0.5 if distance < self.last else -0.5)
        self.last = distance
        return "higher" if self.secret > number else "lower"

    def get_reward(self) -> float:
        return 1.0 if self.found else 0.0


class HotCold(Game):
    """Per-turn rewards: 1.0 for the turn that finds the secret, 0.5 for a guess closer than the one before, -0.5 for
    one that is not, None for a first guess that misses (nothing to compare it with)."""

    def get_turn_reward(self):
        reward, self.pending = self.pending, None
        return reward


class Silent(Game):
    """Defines the method and never rewards a turn."""

    def get_turn_reward(self):
        return None


# by hand from PLANS: row 0 guesses 2 (None), 4 (closer: 0.5), 5 (1.0); row 1 guesses 3 (None), 1 (farther: -0.5), 5
TURN_REWARDS = [[None, 0.5, 1.0], [None, -0.5, 1.0]]


def call(number: int) -> str:
    return f'<tool_call>\n{{"name": "guess", "arguments": {{"number": {number}}}}}\n</tool_call><|im_end|>'


ANSWER = "Found it.<|im_end|>"


@pytest.fixture(scope="module")
def models(tool_models):
    return tool_models, AutoTokenizer.from_pretrained(tool_models / "tok")


def scripted_turns(tok, queries, max_new_tokens) -> torch.Tensor:
    """The query+responses of the turns :data:`PLANS` write: the first turn of batch row k guesses ``PLANS[k][0]``; a
    later turn finds its plan by the guesses its prefix holds and writes the next one, or the answer after the last."""
    texts = []
    for k, query in enumerate(queries):
        made = [int(n) for n in re.findall(r'"number": (\d+)', tok.decode(query[query != tok.pad_token_id]))]
        plan = PLANS[k] if not made else next(p for p in PLANS if p[: len(made)] == made)
        texts.append(call(plan[len(made)]) if len(made) < len(plan) else ANSWER)
    ids = [tok(text, add_special_tokens=False)["input_ids"][:max_new_tokens] for text in texts]
    responses = queries.new_full((len(ids), max(map(len, ids))), tok.pad_token_id)
    for k, row in enumerate(ids):
        responses[k, : len(row)] = torch.tensor(row)
    return torch.cat((queries, responses), 1)


def scripted_sample_turn(ppo):
    """A ``sample_turn`` that writes :data:`PLANS` (:func:`scripted_turns`), its log-probs the policy's."""
    tok = ppo.processing_class

    def sample_turn(policy, queries, max_new_tokens, on_chunk=None):
        query_responses = scripted_turns(tok, queries, max_new_tokens)
        return query_responses, teacher_forced_logprobs(policy, query_responses, queries.shape[1], tok.pad_token_id,
                                                        ppo.args.temperature, 2)

    return sample_turn


PROMPT = [{"role": "user", "content": "Find my number from 1 to 8."}]


def trainer(models, tmp_path, environment, rows=None, **overrides):
    """A trainer on the scripted episodes: two rows (``rows``: the dataset's; default two games of :data:`SECRET`)
    per update, one PPO epoch, gamma 0.9 and lam 0.8."""
    root, tok = models
    seed_all(0)
    settings = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                    gradient_accumulation_steps=1, num_mini_batches=1, total_episodes=2, response_length=160,
                    temperature=1.0, report_to="none", seed=0, num_sample_generations=0, stop_token="eos",
                    save_strategy="no", logging_steps=1, num_ppo_epochs=1, max_tool_calling_iterations=4,
                    gamma=0.9, lam=0.8, learning_rate=1e-3)
    settings.update(overrides)
    args = PPOConfig(**settings)
    value = None if args.critic_free else AutoModelForSequenceClassification.from_pretrained(root / "value",
                                                                                             num_labels=1)
    dataset = Dataset.from_list(rows or [{"prompt": PROMPT, "secret": SECRET}] * 2)
    ppo = PPOTrainer(args, tok, AutoModelForCausalLM.from_pretrained(root / "untrained"), None, None, dataset, value,
                     environment_factory=environment)
    ppo.sample_turn = scripted_sample_turn(ppo)
    return ppo


def turn_ends(tok, loop, plan) -> list[int]:
    """The position, after the prompt, of the last token of each guessing turn of ``plan`` (its EOS), by counting
    each turn's tokens and each tool result's (TRL's suffix, rendered by ``loop``'s toolbox)."""
    box, game, position, ends = loop.toolbox, Game(), 0, []
    game.reset()
    for number in plan:
        position += len(tok(call(number), add_special_tokens=False)["input_ids"])
        ends.append(position - 1)
        position += len(box.tool_suffix_ids([{"role": "tool", "name": "guess", "content": game.guess(number)}]))
    return ends


def test_each_turn_reward_lands_on_the_last_token_of_the_turn_it_scores(models, tmp_path):
    tok = models[1]
    ppo = trainer(models, tmp_path, HotCold)
    rollout, kl_coef = first_rollout(ppo)
    assert [m.__name__ for m in ppo.multi_turn.toolbox.row_tools[0]] == ["guess"]  # get_turn_reward is no tool
    for i, plan in enumerate(PLANS):
        episode = rollout.episodes.episodes[i]
        assert [m["content"] for m in episode.messages if m["role"] == "tool"][-1] == "correct"
        ends = turn_ends(tok, ppo.multi_turn, plan)
        expected = [(end, reward) for end, reward in zip(ends, TURN_REWARDS[i]) if reward is not None]
        assert episode.turn_rewards == expected
        assert all(rollout.responses[i, end] == tok.eos_token_id and rollout.observation_mask[i, end + 1]
                   and not rollout.observation_mask[i, end] for end in ends)  # a turn's EOS, the tool result next
        row = torch.zeros(rollout.responses.shape[1])
        for end, reward in expected:
            row[end] = reward
        assert torch.equal(rollout.turn_rewards[i], row)
        # the update's rewards: -kl_coef * KL on every action, the final score after the last token, the turn rewards
        end = len(episode.ids)
        expected_rewards = (-kl_coef * rollout.kl[i]).clone()
        expected_rewards[min(end, rollout.responses.shape[1] - 1)] += rollout.scores[i]
        expected_rewards += row
        torch.testing.assert_close(rollout.rewards[i], expected_rewards, rtol=0, atol=1e-6)
    assert rollout.scores.tolist() == [1.0, 1.0]  # the final reward is get_reward's alone


def play(tok, response_length, max_iterations):
    """:data:`PLANS` through the turn loop alone (no trainer): the episodes."""
    from types import SimpleNamespace

    from trl_ext.ppo.episodes.multi_turn import MultiTurnRollout
    from trl_ext.ppo.episodes.toolbox import Toolbox

    args = SimpleNamespace(response_length=response_length, max_tool_calling_iterations=max_iterations,
                           tool_timeout_s=None, tool_num_workers=0)
    loop = MultiTurnRollout(Toolbox(None, HotCold, tok), args, tok)
    data = loop.begin({"input_ids": torch.zeros(2, 1, dtype=torch.long), "prompt": [PROMPT, PROMPT],
                       "secret": [SECRET, SECRET]})

    def sample(queries, max_new_tokens):
        query_responses = scripted_turns(tok, queries, max_new_tokens)
        return query_responses, torch.zeros(query_responses[:, queries.shape[1]:].shape)

    return loop.run(data["input_ids"], sample)[2].episodes, loop


def test_turns_whose_calls_did_not_run_get_no_reward_and_a_dropped_result_keeps_its_turns(models):
    tok = models[1]
    episodes, loop = play(tok, 400, 2)  # the third guesses are written, but the rounds have run out
    ends = [turn_ends(tok, loop, plan) for plan in PLANS]
    assert [e.truncated for e in episodes] == ["iterations"] * 2
    assert [e.turn_rewards for e in episodes] == [[(ends[0][1], 0.5)], [(ends[1][1], -0.5)]]
    # row 0's last result ("correct") does not fit: dropped, the episode ends there, and its turn keeps its reward
    episodes, _ = play(tok, ends[0][2] + 1, 4)
    assert episodes[0].truncated == "length" and len(episodes[0].ids) == ends[0][2] + 1
    assert episodes[0].turn_rewards == [(ends[0][1], 0.5), (ends[0][2], 1.0)]


@pytest.mark.parametrize("critic_lam", [None, 1.0])
def test_gae_returns_of_the_scripted_episodes_by_hand(models, tmp_path, critic_lam):
    """gamma 0.9, lam 0.8: GAE over each episode's steps (its action tokens and the position after its last token, as
    TRL's PPO), the observation spans skipped, computed here one step at a time in Python; the value targets at
    ``critic_lam`` (1.0: the discounted Monte-Carlo return over the steps). The critic's health per turn: each
    turn's explained variance over its steps of both episodes; the credit gain: the values against the other
    episode's Monte-Carlo return at the same turn's first step (k = 1: the batch is the group)."""
    ppo = trainer(models, tmp_path, HotCold, critic_lam=critic_lam)
    rollout, kl_coef = first_rollout(ppo)
    gamma, lam = 0.9, 0.8 if critic_lam is None else critic_lam
    width = rollout.responses.shape[1]
    by_turn, monte_carlo = {}, []
    for i, episode in enumerate(rollout.episodes.episodes):
        n = len(episode.ids)
        steps = [t for t in range(n) if episode.action[t]] + ([n] if n < width else [])
        reward = {t: -kl_coef * float(rollout.kl[i, t]) for t in steps}
        reward[steps[-1]] += float(rollout.scores[i])
        for position, turn_reward in episode.turn_rewards:
            reward[position] += turn_reward
        value = {t: float(rollout.values[i, t]) for t in steps}
        advantage, returns = 0.0, {}
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_value = value[steps[k + 1]] if k + 1 < len(steps) else 0.0
            advantage = reward[t] + gamma * next_value - value[t] + gamma * lam * advantage
            returns[t] = advantage + value[t]
        assert all(position in steps for position, _ in episode.turn_rewards)  # each on a step of GAE's
        assert rollout.returns[i, steps].tolist() == pytest.approx([returns[t] for t in steps], abs=1e-5)
        turn, later, steps_of = 0, 0.0, []
        for k, t in enumerate(steps):
            turn += k == 0 or steps[k - 1] != t - 1
            by_turn.setdefault(turn, []).append((returns[t], value[t]))
            steps_of.append((turn, t))
        mc = {}
        for t in reversed(steps):
            later = reward[t] + gamma * later
            mc[t] = later
        monte_carlo.append([(turn, mc[t], value[t], k == 0 or steps_of[k - 1][0] != turn)
                            for k, (turn, t) in enumerate(steps_of)])
    health = ppo.critic.metrics({}, rollout, None)
    first = [{turn: g for turn, g, _, start in rows if start} for rows in monte_carlo]
    squares = [0.0, 0.0]
    for i, rows in enumerate(monte_carlo):
        for turn, g, v, _ in rows:
            squares[0] += (g - v) ** 2
            squares[1] += (g - first[1 - i][turn]) ** 2
    assert sorted(first[0]) == sorted(first[1]) == [1, 2, 3, 4]  # every turn has its peer
    assert health["critic/credit_gain"] == pytest.approx(1 - squares[0] / squares[1], rel=1e-4)
    assert len(by_turn) >= 2
    for turn, pairs in by_turn.items():
        rets, errors = torch.tensor([r for r, _ in pairs]), torch.tensor([r - v for r, v in pairs])
        expected = 1 - errors.var(unbiased=False) / rets.var(unbiased=False)
        assert health[f"critic/vf_explained_var/turn_{turn}"] == pytest.approx(expected.item(), rel=1e-4)


def test_turn_rewards_by_hand_on_a_span_of_observations():
    """Literal numbers: a0 a1(turn end, reward 0.5) [o o] a2 end; gamma 0.9, lam 0.8; the observations' values (9)
    unused."""
    from trl_ext.ppo.episodes.multi_turn import Episode

    episode = Episode(prompt_ids=[1], ids=[], action=[], logprobs=[], messages=[])
    episode.append([11, 12], True)
    episode.append([21, 22], False)
    episode.append([13], True)
    episode.turn_rewards.append((1, 0.5))
    kl = torch.tensor([[-0.1, -0.2, 0.0, 0.0, -0.3, 0.0, 0.0]])
    turn = turn_reward_tensor([episode], 7, kl)
    assert turn.tolist() == [[0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]]
    rewards = kl.clone()
    rewards[0, 5] += 1.0  # the final score, after the last token
    rewards = rewards + turn
    values = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.7, 0.8, 0.0]])
    steps = torch.tensor([[True, True, False, False, True, True, False]])
    advantages, returns = gae_over_steps(rewards, values, steps, 0.9, 0.8)
    d3 = 1.0 - 0.8                                # the end: score 1.0, V 0.8, nothing after
    d2 = -0.3 + 0.9 * 0.8 - 0.7
    d1 = -0.2 + 0.5 + 0.9 * 0.7 - 0.6             # the turn's last token: its reward 0.5, bootstrapped from a2
    d0 = -0.1 + 0.9 * 0.6 - 0.5
    a3 = d3
    a2 = d2 + 0.72 * a3
    a1 = d1 + 0.72 * a2
    a0 = d0 + 0.72 * a1
    torch.testing.assert_close(returns, torch.tensor([[a0 + 0.5, a1 + 0.6, 0.0, 0.0, a2 + 0.7, a3 + 0.8, 0.0]]),
                               rtol=0, atol=1e-6)
    assert turn_reward_tensor([Episode([1], [11], [True], [0.0], [])], 3, kl) is None  # none: nothing to add


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_critic_free_estimators_get_each_episodes_sum_on_its_score(models, tmp_path, estimator):
    """Both samples of the prompt find the secret (final reward 1.0 each: alone, zero advantage); their turn rewards
    sum to 1.5 and 0.5, so the sequence rewards are 2.5 and 1.5."""
    ppo = trainer(models, tmp_path, HotCold, advantage_estimator=estimator, num_samples_per_prompt=2, kl_in="loss")
    rollout, _ = first_rollout(ppo)
    assert rollout.scores.tolist() == [1.0, 1.0]
    assert rollout.turn_rewards.sum(1).tolist() == [1.5, 0.5]
    advantages = rollout.estimator_stats["sequence_advantages"].tolist()
    if estimator == "grpo":  # (r - mean) / (std + eps), unbiased std of (2.5, 1.5) = sqrt(0.5)
        spread = 0.5 / (np.sqrt(0.5) + GRPO_STD_EPS)
        assert advantages == pytest.approx([spread, -spread], abs=1e-6)
    else:  # r_i - r_j
        assert advantages == pytest.approx([1.0, -1.0], abs=1e-6)
    actions = ~rollout.padding_mask
    assert torch.all(rollout.advantages[0][actions[0]] == advantages[0])


def test_reinforce_pp_puts_the_episodes_reward_on_its_last_action_token(models, tmp_path):
    """REINFORCE++ (KL in the loss): the final score plus the turn rewards (2.5 and 1.5) on the last token of the last
    turn, not at the count of the action tokens (an observation token there, masked out: the reward was lost); the
    returns-to-go, 2.5 and 1.5 on every action token, whitened over both episodes' tokens."""
    ppo = trainer(models, tmp_path, HotCold, advantage_estimator="reinforce_pp", kl_in="loss")
    rollout, _ = first_rollout(ppo)
    actions = ~rollout.padding_mask
    for i, episode in enumerate(rollout.episodes.episodes):
        last = max(t for t, action in enumerate(episode.action) if action)
        assert last > int(actions[i].sum()) - 1  # observations before it
        expected = torch.zeros(rollout.responses.shape[1])
        expected[last] = [2.5, 1.5][i]
        assert torch.equal(rollout.rewards[i], expected)
    n = int(actions.sum())
    spread = 0.5 / np.sqrt(0.25 * n / (n - 1) + 1e-8)  # returns 2.5 and 1.5 on equally many tokens: mean 2
    assert int(actions[0].sum()) == int(actions[1].sum())
    torch.testing.assert_close(rollout.advantages, actions * spread * torch.tensor([[1.0], [-1.0]]), rtol=0,
                               atol=1e-5)


def numbers(history):
    """Each update's logged numbers but timings and the turn-reward metric, the environment's reward under one name
    (``rewards/<Class>/*``: the classes differ)."""
    return [{re.sub(r"^rewards/\w+/", "rewards/environment/", k): v for k, v in h.items()
             if not k.startswith(("time/", "eps", "episodes/turn_reward", "episodes/reward_mean"))} for h in history]


def test_without_turn_rewards_every_number_is_the_runs_without_the_feature(models, tmp_path):
    """Two updates of GAE on the scripted episodes: a TRL environment (no get_turn_reward) builds no feature; one whose
    method says None every turn logs the same numbers, update by update; one with turn rewards does not."""
    runs = {}
    for environment in (Game, Silent, HotCold):
        ppo = trainer(models, tmp_path / environment.__name__, environment, total_episodes=4)
        ppo.train()
        runs[environment] = ppo
    assert runs[Game].turn_rewards is None and runs[Silent].turn_rewards is not None
    plain, silent, rewarded = (numbers(runs[e].state.log_history) for e in (Game, Silent, HotCold))
    assert len(plain) == 2 and plain == silent  # update by update
    assert [h["episodes/turn_reward_mean"] for h in runs[Silent].state.log_history[:2]] == [0.0, 0.0]
    assert [h["episodes/turn_reward_mean"] for h in runs[HotCold].state.log_history[:2]] == [1.0, 1.0]  # (1.5+0.5)/2
    assert rewarded[0]["objective/scores"] == plain[0]["objective/scores"]  # the final rewards are the same
    assert rewarded[0]["loss/value_avg"] != plain[0]["loss/value_avg"]  # the returns are not


class Judge(Game):
    """Per-turn rewards from an ``async def`` method (a judge model, say): 0.25 a turn."""

    async def get_turn_reward(self):
        return 0.25


class Broken(Game):
    def get_turn_reward(self):
        return "warmer"


def test_async_turn_rewards_a_metric_per_environment_and_a_wrong_value_refused(models, tmp_path):
    rows = [{"prompt": PROMPT, "secret": SECRET, "environment": name} for name in ("hot", "judge")]
    ppo = trainer(models, tmp_path, {"hot": HotCold, "judge": Judge}, rows=rows)
    ppo.train()
    log = ppo.state.log_history[0]
    hot = [type(e) for e in ppo.multi_turn.toolbox.environments].index(HotCold)  # its batch row: its plan
    assert log["episodes/turn_reward/HotCold/mean"] == [1.5, 0.5][hot]  # None, then 0.5 or -0.5, then 1.0
    assert log["episodes/turn_reward/Judge/mean"] == 0.75  # 0.25 after each of its 3 rounds
    assert log["episodes/turn_reward_mean"] == ([1.5, 0.5][hot] + 0.75) / 2
    broken = trainer(models, tmp_path / "broken", Broken)
    with pytest.raises(UserInputError, match=r"^environment_factory: Broken.get_turn_reward returned 'warmer'; it "
                                             r"must return a number"):
        broken.train()
