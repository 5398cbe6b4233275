"""The value model's own settings: ``critic_learning_rate`` (the value model's parameters step at their own rate),
``critic_lam`` (value targets at their own lambda, against hand-computed lambda-returns), VAPO's length-adaptive
lambda, and the critic's health metrics (explained variance and error, over all tokens and per turn)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

import trl_ext
from trl_ext.ppo.objective.advantages import gae_advantages, lambda_returns, length_adaptive_lam
from trl_ext.ppo.objective.critic import ValueCritic
from trl_ext.ppo.objective.critic_health import credit_gain, critic_health, turn_index
from trl_ext.ppo.objective.masked_stats import masked_whiten

from ppo_helpers import config_kwargs, left_tokenizer, load_models, prompt_dataset, seed_all, update_logs

VALUE_KEYS = [("critic_learning_rate", 1e-3), ("critic_lam", 1.0), ("critic_lam", 0.0),
              ("length_adaptive_lam_alpha", 0.05)]


@pytest.mark.parametrize("key, value", VALUE_KEYS)
def test_value_settings_are_refused_without_a_value_model(tmp_path, key, value):
    from trl_ext.errors import UserInputError

    with pytest.raises(UserInputError, match=rf"^{key}: {value!r} sets the value model, and advantage_estimator "
                                             r"'grpo' has none; remove it, or set advantage_estimator to 'gae'$"):
        trl_ext.PPOConfig(**config_kwargs(tmp_path, advantage_estimator="grpo", num_samples_per_prompt=2,
                                          **{key: value}))
    assert getattr(trl_ext.PPOConfig(**config_kwargs(tmp_path, **{key: value})), key) == value  # gae takes it


@pytest.mark.parametrize("key, value, valid", [("critic_learning_rate", 0.0, "a number > 0"),
                                               ("critic_lam", 1.5, "a number in [0, 1]"),
                                               ("length_adaptive_lam_alpha", -1.0, "a number > 0")])
def test_value_settings_out_of_range(tmp_path, key, value, valid):
    from trl_ext.errors import UserInputError

    with pytest.raises(UserInputError, match=rf"^{key}: {value} is out of range \(valid: {re.escape(valid)}\)$"):
        trl_ext.PPOConfig(**config_kwargs(tmp_path, **{key: value}))


# one response of 3 tokens, gamma 1: rewards (0, 0, 1), values (0.2, 0.5, 0.6)
REWARDS, VALUES = torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.2, 0.5, 0.6]])


def test_lambda_returns_by_hand():
    """lam 1: the Monte-Carlo return (1, 1, 1), no value in it; lam 0: r_t + V_{t+1} = (0.5, 0.6, 1.0);
    lam 0.5: R_2 = 1, R_1 = 0 + 0.5 * 0.6 + 0.5 * 1 = 0.8, R_0 = 0 + 0.5 * 0.5 + 0.5 * 0.8 = 0.65."""
    assert lambda_returns(REWARDS, VALUES, 1.0, 1.0)[0].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert lambda_returns(REWARDS, VALUES, 1.0, 0.0)[0].tolist() == pytest.approx([0.5, 0.6, 1.0])
    assert lambda_returns(REWARDS, VALUES, 1.0, 0.5)[0].tolist() == pytest.approx([0.65, 0.8, 1.0])


def critic_rollout(rewards, values, width_mask=None):
    mask = torch.zeros_like(rewards, dtype=torch.bool) if width_mask is None else ~width_mask
    return SimpleNamespace(rewards=rewards, values=values, padding_mask=mask, padding_mask_p1=mask,
                           observation_mask=None)


def critic(**settings):
    keys = dict(advantage_estimator="gae", gamma=1.0, lam=0.5, critic_lam=None, length_adaptive_lam_alpha=None,
                whiten_rewards=False, cliprange_value=0.2, value_clip="max", grpo_scale_by_std=True,
                turn_credit="episode", num_samples_per_prompt=1)
    return ValueCritic(SimpleNamespace(**{**keys, **settings}))


def test_decoupled_lambda_targets_at_critic_lam_advantages_at_lam():
    """lam 0.5: deltas (0.3, 0.1, 0.4), A = (0.45, 0.3, 0.4), whitened; the targets at critic_lam 1 are the
    Monte-Carlo returns, not A + V = (0.65, 0.8, 1.0)."""
    rollout = critic_rollout(REWARDS, VALUES)
    critic(critic_lam=1.0).advantages(rollout)
    assert rollout.returns[0].tolist() == pytest.approx([1.0, 1.0, 1.0])
    expected = masked_whiten(torch.tensor([[0.45, 0.3, 0.4]]), torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(rollout.advantages, expected)
    coupled = critic_rollout(REWARDS, VALUES)
    critic().advantages(coupled)  # critic_lam None: lam for both, TRL's returns A + V
    assert coupled.returns[0].tolist() == pytest.approx([0.65, 0.8, 1.0])
    torch.testing.assert_close(coupled.advantages, rollout.advantages)


def test_length_adaptive_lambda_per_response():
    """VAPO: lam = 1 - 1/(alpha * l); alpha 0.5: a 2-token response gets 0, a 4-token one 0.5."""
    assert length_adaptive_lam(torch.tensor([2, 4]), 0.5).tolist() == [[0.0], [0.5]]
    rewards = torch.tensor([[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[0.2, 0.5, 0.0, 0.0], [0.2, 0.5, 0.6, 0.3]])
    padding = torch.tensor([[False, False, True, True], [False] * 4])
    rollout = critic_rollout(rewards, values, ~padding)
    critic(length_adaptive_lam_alpha=0.5).advantages(rollout)
    rows = [gae_advantages(rewards[i : i + 1], values[i : i + 1], 1.0, lam)[0] for i, lam in enumerate((0.0, 0.5))]
    expected = masked_whiten(torch.cat(rows), ~padding).masked_fill(padding, 0)
    torch.testing.assert_close(rollout.advantages, expected)
    # the targets keep lam (0.5) for both rows: row 0 is not its lam-0 one-step target
    assert rollout.returns[0, :2].tolist() == pytest.approx(lambda_returns(rewards, values, 1.0, 0.5)[0, :2].tolist())


def test_explained_variance_and_error_by_hand():
    """Returns (1, 2, 3, 4): perfect values explain all (1, error 0); their mean explains nothing (0, error sd
    sqrt(1.25)); values off by a constant 1 explain all but err by 1."""
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.zeros(1, 4, dtype=torch.bool)
    for values, (ev, rmse) in [(returns, (1.0, 0.0)), (torch.full((1, 4), 2.5), (0.0, 1.25**0.5)),
                               (returns + 1, (1.0, 1.0))]:
        health = critic_health(SimpleNamespace(returns=returns, values=values, padding_mask_p1=mask))
        assert (health["critic/vf_explained_var"], health["critic/value_rmse"]) == pytest.approx((ev, rmse))


def test_health_per_turn():
    """Two turns split by an observation: the value model right on turn 1, off by one on turn 2."""
    steps = torch.tensor([[True, True, False, False, True, True]])
    assert turn_index(steps).tolist() == [[1, 1, 0, 0, 2, 2]]
    returns = torch.tensor([[1.0, 2.0, 0.0, 0.0, 3.0, 5.0]])
    values = returns + torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0, -1.0]])
    health = critic_health(SimpleNamespace(returns=returns, values=values, padding_mask_p1=~steps), turns=3)
    assert health["critic/vf_explained_var/turn_1"] == pytest.approx(1.0)
    assert health["critic/value_rmse/turn_2"] == pytest.approx(1.0)
    assert health["critic/vf_explained_var/turn_2"] == pytest.approx(1 - 1.0 / 1.0)  # Var(R - V) 1, Var(R) 1
    assert "critic/vf_explained_var/turn_3" not in health  # no token: not logged


def test_a_turn_whose_returns_barely_vary_is_not_logged():
    """Turn 2's returns spread by 1e-5 (the KL penalties after the last reward): without the floor its explained
    variance would be 1 - 0.01 / 1e-10, about -1e8; turn 1's spread (1) keeps its key."""
    steps = torch.tensor([[True, True, False, True, True]])
    returns = torch.tensor([[1.0, 3.0, 0.0, 0.5, 0.50002]])
    values = returns + torch.tensor([[0.0, 0.0, 0.0, 0.1, -0.1]])
    health = critic_health(SimpleNamespace(returns=returns, values=values, padding_mask_p1=~steps), turns=2)
    assert health["critic/vf_explained_var/turn_1"] == pytest.approx(1.0)
    assert "critic/vf_explained_var/turn_2" not in health and "critic/value_rmse/turn_2" not in health


