"""The policy objectives of trl_ext.ppo.objective.objectives against hand-computed numbers: loss aggregation with unequal
lengths and masked tokens (and exactness over gradient accumulation), clipped / asymmetric / dual / two-sided / CISPO
losses and their gradients at and beyond both clip edges, GSPO's sequence ratio, KL estimators, entropy, dynamic
sampling's group filter, and the config's refusals."""

from __future__ import annotations

import math
import types

import pytest
import torch

from trl_ext.ppo.objective.objectives import (
    ObjectiveConfig,
    aggregate,
    clipped_policy_loss,
    global_token_normalizer,
    kl_loss_per_token,
    kl_penalty,
    loss_mask,
    mini_batch_token_normalizer,
    objective_metrics,
    objective_terms,
    token_entropy,
)

MASKED = 100.0  # a value on masked positions: any leak shows


def unequal():
    """Two rows: losses 1, 2, 3 (3 tokens) and 4 (1 token); masked positions hold 100."""
    losses = torch.tensor([[1.0, 2.0, 3.0, MASKED], [4.0, MASKED, MASKED, MASKED]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False]])
    return losses, mask


def test_aggregations_with_unequal_lengths_and_masked_tokens():
    losses, mask = unequal()
    assert aggregate(losses, mask, "token_mean", 4).item() == pytest.approx(10 / 4)
    assert aggregate(losses, mask, "seq_mean_token_mean", 4).item() == pytest.approx((2 + 4) / 2)
    assert aggregate(losses, mask, "seq_mean_token_sum_norm", 4).item() == pytest.approx(10 / (2 * 4))
    assert aggregate(losses, mask, "global_token_mean", 4, torch.tensor(5.0)).item() == pytest.approx(10 / 5)
    empty = torch.zeros_like(mask)  # e.g. every completion truncated and masked: 0, not NaN
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"):
        assert aggregate(losses, empty, mode, 4).item() == 0.0
    with pytest.raises(ValueError, match="token_normalizer"):
        aggregate(losses, mask, "global_token_mean", 4)


def test_dr_grpo_divides_by_response_length_not_by_the_padded_width():
    """Responses are padded to the longest in the chunk, so a micro-batch is often narrower than `response_length`:
    Dr. GRPO's constant is still `B * response_length` (10 / (2 * 8)), not `B * width` (10 / (2 * 4))."""
    losses, mask = unequal()
    assert aggregate(losses, mask, "seq_mean_token_sum_norm", 8).item() == pytest.approx(10 / 16)
    wide = torch.cat([losses, torch.full((2, 4), MASKED)], 1), torch.cat([mask, torch.zeros(2, 4, dtype=bool)], 1)
    assert aggregate(*wide, "seq_mean_token_sum_norm", 8).item() == pytest.approx(10 / 16)  # same loss padded to 8


def test_global_token_mean_is_exact_over_gradient_accumulation():
    """Micro-batches of 3 and 1 tokens, accumulated over G = 2 (accelerate divides each loss by G): the step's loss is
    the token mean of the whole mini-batch, 10/4; `token_mean` gives the mean of the micro-batch means, 3."""
    losses, mask = unequal()
    normalizer = global_token_normalizer(mask, gradient_accumulation_steps=2)
    assert normalizer.item() == 4 / 2
    step = sum(aggregate(losses[i : i + 1], mask[i : i + 1], "global_token_mean", 4, normalizer) / 2 for i in (0, 1))
    assert step.item() == pytest.approx(10 / 4)
    per_micro = sum(aggregate(losses[i : i + 1], mask[i : i + 1], "token_mean", 4) / 2 for i in (0, 1))
    assert per_micro.item() == pytest.approx((2 + 4) / 2)


