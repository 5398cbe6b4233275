"""Critic-free advantage estimators and the k3 KL loss against numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from trl_ext.ppo.objective.advantages import (
    gae_advantages,
    group_mean_baseline,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    sequence_advantages_to_tokens,
    token_rewards,
)
from loss_references import kl_loss_k3

# two groups of k = 4: unequal rewards, then all equal
REWARDS = torch.tensor([1.0, 2.0, 3.0, 6.0, 5.0, 5.0, 5.0, 5.0])


def test_rloo_leave_one_out_baseline():
    # A_0 = 1 - (2+3+6)/3, A_1 = 2 - (1+3+6)/3, A_2 = 3 - (1+2+6)/3, A_3 = 6 - (1+2+3)/3
    expected = [1 - 11 / 3, 2 - 10 / 3, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0]
    assert rloo_advantages(REWARDS, 4).tolist() == pytest.approx(expected, abs=1e-6)
    # k = 2: the other sample is the baseline
    assert rloo_advantages(torch.tensor([0.0, 1.0]), 2).tolist() == [-1.0, 1.0]


def test_grpo_group_mean_and_std():
    std = math.sqrt((4 + 1 + 0 + 9) / 3)  # unbiased std of [1, 2, 3, 6] around 3
    expected = [d / (std + 1e-4) for d in (-2, -1, 0, 3)] + [0.0] * 4  # all-equal group: 0 / (0 + eps) = 0
    assert grpo_advantages(REWARDS, 4).tolist() == pytest.approx(expected, abs=1e-6)
    # Dr. GRPO: no std division
    assert grpo_advantages(REWARDS, 4, scale_by_std=False).tolist() == pytest.approx([-2, -1, 0, 3, 0, 0, 0, 0])


def test_grpo_with_two_samples_per_prompt():
    """k = 2, the smallest group: (r - mean) / (unbiased std + eps), std of [0, 2] = sqrt(2)."""
    expected = [-1 / (math.sqrt(2) + 1e-4), 1 / (math.sqrt(2) + 1e-4), 0.0, 0.0]
    assert grpo_advantages(torch.tensor([0.0, 2.0, 3.0, 3.0]), 2).tolist() == pytest.approx(expected, abs=1e-6)


def test_group_mean_baseline_subtracts_each_groups_own_mean():
    """Three groups of 2 with means 2, 10 and 0 (more groups than samples per group)."""
    baseline = group_mean_baseline(torch.tensor([1.0, 3.0, 10.0, 10.0, -1.0, 1.0]), 2)
    assert baseline.tolist() == [-1.0, 1.0, 0.0, 0.0, -1.0, 1.0]


def test_gae_with_values_that_change_along_the_response():
    """V = (1, 2, 4), r = (0, 0, 1), gamma 0.5, lam 1: deltas r_t + 0.5 V_{t+1} - V_t = (0, 0, -3);
    A_2 = -3, A_1 = 0 + 0.5 * -3 = -1.5, A_0 = 0 + 0.5 * -1.5 = -0.75; returns A + V."""
    adv, ret = gae_advantages(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[1.0, 2.0, 4.0]]), 0.5, 1.0)
    assert adv.tolist() == [[-0.75, -1.5, -3.0]]
    assert ret.tolist() == [[0.25, 0.5, 1.0]]


def test_reinforce_pp_puts_a_one_token_completions_score_on_that_token():
    """Row 1 counts one token: its score lands on token 0; rewards (no KL): [0, 0, 1] and [2, masked, masked]."""
    adv = reinforce_pp(torch.tensor([1.0, 2.0]), torch.zeros(2, 3), 0.0,
                                  torch.tensor([[True, True, True], [True, False, False]]))
    w = _whitened([1.0, 1.0, 1.0, 2.0])
    assert adv[0].tolist() == pytest.approx(w[:3], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([w[3], 0.0, 0.0], abs=1e-5)


def test_reinforce_pp_with_equal_returns_everywhere_is_zero_not_nan():
    """Every completion scores 1 and no KL: every return is 1, the variance 0, and the 1e-8 keeps the advantages 0."""
    adv = reinforce_pp(torch.ones(2), torch.zeros(2, 2), 0.0, torch.ones(2, 2, dtype=torch.bool))
    assert adv.tolist() == [[0.0, 0.0], [0.0, 0.0]]


def test_group_estimators_refuse_ragged_groups():
    with pytest.raises(ValueError, match="groups of 3"):
        rloo_advantages(REWARDS, 3)
    with pytest.raises(ValueError, match="at least 2"):
        grpo_advantages(REWARDS, 1)


def reinforce_pp(scores, kl, kl_coef, mask, group_size=None, reduce_sum=None):
    """As the critic runs it: the score (minus its group's mean) on the last counted token, KL on every one."""
    if group_size is not None:
        scores = group_mean_baseline(scores, group_size)
    rewards = token_rewards(kl, kl_coef, scores, (mask.sum(1) - 1).clamp(min=0), mask=mask)
    return reinforce_pp_advantages(rewards, mask, reduce_sum)


# REINFORCE++: two sequences of 3 tokens, the second with its last token masked (padding)
SCORES = torch.tensor([1.0, 0.0])
KL = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 9.9]])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def _whitened(values):
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


