"""Pure preference losses against numbers computed by hand (math module, not torch)."""

import math

import pytest
import torch

from trl_ext.preference.losses import (
    cdpo_loss,
    pairwise_reward_loss,
    ranked_pair_indices,
    ranked_reward_loss,
    robust_label_smoothing_for_cdpo,
    smoothed_logsigmoid_loss,
)


def nls(x):  # -log(sigmoid(x)), by hand
    return math.log1p(math.exp(-x))


def test_smoothed_logsigmoid_by_hand():
    # d = 1, eps = 0.1: 0.9 * 0.3132617 + 0.1 * 1.3132617 = 0.4132617
    got = smoothed_logsigmoid_loss(torch.tensor([1.0]), 0.1).item()
    assert got == pytest.approx(0.4132617, abs=1e-6)
    assert got == pytest.approx(0.9 * nls(1.0) + 0.1 * nls(-1.0), abs=1e-6)
    # eps = 0 is exactly -logsigmoid
    x = torch.tensor([-3.0, 0.2, 5.0])
    assert torch.equal(smoothed_logsigmoid_loss(x, 0.0), -torch.nn.functional.logsigmoid(x))


def test_pairwise_reward_loss_by_hand():
    rc, rr, margin = torch.tensor([2.0, 0.0]), torch.tensor([1.0, 0.5]), torch.tensor([0.5, 0.0])
    # d = [0.5, -0.5]
    expected = (0.8 * nls(0.5) + 0.2 * nls(-0.5) + 0.8 * nls(-0.5) + 0.2 * nls(0.5)) / 2
    assert pairwise_reward_loss(rc, rr, margin, 0.2).item() == pytest.approx(expected, abs=1e-6)
    # centering term: 0.01 * mean((3)^2, (0.5)^2) = 0.01 * 4.625
    expected_c = (nls(1.0) + nls(-0.5)) / 2 + 0.01 * 4.625
    assert pairwise_reward_loss(rc, rr, None, 0.0, 0.01).item() == pytest.approx(expected_c, abs=1e-6)


def test_ranked_pair_indices():
    better, worse, example = ranked_pair_indices([3, 2])
    assert better.tolist() == [0, 0, 1, 3] and worse.tolist() == [1, 2, 2, 4] and example.tolist() == [0, 0, 0, 1]


def test_ranked_reward_loss_by_hand():
    rewards = torch.tensor([2.0, 1.0, 0.0, 0.5, 0.5])  # example 0: K=3, example 1: K=2
    # example 0 pairs: d = 1, 2, 1; example 1: d = 0
    ex0 = (2 * nls(1.0) + nls(2.0)) / 3
    ex1 = math.log(2.0)
    assert ranked_reward_loss(rewards, [3, 2]).item() == pytest.approx((ex0 + ex1) / 2, abs=1e-6)
    # 0.2511505 and 0.6931472 -> 0.4721488
    assert ranked_reward_loss(rewards, [3, 2]).item() == pytest.approx(0.4721488, abs=1e-6)
    eps = 0.1
    ex0_s = (2 * (0.9 * nls(1.0) + 0.1 * nls(-1.0)) + (0.9 * nls(2.0) + 0.1 * nls(-2.0))) / 3
    ex1_s = math.log(2.0)
    assert ranked_reward_loss(rewards, [3, 2], eps).item() == pytest.approx((ex0_s + ex1_s) / 2, abs=1e-6)
    # centering per pair: example 0: (3^2 + 2^2 + 1^2)/3, example 1: 1^2
    c = 0.05
    expected_c = (ex0 + ex1) / 2 + c * ((9 + 4 + 1) / 3 + 1) / 2
    assert ranked_reward_loss(rewards, [3, 2], 0.0, c).item() == pytest.approx(expected_c, abs=1e-6)


def test_ranked_k2_equals_pairwise():
    torch.manual_seed(0)
    rc, rr = torch.randn(6), torch.randn(6)
    flat = torch.stack([rc, rr], dim=1).reshape(-1)  # [c0, r0, c1, r1, ...]
    for eps, c in [(0.0, None), (0.2, None), (0.1, 0.01)]:
        assert torch.allclose(ranked_reward_loss(flat, [2] * 6, eps, c), pairwise_reward_loss(rc, rr, None, eps, c))


def test_cdpo_by_hand_and_robust_identity():
    chosen, rejected, beta, eps = torch.tensor([0.4, -1.0]), torch.tensor([-0.6, 1.0]), 0.5, 0.25
    # beta * d = [0.5, -1.0]
    expected = [0.75 * nls(0.5) + 0.25 * nls(-0.5), 0.75 * nls(-1.0) + 0.25 * nls(1.0)]
    assert cdpo_loss(chosen, rejected, beta, eps).tolist() == pytest.approx(expected, abs=1e-6)
    # TRL's robust loss with e' = -eps / (1 - 2 eps) gives the same numbers
    e2 = robust_label_smoothing_for_cdpo(eps)
    assert e2 == pytest.approx(-0.5)
    x = beta * (chosen - rejected)
    F = torch.nn.functional
    robust = (-(1 - e2) * F.logsigmoid(x) + e2 * F.logsigmoid(-x)) / (1 - 2 * e2)
    assert robust.tolist() == pytest.approx(expected, abs=1e-6)