def gain_rollout(rewards, values, steps):
    return SimpleNamespace(rewards=torch.tensor(rewards), values=torch.tensor(values),
                           padding_mask_p1=~torch.tensor(steps, dtype=torch.bool))


def test_credit_gain_by_hand():
    """Two episodes of two turns (steps ``a a o a a``), gamma 1. Returns-to-go G: (3, 3, -, 2, 2) and (1, 1, -, 1, 1);
    per-turn RLOO's baseline, the other episode's G at the turn's first step: (1, 1) and (3, 2); so G - b is
    (2, 2, -, 1, 1) and (-2, -2, -, -1, -1): sum of squares 20. The values leave G - V = (0.5, 0, -, 0, 0.5) and
    (0, -0.5, -, 0, 0): 0.75. Gain 1 - 0.75 / 20; turn 1: 1 - 0.5 / 16, turn 2: 1 - 0.25 / 4."""
    rollout = gain_rollout([[0.0, 1.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0, 1.0]],
                           [[2.5, 3.0, 0.0, 2.0, 1.5], [1.0, 1.5, 0.0, 1.0, 1.0]], [[1, 1, 0, 1, 1]] * 2)
    gain = credit_gain(rollout, 1.0, 2, turns=3)
    assert gain == pytest.approx({"critic/credit_gain": 1 - 0.75 / 20, "critic/credit_gain/turn_1": 1 - 0.5 / 16,
                                  "critic/credit_gain/turn_2": 1 - 0.25 / 4})
    assert credit_gain(rollout, 1.0, 1) == pytest.approx({"critic/credit_gain": 1 - 0.75 / 20})  # k 1: the batch
    rollout.values = rollout.rewards.flip(1).cumsum(1).flip(1) * ~rollout.padding_mask_p1  # V = G: gain 1
    assert credit_gain(rollout, 1.0, 2)["critic/credit_gain"] == pytest.approx(1.0)