def test_reinforce_pp_returns_to_go_whitened():
    # rewards: row 0 [-0.01, -0.02, -0.03 + 1], row 1 [-0.05, -0.05 + 0, masked]; returns-to-go with gamma 1
    returns = [0.94, 0.95, 0.97, -0.10, -0.05]
    w = _whitened(returns)
    adv = reinforce_pp(SCORES, KL, 0.1, MASK)
    assert adv[0].tolist() == pytest.approx(w[:3], abs=1e-5)
    assert adv[1].tolist() == pytest.approx(w[3:] + [0.0], abs=1e-5)  # masked token: 0, its KL (9.9) unused


def test_reinforce_pp_baseline_subtracts_group_mean_first():
    # scores [1, 0] in one group of 2 -> [0.5, -0.5]; no KL in the reward (kl_in="loss")
    returns = [0.5, 0.5, 0.5, -0.5, -0.5]
    w = _whitened(returns)
    adv = reinforce_pp(SCORES, KL, 0.0, MASK, group_size=2)
    assert adv[0].tolist() == pytest.approx(w[:3], abs=1e-5)
    assert adv[1].tolist() == pytest.approx(w[3:] + [0.0], abs=1e-5)


def test_reinforce_pp_whitening_is_global_across_processes():
    """Two "processes" holding one row each, whose moments are summed, get the one-process whole-batch result."""
    whole = reinforce_pp(SCORES, KL, 0.1, MASK)
    halves = [(SCORES[i : i + 1], KL[i : i + 1], MASK[i : i + 1]) for i in range(2)]

    def moments(s, k, m):  # what each process contributes: count, sum and sum of squares of its returns
        maskf = m.float()
        r = -0.1 * k * maskf
        r[0, int(maskf.sum()) - 1] += s[0]
        g = r.flip(1).cumsum(1).flip(1) * maskf
        return torch.stack([maskf.sum(), g.sum(), (g**2).sum()])

    total = moments(*halves[0]) + moments(*halves[1])
    rows = [reinforce_pp(s, k, 0.1, m, reduce_sum=lambda _: total) for s, k, m in halves]
    assert torch.allclose(torch.cat(rows), whole, atol=1e-6)
    local_only = reinforce_pp(*halves[0][:2], 0.1, halves[0][2])
    assert not torch.allclose(local_only, whole[:1])  # per-process whitening would differ


def test_sequence_advantages_on_counted_tokens_only():
    tokens = sequence_advantages_to_tokens(torch.tensor([2.0, -1.0]), MASK)
    assert tokens.tolist() == [[2.0, 2.0, 2.0], [-1.0, -1.0, 0.0]]


def test_kl_loss_k3():
    new = torch.tensor([[0.0, -1.0, 5.0]])
    ref = torch.tensor([[0.0, -2.0, 1.0]])
    mask = torch.tensor([[True, True, False]])
    # token 0: 0; token 1: ref - new = -1: exp(-1) + 1 - 1 = exp(-1); token 2 masked
    assert kl_loss_k3(new, ref, mask).item() == pytest.approx(math.exp(-1) / 2)