# ratio, advantage -> per-token loss, d loss / d log pi (one token alone), with eps_low 0.2 and eps_high 0.28
CLIP_CASES = [
    (1.0, 1.0, -1.0, -1.0),
    (1.2, 1.0, -1.2, -1.2),  # inside the asymmetric range (a symmetric 0.2 would clip here)
    (1.5, 1.0, -1.28, 0.0),  # beyond the upper edge, A > 0: clipped, no gradient
    (0.5, 1.0, -0.5, -0.5),  # below the lower edge, A > 0: the lower clip does not bind
    (0.5, -1.0, 0.8, 0.0),  # beyond the lower edge, A < 0: clipped
    (0.9, -1.0, 0.9, 0.9),
    (1.5, -1.0, 1.5, 1.5),  # above the upper edge, A < 0: not clipped (PPO's pessimism)
    (4.0, -2.0, 8.0, 8.0),  # far above: unbounded without dual clip
]


def one_token(ratio, advantage, dtype=torch.float64):
    new = torch.tensor([[math.log(ratio)]], dtype=dtype, requires_grad=True)
    return new, torch.zeros((1, 1), dtype=dtype), torch.tensor([[advantage]], dtype=dtype), torch.ones((1, 1), dtype=torch.bool)


@pytest.mark.parametrize("ratio, advantage, loss, grad", CLIP_CASES)
def test_clip_higher_loss_and_gradient(ratio, advantage, loss, grad):
    cfg = ObjectiveConfig(cliprange_low=0.2, cliprange_high=0.28)
    new, old, adv, mask = one_token(ratio, advantage)
    out = clipped_policy_loss(new, old, adv, mask, cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss)
    assert new.grad.item() == pytest.approx(grad)  # d(-A r)/d log pi = -A r where unclipped
    assert out.clipfrac.item() == (1.0 if grad == 0 else 0.0)
    assert set(out.stats) == {"policy/clipfrac_low", "policy/clipfrac_high"}
    assert out.stats["policy/clipfrac_high"].item() == (1.0 if ratio > 1.28 and advantage > 0 else 0.0)
    assert out.stats["policy/clipfrac_low"].item() == (1.0 if ratio < 0.8 and advantage < 0 else 0.0)


@pytest.mark.parametrize("ratio, advantage, loss, grad", [
    (4.0, -2.0, 6.0, 0.0),  # dual clip c = 3: loss <= -c A = 6, no gradient
    (2.5, -2.0, 5.0, 5.0),  # below the dual bound: PPO's loss
    (4.0, 2.0, -2.56, 0.0),  # A > 0 untouched
])
def test_dual_clip(ratio, advantage, loss, grad):
    cfg = ObjectiveConfig(cliprange_low=0.2, cliprange_high=0.28, dual_clip=3.0)
    new, old, adv, mask = one_token(ratio, advantage)
    out = clipped_policy_loss(new, old, adv, mask, cfg)
    out.loss.backward()
    assert (out.loss.item(), new.grad.item()) == (pytest.approx(loss), pytest.approx(grad))
    assert out.stats["policy/dual_clipfrac"].item() == (1.0 if loss == 6.0 else 0.0)