def test_credit_gain_discounts_and_leaves_out_turns_without_a_peer():
    """gamma 0.5 per step, as GAE's: episode 0 (``a a o a``, rewards 1 on its first turn's end and 2 at its end)
    has G (0.5 * 2, 1 + 0.5 * 2, -, 2); episode 1 (``a a``, reward 1) has G (0.5, 1). Only turn 1 has a peer:
    b = 0.5 and 1, G - b = (0.5, 1.5) and (-0.5, 0): 2.75; V 0 everywhere, G - V = G: 6.25. Gain 1 - 6.25 / 2.75
    (negative: the values do worse than the baseline); episode 0's turn 2 counts in neither sum."""
    rollout = gain_rollout([[0.0, 1.0, 0.0, 2.0], [0.0, 1.0, 0.0, 0.0]], [[0.0] * 4] * 2,
                           [[1, 1, 0, 1], [1, 1, 0, 0]])
    expected = 1 - 6.25 / 2.75
    assert credit_gain(rollout, 0.5, 2, turns=2) == pytest.approx({"critic/credit_gain": expected,
                                                                   "critic/credit_gain/turn_1": expected})
    flat = gain_rollout([[0.0, 1.0], [0.0, 1.0]], [[0.0, 0.0]] * 2, [[1, 1]] * 2)  # equal returns: no spread
    assert credit_gain(flat, 1.0, 2) == {}


