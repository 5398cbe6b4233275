"""PPO loss terms, GAE and KL controllers against hand-computed numbers."""

import pytest
import torch

from trl_ext.ppo.objective.kl_controllers import (
    AdaptiveKLController,
    DoublingKLController,
    FixedKLController,
    KLController,
    build_kl_controller,
)
from loss_references import policy_loss
from trl_ext.ppo.objective.advantages import gae_advantages
from trl_ext.ppo.objective.losses import ptx_lm_loss, value_loss

# Value loss, eps = 0.2. Token 0: V=1, V_old=0.5, R=0 -> V_clip=0.7, l1=1, l2=0.49 (unclipped error larger).
# Token 1: V=2.5, V_old=2, R=3 -> V_clip=2.2, l1=0.25, l2=0.64 (clipping increases the error).
# Token 2 is masked out (huge numbers that would show if it leaked in).
VPRED = torch.tensor([[1.0, 2.5, 100.0]])
OLD_V = torch.tensor([[0.5, 2.0, -100.0]])
RET = torch.tensor([[0.0, 3.0, 50.0]])
MASK = torch.tensor([[True, True, False]])


@pytest.mark.parametrize(
    "mode,loss,clipfrac",
    [
        ("max", 0.5 * (1.0 + 0.64) / 2, 0.5),  # 0.41
        ("mean", 0.5 * ((1.0 + 0.49) / 2 + (0.25 + 0.64) / 2) / 2, 0.5),  # 0.2975
        ("none", 0.5 * (1.0 + 0.25) / 2, 0.0),  # 0.3125
    ],
)
def test_value_loss_modes(mode, loss, clipfrac):
    out = value_loss(VPRED, OLD_V, RET, MASK, cliprange_value=0.2, mode=mode)
    assert out.loss.item() == pytest.approx(loss, abs=1e-6)
    assert out.clipfrac.item() == pytest.approx(clipfrac)


def test_value_loss_gradient_and_bad_mode():
    vpred = VPRED.clone().requires_grad_(True)
    value_loss(vpred, OLD_V, RET, MASK, 0.2, "none").loss.backward()
    # d/dV of 0.5 * mean((V-R)^2) over 2 tokens = (V - R) / 2
    assert vpred.grad.tolist()[0] == pytest.approx([0.5, -0.25, 0.0])
    with pytest.raises(ValueError, match="value_clip"):
        value_loss(VPRED, OLD_V, RET, MASK, 0.2, "min")


def test_policy_loss_hand_computed():
    # ratios 1.5, 0.5, 1.1 with advantages 1, -2, 1 and eps 0.2:
    # t0: max(-1.5, -1.2) = -1.2 (clipped), t1: max(1.0, 1.6) = 1.6 (clipped), t2: -1.1 (inside the range)
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -2.0, 1.0]])
    out = policy_loss(new, old, adv, torch.ones(1, 3, dtype=torch.bool), cliprange=0.2)
    assert out.loss.item() == pytest.approx((-1.2 + 1.6 - 1.1) / 3, abs=1e-6)
    assert out.clipfrac.item() == pytest.approx(2 / 3)
    assert out.ratio.tolist()[0] == pytest.approx([1.5, 0.5, 1.1])
    # 0.5 * mean(log-ratio^2) = 0.5 * (0.405465^2 + 0.693147^2 + 0.0953102^2) / 3
    assert out.approxkl.item() == pytest.approx(0.108990, abs=1e-5)
    masked = policy_loss(new, old, adv, torch.tensor([[True, True, False]]), cliprange=0.2)
    assert masked.loss.item() == pytest.approx(0.2, abs=1e-6) and masked.clipfrac.item() == 1.0