def test_delta_caps_the_unclipped_ratio():
    """INTELLECT-2's two-sided clip (TRL's delta = 3): A < 0 and r = 4: min(r, delta) = 3, so the loss is 3 |A|."""
    cfg = ObjectiveConfig(cliprange_low=0.2, cliprange_high=0.2, delta=3.0)
    new, old, adv, mask = one_token(4.0, -1.0)
    out = clipped_policy_loss(new, old, adv, mask, cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(3.0) and new.grad.item() == 0.0
    new, old, adv, mask = one_token(2.0, -1.0)  # under delta: PPO's loss and gradient
    out = clipped_policy_loss(new, old, adv, mask, cfg)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(2.0) and new.grad.item() == pytest.approx(2.0)


@pytest.mark.parametrize("ratio, advantage", [(1.5, 1.0), (1.1, 1.0), (0.5, -1.0), (3.0, -1.0)])
def test_cispo_clips_the_weight_and_keeps_every_gradient(ratio, advantage):
    """-sg(min(r, 1 + eps_high)) A log pi: value with log pi_old = 0 is -w A log r, the gradient -w A, nonzero even
    where the weight is clipped (r = 1.5, 3.0 > 1.28)."""
    cfg = ObjectiveConfig(cliprange_high=0.28, policy_loss="cispo")
    new, old, adv, mask = one_token(ratio, advantage)
    out = clipped_policy_loss(new, old, adv, mask, cfg)
    out.loss.backward()
    weight = min(ratio, 1.28)
    assert out.loss.item() == pytest.approx(-weight * advantage * math.log(ratio))
    assert new.grad.item() == pytest.approx(-weight * advantage)
    assert out.stats["policy/cispo_clipfrac"].item() == (1.0 if ratio > 1.28 and advantage > 0 else 0.0)


def test_gspo_sequence_ratio_is_clipped_per_sequence():
    """Row 1: log-ratios log 1.5, 0 -> s = sqrt(1.5) = 1.2247 > 1.2: clipped (loss -1.2 per token, no gradient).
    Row 2: log 1.1, log 0.9, one masked token (100) -> s = sqrt(0.99): unclipped; its two tokens each lose -A s, and s
    moves with both: d/d log pi_t = 2 * (-A s / 2) / 4 over the 4 counted tokens (token mean)."""
    cfg = ObjectiveConfig(ratio_level="sequence")
    new = torch.tensor([[math.log(1.5), 0.0, 0.0], [math.log(1.1), math.log(0.9), MASKED]], dtype=torch.float64,
                       requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, True, False]])
    adv = torch.ones((2, 3), dtype=torch.float64)
    out = clipped_policy_loss(new, torch.zeros_like(new), adv, mask, cfg)
    out.loss.backward()
    s2 = math.sqrt(0.99)
    assert out.loss.item() == pytest.approx((2 * -1.2 + 2 * -s2) / 4)
    assert new.grad[0].tolist() == [0.0, 0.0, 0.0]
    assert new.grad[1].tolist() == pytest.approx([-s2 / 4, -s2 / 4, 0.0])
    assert out.ratio[0].tolist() == pytest.approx([math.sqrt(1.5)] * 3)
    assert out.clipfrac.item() == pytest.approx(0.5)


def test_kl_estimators():
    """pi = 0.5, pi_ref = 0.25 at the token: log r = log 0.5."""
    logp, ref = torch.tensor([[math.log(0.5)]]), torch.tensor([[math.log(0.25)]])
    ln2 = math.log(2)
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(ln2)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(0.5 * ln2**2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + ln2)
    assert kl_penalty(logp, ref, "low_var_kl").item() == pytest.approx(0.5 - 1 + ln2)
    assert kl_loss_per_token(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + ln2)
    far = torch.tensor([[-30.0]])  # log r = -30: k3 = e^-30 + 29; low_var_kl clamps log r to -20, then k3 to 10
    assert kl_penalty(torch.zeros((1, 1)), far, "k3").item() == pytest.approx(29.0)
    assert kl_penalty(torch.zeros((1, 1)), far, "low_var_kl").item() == 10.0
    with pytest.raises(ValueError, match="kl_estimator: unknown value 'k4'"):
        kl_penalty(logp, ref, "k4")


def test_token_entropy_value_and_gradient():
    logits = torch.tensor([[[0.0, math.log(3.0)]]], dtype=torch.float64)  # p = (1/4, 3/4)
    assert token_entropy(logits).item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    assert torch.autograd.gradcheck(token_entropy, (torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True),))


def test_defaults_are_todays_loss_bit_for_bit():
    from loss_references import kl_loss_k3, policy_loss

    gen = torch.Generator().manual_seed(0)
    new, old, ref = (torch.randn(4, 6, generator=gen) * 0.3 for _ in range(3))
    adv, mask = torch.randn(4, 6, generator=gen), torch.rand(4, 6, generator=gen) > 0.3
    terms = objective_terms(ObjectiveConfig(kl_in_loss=True), new, old, adv, mask, ref, kl_coef=0.05)
    today = policy_loss(new, old, adv, mask, 0.2)
    assert torch.equal(terms.policy.loss, today.loss) and torch.equal(terms.policy.clipfrac, today.clipfrac)
    assert torch.equal(terms.kl_loss, kl_loss_k3(new, ref, mask)) and torch.equal(terms.penalty, 0.05 * terms.kl_loss)
    assert terms.policy.stats == {} and terms.entropy is None