@pytest.fixture(scope="module")
def trained(tiny_models, tmp_path_factory):
    """One update, one PPO epoch, one mini-batch (one Adam step), the value model at 100x the policy's rate."""
    seed_all(0)
    tok = left_tokenizer(tiny_models)
    policy, value, reward = load_models(tiny_models)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path_factory.mktemp("critic_lr"), learning_rate=1e-5,
                                             critic_learning_rate=1e-3, num_ppo_epochs=1, total_episodes=4,
                                             num_sample_generations=0, lr_scheduler_type="constant"))
    trainer = trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                                 train_dataset=prompt_dataset(tok), value_model=value)
    wrapper = trainer.accelerator.unwrap_model(trainer.model)
    before = {id(p): p.detach().clone() for p in wrapper.parameters() if p.requires_grad}
    rollouts = []
    compute_advantages = trainer.compute_advantages
    trainer.compute_advantages = lambda rollout: compute_advantages(rollout) or rollouts.append(rollout)
    trainer.train()
    return trainer, wrapper, before, rollouts[0]


def median_step(parameters, before) -> float:
    steps = torch.cat([(p.detach() - before[id(p)]).abs().flatten() for p in parameters])
    return steps[steps > 0].median().item()


def test_the_value_model_steps_at_its_own_rate(trained):
    """Adam's first step moves each parameter by about its learning rate: the value model's by 1e-3, the policy's
    by 1e-5 (the median over the parameters that moved)."""
    trainer, wrapper, before, _ = trained
    rates = sorted({group["lr"] for group in trainer.optimizer.param_groups})
    assert rates == [1e-5, 1e-3]
    assert median_step(wrapper.value_model.parameters(), before) == pytest.approx(1e-3, rel=0.05)
    assert median_step(wrapper.policy.parameters(), before) == pytest.approx(1e-5, rel=0.05)
    assert update_logs(trainer)[0]["lr"] == 1e-5  # `lr` stays the policy's


def test_the_health_metrics_are_those_of_the_rollout(trained):
    trainer, _, _, rollout = trained
    mask = ~rollout.padding_mask_p1
    returns, errors = rollout.returns[mask].double(), (rollout.returns - rollout.values)[mask].double()
    log = update_logs(trainer)[0]
    expected = 1 - errors.var(unbiased=False) / returns.var(unbiased=False)
    assert log["critic/vf_explained_var"] == pytest.approx(expected.item(), rel=1e-6)
    assert log["critic/value_rmse"] == pytest.approx(errors.pow(2).mean().sqrt().item(), rel=1e-6)
    assert not [key for key in log if "/turn_" in key]  # one turn: no per-turn keys


def test_on_a_shared_base_the_value_adapter_gets_the_critic_rate(tiny_models):
    """The value model as an adapter on the policy's base: its adapter and head in the value groups, the policy's
    adapter in the policy groups; one Adam step moves each by its own rate."""
    from peft import LoraConfig, get_peft_model

    from trl_ext.models.shared_base import add_scalar_adapter
    from trl_ext.ppo.objective.critic_warmup import with_critic_learning_rate

    policy = load_models(tiny_models)[0]
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    policy = get_peft_model(policy, lora)
    value = add_scalar_adapter(policy, "value", lora_config=lora, trainable=True)
    wrapper = torch.nn.ModuleDict({"policy": policy, "value_model": value})
    trained = [p for p in wrapper.parameters() if p.requires_grad]
    optimizer = with_critic_learning_rate(torch.optim.AdamW(trained, lr=1e-5, weight_decay=0.0), wrapper, 1e-3)
    assert [group["lr"] for group in optimizer.param_groups] == [1e-5, 1e-3]
    names = {id(p): n for n, p in wrapper.named_parameters()}
    value_names = [names[id(p)] for p in optimizer.param_groups[1]["params"]]
    assert value_names and all(".value." in n or n.startswith("value_model.") for n in value_names)
    assert all(".default." in names[id(p)] for p in optimizer.param_groups[0]["params"])
    before = {id(p): p.detach().clone() for p in trained}
    for p in trained:
        p.grad = torch.randn_like(p)
    optimizer.step()
    assert median_step(optimizer.param_groups[1]["params"], before) == pytest.approx(1e-3, rel=0.05)
    assert median_step(optimizer.param_groups[0]["params"], before) == pytest.approx(1e-5, rel=0.05)
