"""GAE over the action tokens of a multi-turn episode (trl_ext/ppo/objective/action_gae.py), by hand."""

import torch

from trl_ext.ppo.objective.action_gae import gae_over_steps
from trl_ext.ppo.objective.advantages import gae_advantages


def test_an_observation_span_is_a_transition_the_value_after_it_bootstraps_the_action_before_it():
    # positions: a0 a1 [o o] a2 end pad ; gamma 0.9, lam 0.8; the observations' values (9) must not be used
    rewards = torch.tensor([[-0.1, -0.2, 0.0, 0.0, -0.3, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 9.0, 9.0, 0.7, 0.8, 0.0]])
    steps = torch.tensor([[True, True, False, False, True, True, False]])
    advantages, returns = gae_over_steps(rewards, values, steps, 0.9, 0.8)
    # by hand over the steps (r, V) = (-0.1, 0.5), (-0.2, 0.6), (-0.3, 0.7), (1.0, 0.8), then V = 0:
    d3 = 1.0 + 0.9 * 0.0 - 0.8                    # 0.2
    d2 = -0.3 + 0.9 * 0.8 - 0.7                   # -0.28
    d1 = -0.2 + 0.9 * 0.7 - 0.6                   # -0.17: a1's next value is a2's (0.7), after the span
    d0 = -0.1 + 0.9 * 0.6 - 0.5                   # -0.06
    a3 = d3
    a2 = d2 + 0.72 * a3
    a1 = d1 + 0.72 * a2
    a0 = d0 + 0.72 * a1
    expected = torch.tensor([[a0, a1, 0.0, 0.0, a2, a3, 0.0]])
    torch.testing.assert_close(advantages, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(returns, torch.tensor([[a0 + 0.5, a1 + 0.6, 0.0, 0.0, a2 + 0.7, a3 + 0.8, 0.0]]),
                               rtol=0, atol=1e-6)


def test_without_observations_it_is_trls_gae_exactly():
    torch.manual_seed(0)
    rewards, values = torch.randn(3, 8), torch.randn(3, 8)
    steps = torch.ones(3, 8, dtype=torch.bool)
    steps[1, 5:] = False  # a shorter episode: padding after it (TRL's zeros)
    rewards[1, 5:] = 0.0
    values[1, 5:] = 0.0
    advantages, returns = gae_over_steps(rewards, values, steps, 0.95, 0.9)
    expected_advantages, expected_returns = gae_advantages(rewards, values, 0.95, 0.9)
    assert torch.equal(advantages, expected_advantages)
    assert torch.equal(returns, expected_returns)


def test_a_reward_on_an_observation_goes_to_the_last_action_before_it():
    # the episode ends on an observation (its tool result filled the budget): the score lands on the last position
    rewards = torch.tensor([[0.0, 0.0, 0.0, 2.0]])
    values = torch.tensor([[0.1, 0.2, 5.0, 5.0]])
    steps = torch.tensor([[True, True, False, False]])
    advantages, _ = gae_over_steps(rewards, values, steps, 1.0, 1.0)
    # steps (0, 0.1), (2.0, 0.2), then 0: A1 = 2 - 0.2 = 1.8, A0 = 0 + 0.2 - 0.1 + 1.8 = 1.9
    torch.testing.assert_close(advantages, torch.tensor([[1.9, 1.8, 0.0, 0.0]]), rtol=0, atol=1e-6)