def test_entropy_bonus_and_kl_share_the_aggregation():
    losses, mask = unequal()
    logits = torch.zeros(2, 4, 3)  # uniform over 3 tokens: entropy log 3 everywhere
    cfg = ObjectiveConfig(entropy_coef=0.1, kl_in_loss=True, loss_kl_estimator="k1",
                          loss_aggregation="seq_mean_token_sum_norm", response_length=4)
    new, ref = torch.zeros(2, 4), -losses  # k1 = log pi - log pi_ref = the losses above
    terms = objective_terms(cfg, new, new, torch.zeros(2, 4), mask, ref, kl_coef=0.5, logits=logits)
    assert terms.kl_loss.item() == pytest.approx(10 / 8)
    assert terms.entropy_loss.item() == pytest.approx(4 * math.log(3) / 8)
    assert terms.penalty.item() == pytest.approx(0.5 * 10 / 8 - 0.1 * 4 * math.log(3) / 8)


def test_bias_corrected_kl_is_weighted_by_the_ratio():
    """r = 2 (log pi = log 2, log pi_old = 0), log pi_ref = 0: k3 = 1/2 - 1 + log 2; corrected: 2 * k3."""
    new = torch.tensor([[math.log(2.0)]], dtype=torch.float64)
    zero, mask = torch.zeros((1, 1), dtype=torch.float64), torch.ones((1, 1), dtype=torch.bool)
    k3 = 0.5 - 1 + math.log(2)
    for corrected, expected in ((False, k3), (True, 2 * k3)):
        cfg = ObjectiveConfig(kl_in_loss=True, use_bias_correction_kl=corrected)
        assert objective_terms(cfg, new, zero, zero, mask, zero, kl_coef=1.0).kl_loss.item() == pytest.approx(expected)


def test_groups_of_equal_scores_are_the_uninformative_ones():
    from trl_ext.ppo.rollout.dynamic_sampling import informative_groups

    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0, -1.0, 3.0])
    assert informative_groups(scores, 2).tolist() == [False, True, False, True]
    assert informative_groups(scores, 4).tolist() == [True, True]


@pytest.mark.parametrize("overrides, message", [
    (dict(loss_aggregation="sum"), "loss_aggregation: invalid choice 'sum' \\(valid: one of token_mean, global_token_mean"),
    (dict(kl_estimator="k4"), "kl_estimator: invalid choice 'k4' \\(valid: one of k1, k2, k3, low_var_kl\\)"),
    (dict(ratio_level="group"), "ratio_level: invalid choice 'group'"),
    (dict(policy_loss="sapo"), "policy_loss: invalid choice 'sapo'"),
    (dict(cliprange_low=1.5), "cliprange_low: 1.5 is out of range \\(valid: a number in \\[0, 1\\]\\)"),
    (dict(cliprange_high=-0.1), "cliprange_high: -0.1 is out of range \\(valid: a number >= 0\\)"),
    (dict(dual_clip=1.0), "dual_clip: 1.0 is out of range \\(valid: a number > 1\\)"),
    (dict(dual_clip=3.0, policy_loss="cispo"), "dual_clip: bounds the clipped surrogate; policy_loss 'cispo'"),
    (dict(delta=1.25, cliprange_high=0.28), "delta: must exceed 1 \\+ cliprange_high = 1.28"),
    (dict(entropy_coef=-0.01), "entropy_coef: -0.01 is out of range \\(valid: a number >= 0\\)"),
    (dict(use_bias_correction_kl=True), "use_bias_correction_kl: corrects the KL term of the loss; kl_in is 'reward'"),
    (dict(mask_truncated_completions=True, stop_token=None), "mask_truncated_completions: needs a stop token"),
    (dict(max_sampling_rounds=0), "max_sampling_rounds: 0 is out of range \\(valid: an integer >= 1\\)"),
    (dict(dynamic_sampling=True), "dynamic_sampling: drops groups of equal scores, which needs a group "
     "advantage_estimator \\(rloo, grpo, reinforce_pp_baseline\\), not 'gae'"),
    (dict(dynamic_sampling=True, advantage_estimator="reinforce_pp"), "dynamic_sampling: .* not 'reinforce_pp'"),
])
def test_config_refuses_impossible_objectives_in_one_line(tmp_path, overrides, message):
    from ppo_helpers import config_kwargs

    import trl_ext
    from trl_ext.errors import UserInputError

    with pytest.raises(UserInputError, match=f"^{message}") as caught:
        trl_ext.PPOConfig(**config_kwargs(tmp_path, **overrides))
    assert "\n" not in str(caught.value)