def test_ptx_lm_loss_hand_computed():
    ln3 = torch.log(torch.tensor(3.0)).item()
    # vocab of 2; logits [0, ln 3] give p = (0.25, 0.75), [ln 3, 0] give (0.75, 0.25)
    logits = torch.tensor(
        [
            [[0.0, ln3], [0.0, 0.0], [0.0, 0.0]],  # row 0: predicts 1 (p .75); next target masked
            [[0.0, ln3], [ln3, 0.0], [0.0, 0.0]],  # row 1: predicts 0 (p .25), then 1 (p .25)
        ]
    )
    input_ids = torch.tensor([[0, 1, 0], [1, 0, 1]])
    attention_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    expected = (0.287682 + 1.386294 + 1.386294) / 3  # -ln .75, -ln .25, -ln .25
    assert ptx_lm_loss(logits, input_ids, attention_mask).item() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    "gamma,lam,advantages,returns",
    [
        # lam 0.5: deltas (0, 0, 0.5) -> A = (0.125, 0.25, 0.5); R = A + V
        (1.0, 0.5, [0.125, 0.25, 0.5], [0.625, 0.75, 1.0]),
        # gamma 0.9, lam 1: deltas (-0.05, -0.05, 0.5) -> A = (0.31, 0.4, 0.5); R = discounted return-to-go
        (0.9, 1.0, [0.31, 0.4, 0.5], [0.81, 0.9, 1.0]),
    ],
)
def test_gae_hand_computed(gamma, lam, advantages, returns):
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.5, 0.5]])
    adv, ret = gae_advantages(rewards, values, gamma, lam)
    assert adv.tolist()[0] == pytest.approx(advantages, abs=1e-6)
    assert ret.tolist()[0] == pytest.approx(returns, abs=1e-6)


def test_fixed_controller():
    ctl = FixedKLController(0.05)
    ctl.update(100.0, 64)
    assert ctl.value == 0.05


@pytest.mark.parametrize(
    "kl,expected",
    [
        (9.0, 0.2 * (1 + 0.2 * 256 / 10000)),  # error 0.5 clipped to 0.2 -> 0.201024
        (6.6, 0.2 * (1 + 0.1 * 256 / 10000)),  # error 0.1 -> 0.200512
        (0.0, 0.2 * (1 - 0.2 * 256 / 10000)),  # error -1 clipped to -0.2 -> 0.198976
        (6.0, 0.2),
    ],
)
def test_adaptive_controller(kl, expected):
    ctl = AdaptiveKLController(0.2, target=6.0, horizon=10000)
    ctl.update(kl, 256)
    assert ctl.value == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("kl,expected", [(3.9, 0.1), (4.0, 0.2), (5.0, 0.2), (9.0, 0.2), (9.1, 0.4)])
def test_doubling_controller_paper_order(kl, expected):
    # Schulman et al. 2017 sec. 4 with target 6: halve below 6/1.5 = 4, double above 6*1.5 = 9
    ctl = DoublingKLController(0.2, target=6.0)
    ctl.update(kl, 256)
    assert ctl.value == pytest.approx(expected)


def test_controller_state_roundtrip_and_factory():
    ctl = build_kl_controller("adaptive", 0.1, target=2.0, horizon=100)
    ctl.update(5.0, 10)
    state = ctl.state_dict()
    assert state == {"value": pytest.approx(0.1 * 1.02), "target": 2.0, "horizon": 100}
    other = build_kl_controller("adaptive", 0.5, target=1.0, horizon=1)
    other.load_state_dict(state)
    assert other.value == ctl.value and other.target == 2.0 and other.horizon == 100
    assert isinstance(build_kl_controller("doubling", 0.1), DoublingKLController)
    assert isinstance(build_kl_controller("fixed", 0.1), KLController)
    with pytest.raises(ValueError, match="kl_controller"):
        build_kl_controller("pid", 0.1)


def test_controller_defaults_and_repr():
    """TRL's PPO defaults (target 6, horizon 10000) when a controller is built without them; repr shows the state."""
    ctl = build_kl_controller("adaptive", 0.1)
    assert (ctl.target, ctl.horizon) == (6.0, 10000)
    assert build_kl_controller("doubling", 0.1).target == 6.0
    assert repr(ctl) == "AdaptiveKLController(value=0.1, target=6.0, horizon=10000)"