def test_objective_config_resolves_the_defaults(tmp_path):
    from ppo_helpers import config_kwargs

    import trl_ext

    cfg = ObjectiveConfig.from_args(trl_ext.PPOConfig(**config_kwargs(tmp_path, cliprange=0.1, cliprange_high=0.3)))
    assert (cfg.cliprange_low, cfg.cliprange_high, cfg.reward_kl_estimator, cfg.loss_kl_estimator) == (0.1, 0.3, "k1",
                                                                                                         "k3")
    cfg = ObjectiveConfig.from_args(trl_ext.PPOConfig(**config_kwargs(tmp_path, kl_estimator="low_var_kl")))
    assert cfg.reward_kl_estimator == cfg.loss_kl_estimator == "low_var_kl" and cfg.response_length == 8


@pytest.mark.parametrize("key, values", [
    ("loss_aggregation", ("token_mean", "global_token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")),
    ("policy_loss", ("clipped", "cispo")),
    ("ratio_level", ("token", "sequence")),
    ("dual_clip", (None, 2.5)),
    ("delta", (None, 1.5)),
    ("entropy_coef", (0.0, 0.05)),
    ("use_bias_correction_kl", (False, True)),
    ("mask_truncated_completions", (False, True)),
    ("response_length", (8, 13)),
])
def test_objective_config_keeps_every_value_of_each_key(tmp_path, key, values):
    """Each value of each objective key reaches the loss: `from_args` passes it through unchanged."""
    from ppo_helpers import config_kwargs

    import trl_ext

    critic_free = dict(kl_in="loss", advantage_estimator="grpo", num_samples_per_prompt=2)  # the correction's KL
    extra = critic_free if key == "use_bias_correction_kl" else {}
    for value in values:
        cfg = ObjectiveConfig.from_args(trl_ext.PPOConfig(**config_kwargs(tmp_path, **extra, **{key: value})))
        assert getattr(cfg, key) == value, (key, value)


def test_objective_config_defaults_are_those_of_ppo_config(tmp_path):
    """`ObjectiveConfig()` (what the pure functions' tests build) is the objective of a default `PPOConfig`."""
    import trl_ext

    args = trl_ext.PPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    assert ObjectiveConfig.from_args(args) == ObjectiveConfig()
    assert ObjectiveConfig().response_length == args.response_length == 53
    kl_in_loss = ObjectiveConfig.from_args(trl_ext.PPOConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False, kl_in="loss",
        advantage_estimator="grpo", num_samples_per_prompt=2))
    assert kl_in_loss.kl_in_loss and not ObjectiveConfig().kl_in_loss


def tokens(ratios, advantages, new_logprobs=None):
    """One row of tokens with these ratios (log pi_old = log pi - log r) and advantages, float64."""
    new = torch.tensor([new_logprobs or [-1.0] * len(ratios)], dtype=torch.float64)
    old = new - torch.tensor([ratios], dtype=torch.float64).log()
    return new, old, torch.tensor([advantages], dtype=torch.float64), torch.ones((1, len(ratios)), dtype=torch.bool)


def test_cispo_scales_with_the_advantage_and_counts_the_clipped_weights():
    """Advantages other than +-1: -min(r, 1.28) * A * log pi per token; the weight is clipped where r > 1.28 (the
    clip fraction), the CISPO share counts those with A > 0."""
    new, old, adv, mask = tokens([0.5, 1.5, 2.0, 1.4], [2.0, 3.0, -0.5, 0.0], [-1.0, -2.0, -0.5, -3.0])
    out = clipped_policy_loss(new, old, adv, mask, ObjectiveConfig(cliprange_high=0.28, policy_loss="cispo"))
    per_token = [-0.5 * 2.0 * -1.0, -1.28 * 3.0 * -2.0, -1.28 * -0.5 * -0.5, 0.0]
    assert out.loss.item() == pytest.approx(sum(per_token) / 4)
    assert out.clipfrac.item() == pytest.approx(3 / 4)
    assert out.stats["policy/cispo_clipfrac"].item() == pytest.approx(1 / 4)


def test_dual_clip_bounds_only_negative_advantages():
    """c = 3: A = 0.5 (0 < A < 1) and A = 0 keep PPO's loss; A = -0.5 at r = 4 is bounded to 1.5."""
    new, old, adv, mask = tokens([1.0, 1.0, 4.0], [0.5, 0.0, -0.5])
    out = clipped_policy_loss(new, old, adv, mask, ObjectiveConfig(dual_clip=3.0))
    assert out.loss.item() == pytest.approx((-0.5 + 0.0 + 1.5) / 3)
    assert out.stats["policy/dual_clipfrac"].item() == pytest.approx(1 / 3)


def test_clip_shares_leave_out_zero_and_small_advantages_of_the_wrong_sign():
    """clipfrac_low: r < 0.8 and A < 0; clipfrac_high: r > 1.28 and A > 0. A = 0 (a group of equal scores) and a
    small advantage of the other sign count in neither."""
    cfg = ObjectiveConfig(cliprange_low=0.2, cliprange_high=0.28)
    new, old, adv, mask = tokens([0.5, 0.5, 0.5, 2.0, 2.0, 2.0], [-1.0, 0.0, 0.5, 1.0, 0.0, -0.5])
    stats = clipped_policy_loss(new, old, adv, mask, cfg).stats
    assert stats["policy/clipfrac_low"].item() == pytest.approx(1 / 6)
    assert stats["policy/clipfrac_high"].item() == pytest.approx(1 / 6)
    stats = clipped_policy_loss(new, old, adv, mask, ObjectiveConfig(cliprange_high=0.28, policy_loss="cispo")).stats
    assert stats["policy/cispo_clipfrac"].item() == pytest.approx(1 / 6)


def test_approxkl_is_half_the_mean_squared_log_ratio():
    new, old, adv, mask = tokens([math.e, 1.0, math.exp(-2.0)], [1.0, 1.0, 1.0])
    assert clipped_policy_loss(new, old, adv, mask, ObjectiveConfig()).approxkl.item() == pytest.approx(
        0.5 * (1 + 0 + 4) / 3)


def test_gspo_ratio_of_a_one_token_sequence_is_its_token_ratio():
    new, old, adv, mask = tokens([1.1, 7.0], [1.0, 1.0])
    mask[0, 1] = False  # one counted token
    out = clipped_policy_loss(new, old, adv, mask, ObjectiveConfig(ratio_level="sequence"))
    assert out.ratio[0].tolist() == pytest.approx([1.1, 1.1])
    assert out.loss.item() == pytest.approx(-1.1)


def test_global_token_normalizer_counts_every_process_and_one_token():
    one = torch.tensor([[True, False, False]])
    assert global_token_normalizer(one, gradient_accumulation_steps=2).item() == 0.5
    assert global_token_normalizer(torch.zeros_like(one), 2).item() == 0.5  # no token: clamped to 1 / G
    # two processes, the other with 3 tokens: N = 4 over G * P = 2 * 2 (accelerate's reduce of the count)
    two = types.SimpleNamespace(num_processes=2, reduce=lambda count, reduction: count + 3 if reduction == "sum" else 0)
    assert global_token_normalizer(one, 2, two).item() == 4 / 4


def test_loss_mask_and_mini_batch_normalizer_leave_out_truncated_completions():
    rollout = types.SimpleNamespace(padding_mask=torch.tensor([[False, False, True], [False, False, False],
                                                               [False, True, True]]),
                                    contain_eos_token=torch.tensor([True, False, True]))
    inds = [0, 1, 2]
    masked = ObjectiveConfig(mask_truncated_completions=True, loss_aggregation="global_token_mean")
    assert loss_mask(rollout.padding_mask, rollout.contain_eos_token, masked).tolist() == [
        [True, True, False], [False, False, False], [True, False, False]]
    assert loss_mask(rollout.padding_mask, rollout.contain_eos_token, ObjectiveConfig()).tolist() == [
        [True, True, False], [True, True, True], [True, False, False]]
    assert mini_batch_token_normalizer(masked, rollout, inds, 3).item() == pytest.approx(3 / 3)
    unmasked = ObjectiveConfig(loss_aggregation="global_token_mean")
    assert mini_batch_token_normalizer(unmasked, rollout, [1, 2], 1).item() == 4
    assert mini_batch_token_normalizer(ObjectiveConfig(), rollout, inds, 3) is None


def test_kl_term_is_off_without_a_kl_coef():
    new, old, adv, mask = tokens([1.0, 2.0], [1.0, -1.0])
    terms = objective_terms(ObjectiveConfig(kl_in_loss=True), new, old, adv, mask, old - 1.0)
    assert terms.kl_loss.item() > 0 and terms.penalty.item() == 0.0


def test_objective_metrics_average_the_statistics_and_add_sampling_and_truncation():
    from accelerate import Accelerator

    rollout = types.SimpleNamespace(sampling={"sampling/rounds": 2.0},
                                    contain_eos_token=torch.tensor([True, False, False, False]))
    stats = types.SimpleNamespace(objective={"policy/dual_clipfrac": [torch.tensor(0.25), torch.tensor(0.75)]})
    metrics = objective_metrics(rollout, stats, ObjectiveConfig(mask_truncated_completions=True),
                                Accelerator(cpu=True))
    assert metrics == {"policy/dual_clipfrac": 0.5, "sampling/rounds": 2.0, "objective/frac_truncated": 0.75}
    rollout.sampling = None
    assert objective_metrics(rollout, stats, ObjectiveConfig(), Accelerator(cpu=True)) == {
        "policy/dual_clipfrac": 0.5}


def test_rounds_of_different_prompt_and_response_lengths_join_as_the_trainer_pads():
    """Dynamic sampling joins rounds: queries left-padded to the longest context, responses and their per-token
    fields right-padded (pad token, INVALID_LOGPROB, value 0, padding masks True), per-episode lists and dicts kept
    in order, a per-process statistic averaged over the episodes."""
    from trl_ext.ppo.rollout.dynamic_sampling import concat_rollouts
    from trl_ext.ppo.rollout.containers import Rollout
    from trl_ext.ppo.rollout.sequences import INVALID_LOGPROB

    pad = 0

    def rollout(queries, responses, clipfrac, tag):
        n, t = responses.shape
        return Rollout(queries=queries, context_length=queries.shape[1], query_responses=torch.cat([queries,
                       responses], 1), responses=responses, logprobs=-torch.ones(n, t), ref_logprobs=-torch.ones(n, t),
                       values=torch.ones(n, t), scores=torch.arange(n).float(), padding_mask=torch.zeros(n, t,
                       dtype=torch.bool), contain_eos_token=torch.ones(n, dtype=torch.bool),
                       scores_clipfrac=torch.tensor(clipfrac), estimator_stats={"ids": [tag] * n})

    first = rollout(torch.tensor([[5, 6], [7, 8]]), torch.tensor([[9, 9, 9], [9, 9, 9]]), 0.5, "a")
    second = rollout(torch.tensor([[4, 4, 4, 4]] * 2), torch.tensor([[3], [3]]), 0.0, "b")
    joined = concat_rollouts([first, second], pad)
    assert joined.context_length == 4
    assert joined.queries.tolist() == [[0, 0, 5, 6], [0, 0, 7, 8], [4, 4, 4, 4], [4, 4, 4, 4]]
    assert joined.query_responses.tolist()[0] == [0, 0, 5, 6, 9, 9, 9]
    assert joined.query_responses.tolist()[2] == [4, 4, 4, 4, 3, 0, 0]
    assert joined.responses[2].tolist() == [3, pad, pad] and joined.logprobs[3].tolist() == [-1, INVALID_LOGPROB,
                                                                                             INVALID_LOGPROB]
    assert joined.values[3].tolist() == [1, 0, 0] and joined.padding_mask[3].tolist() == [False, True, True]
    assert joined.scores.tolist() == [0, 1, 0, 1] and joined.estimator_stats["ids"] == ["a", "a", "b", "b"]
    assert joined.scores_clipfrac.item() == pytest.approx(0.25)
