"""GRPO-style policy objectives as pure functions: KL estimators, clipped / CISPO surrogates with
asymmetric, dual and two-sided clipping, token or sequence ratios, loss aggregation, an entropy bonus.

:class:`ObjectiveConfig` holds the `PPOConfig` keys these read (built once, `trainer.objective`); the trainer's loss
step calls :func:`rollout_objective` (:func:`objective_terms` on a micro-batch of the rollout), ``optimize`` calls
:func:`mini_batch_token_normalizer` per mini-batch, ``compute_rewards`` calls :func:`kl_penalty` and
``update_metrics`` :func:`objective_metrics`. Dynamic sampling: :mod:`trl_ext.ppo.rollout.dynamic_sampling`. Per-token tensors
are ``(batch, T)`` and ``mask`` is True on the tokens that count. With every key at its default the arithmetic is
that of PPO's clipped surrogate and GRPO's k3 KL loss as tests/ppo/loss_references.py writes them out (same
operations, same order: bit for bit). TRL's `GRPOTrainer._compute_loss` gives the same losses and gradients for the
shared cases (tests/ppo/test_objectives_trl_parity.py; name map in docs/ppo.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple, get_args

import torch

from .losses import PolicyLoss

KLEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
LossAggregation = Literal["token_mean", "global_token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
RatioLevel = Literal["token", "sequence"]
PolicyLossName = Literal["clipped", "cispo"]
KL_ESTIMATORS = get_args(KLEstimator)
LOSS_AGGREGATIONS = get_args(LossAggregation)
RATIO_LEVELS = get_args(RatioLevel)
POLICY_LOSSES = get_args(PolicyLossName)


@dataclass(frozen=True)
class ObjectiveConfig:
    """The objective keys of a `PPOConfig` (documented there), resolved: no `None` left but `dual_clip`/`delta`."""

    cliprange_low: float = 0.2
    cliprange_high: float = 0.2
    dual_clip: float | None = None
    delta: float | None = None
    ratio_level: str = "token"
    policy_loss: str = "clipped"
    loss_aggregation: str = "token_mean"
    entropy_coef: float = 0.0
    reward_kl_estimator: str = "k1"
    """The KL in the reward and in `objective/kl` (what the KL controllers read)."""
    loss_kl_estimator: str = "k3"
    """The KL term of the loss (`kl_in="loss"`)."""
    kl_in_loss: bool = False
    use_bias_correction_kl: bool = False
    """The loss's KL term times the ratio (DeepSeek-V3.2; TRL's key of that name)."""
    mask_truncated_completions: bool = False
    response_length: int = 53
    """The constant of `seq_mean_token_sum_norm` (Dr. GRPO): the maximum response length."""

    @classmethod
    def from_args(cls, args) -> ObjectiveConfig:
        """From a validated :class:`trl_ext.PPOConfig`: `cliprange_low/high` default to `cliprange`; `kl_estimator`
        `None` is k1 in the reward (TRL's PPO) and k3 in the loss (GRPO), a value is used in both."""
        return cls(
            cliprange_low=args.cliprange if args.cliprange_low is None else args.cliprange_low,
            cliprange_high=args.cliprange if args.cliprange_high is None else args.cliprange_high,
            dual_clip=args.dual_clip, delta=args.delta, ratio_level=args.ratio_level, policy_loss=args.policy_loss,
            loss_aggregation=args.loss_aggregation, entropy_coef=args.entropy_coef,
            reward_kl_estimator=args.kl_estimator or "k1", loss_kl_estimator=args.kl_estimator or "k3",
            kl_in_loss=args.kl_in == "loss", use_bias_correction_kl=args.use_bias_correction_kl,
            mask_truncated_completions=args.mask_truncated_completions,
            response_length=args.response_length,
        )


# ------------------------------------------------------------------------------------------------------- KL


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of ``KL(pi || pi_ref)`` from samples of ``pi`` (Schulman 2020, "Approximating KL
    Divergence", http://joschu.net/blog/kl-approx.html), with ``log r = log pi_ref - log pi``:

    * ``k1 = -log r`` (unbiased, high variance; TRL's PPO default);
    * ``k2 = (log r)^2 / 2`` (biased; its gradient in a loss is the unbiased KL gradient, Tang & Munos 2025);
    * ``k3 = (r - 1) - log r`` (unbiased, non-negative; GRPO, Shao et al. 2024, eq. 4);
    * ``low_var_kl`` (verl): k3 of ``log r`` clamped to ``[-20, 20]``, then clamped to ``[-10, 10]``.

    k1 and k3 are computed in the operation order of TRL's PPO ``compute_rewards`` (bit for bit).
    """
    logr = ref_logprobs - logprobs
    if estimator == "k1":
        return -logr
    if estimator == "k2":
        return 0.5 * logr**2
    if estimator == "k3":
        return (logr.exp() - 1) - logr
    if estimator == "low_var_kl":
        logr = logr.clamp(-20, 20)
        return ((logr.exp() - 1) - logr).clamp(-10, 10)
    raise ValueError(f"kl_estimator: unknown value {estimator!r}; use one of {', '.join(KL_ESTIMATORS)}")


def kl_loss_per_token(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """:func:`kl_penalty` for the loss; k3 in the operation order of GRPO's loss (TRL's ``GRPOTrainer``, and
    ``kl_loss_k3`` of tests/ppo/loss_references.py): ``exp(log r) - log r - 1``."""
    if estimator == "k3":
        log_ratio = ref_logprobs - logprobs
        return torch.exp(log_ratio) - log_ratio - 1
    return kl_penalty(logprobs, ref_logprobs, estimator)


# ------------------------------------------------------------------------------------------------------- entropy


class _TokenEntropy(torch.autograd.Function):
    """``H = logsumexp(l) - sum(softmax(l) * l)`` per position; the backward recomputes ``p = softmax(l)`` from the
    logits (``dH/dl = p * (E_p[l] - l)``) instead of keeping a ``(batch, T, vocab)`` tensor alive until then."""

    @staticmethod
    def forward(ctx, logits):
        ctx.save_for_backward(logits)
        prob_dist = torch.nn.functional.softmax(logits, dim=-1)
        return torch.logsumexp(logits, dim=-1) - torch.sum(prob_dist * logits, dim=-1)

    @staticmethod
    def backward(ctx, grad_output):
        (logits,) = ctx.saved_tensors
        prob_dist = torch.nn.functional.softmax(logits, dim=-1)
        expected = torch.sum(prob_dist * logits, dim=-1, keepdim=True)
        return grad_output.unsqueeze(-1) * prob_dist * (expected - logits)


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each position's distribution ``(batch, T)`` from ``(batch, T, vocab)`` logits, differentiable;
    the formula (and values, bit for bit) of the `policy/entropy_avg` statistic."""
    return _TokenEntropy.apply(logits)


# ------------------------------------------------------------------------------------------------------- aggregation


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str, response_length: int,
              token_normalizer: torch.Tensor | None = None) -> torch.Tensor:
    """One micro-batch's loss from per-token losses ``L`` and ``mask`` ``M`` (``B`` rows):

    * ``token_mean`` (trl-ext/TRL PPO; TRL GRPO's ``bnpo``): ``sum(L*M) / sum(M)`` over this micro-batch;
    * ``global_token_mean`` (DAPO, Yu et al. 2025, eq. 8: one token-level mean over the batch; TRL's ``dapo``):
      ``sum(L*M) / token_normalizer``, with ``token_normalizer = N / (G * P)`` where ``N`` counts the tokens of the
      whole mini-batch on all ``P`` processes and ``G`` is `gradient_accumulation_steps` (see
      :func:`global_token_normalizer`): after accelerate's ``1/G`` and DDP's mean over processes the optimizer step
      sees exactly ``sum over the mini-batch of L*M / N``;
    * ``seq_mean_token_mean`` (GRPO, Shao et al. 2024, eq. 3; TRL's ``grpo``): ``mean_i(sum_t L*M / sum_t M)``;
    * ``seq_mean_token_sum_norm`` (Dr. GRPO, Liu et al. 2025, sec. 3.1; TRL's ``dr_grpo``):
      ``sum(L*M) / (B * response_length)``.

    The last two divide by constants per sequence (micro-batches all have ``B`` rows), so they too are exact over
    accumulation and processes. A row or micro-batch without counted tokens contributes 0.
    """
    if mode == "token_mean":  # masked_mean; the clamp only changes an empty micro-batch (0 instead of NaN)
        return (per_token * mask).sum() / mask.sum().clamp(min=1)
    if mode == "global_token_mean":
        if token_normalizer is None:
            raise ValueError("loss_aggregation 'global_token_mean' needs the mini-batch's token_normalizer")
        return (per_token * mask).sum() / token_normalizer
    if mode == "seq_mean_token_mean":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if mode == "seq_mean_token_sum_norm":
        return (per_token * mask).sum() / (per_token.shape[0] * response_length)
    raise ValueError(f"loss_aggregation: unknown value {mode!r}; use one of {', '.join(LOSS_AGGREGATIONS)}")


def global_token_normalizer(mini_batch_mask: torch.Tensor, gradient_accumulation_steps: int,
                            accelerator=None) -> torch.Tensor:
    """``N / (G * P)`` of ``global_token_mean``: ``N`` = counted tokens of this process's mini-batch summed over the
    ``P`` processes (``accelerator.reduce``; every process calls this for each mini-batch), clamped to 1."""
    count = mini_batch_mask.sum().float()
    processes = 1
    if accelerator is not None and accelerator.num_processes > 1:
        count = accelerator.reduce(count, reduction="sum")
        processes = accelerator.num_processes
    return count.clamp(min=1) / (gradient_accumulation_steps * processes)


# ------------------------------------------------------------------------------------------------------- policy


def clipped_policy_loss(new_logprobs, old_logprobs, advantages, mask, cfg: ObjectiveConfig,
                        token_normalizer=None) -> PolicyLoss:
    """Surrogate policy loss of ``cfg`` (to minimise), aggregated by :func:`aggregate`.

    Ratio: ``ratio_level="token"``: ``r_t = exp(log pi - log pi_old)`` (PPO); ``"sequence"`` (GSPO, Zheng et al.
    2025, eq. 7): ``s = exp(mean_t (log pi - log pi_old))`` over the counted tokens, one ratio per sequence applied to
    each of its tokens.

    ``policy_loss="clipped"`` (PPO, Schulman et al. 2017, eq. 7): ``L = max(-A * r', -A * clip(r, 1 - eps_low,
    1 + eps_high))`` with ``eps_low/high`` = `cliprange_low/high` (DAPO's clip-higher, Yu et al. 2025, sec. 3.1);
    ``r' = min(r, delta)`` with `delta` (INTELLECT-2's two-sided clip, TRL's ``delta``), else ``r' = r``; with
    `dual_clip` ``c`` (Ye et al. 2020, "Mastering Complex Control in MOBA Games", eq. 5), for ``A < 0``:
    ``L = min(L, -c * A)``.

    ``policy_loss="cispo"`` (MiniMax-M1, 2025, eq. 4; TRL's ``cispo``): ``L = -sg(min(r, 1 + eps_high)) * A *
    log pi``: the importance weight is clipped and its gradient stopped; every token keeps a gradient.

    ``clipfrac``: tokens where the clip binds (clipped: ``-A * clip(r) > -A * r'``; cispo: ``r > 1 + eps_high``).
    ``ratio`` is ``r`` per token (``s`` broadcast over the sequence for GSPO).
    """
    logprobs_diff = new_logprobs - old_logprobs
    if cfg.ratio_level == "sequence":
        seq_log_ratio = (logprobs_diff * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        ratio = torch.exp(seq_log_ratio).unsqueeze(-1).expand_as(logprobs_diff)
    else:
        ratio = torch.exp(logprobs_diff)
    high = 1.0 + cfg.cliprange_high
    if cfg.policy_loss == "cispo":
        per_token = -torch.clamp(ratio, max=high).detach() * advantages * new_logprobs
        binds = ratio > high
    else:
        pg_losses = -advantages * (ratio if cfg.delta is None else torch.clamp(ratio, max=cfg.delta))
        pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cfg.cliprange_low, high)
        per_token = torch.max(pg_losses, pg_losses2)
        binds = pg_losses2 > pg_losses
    dual_binds = None
    if cfg.dual_clip is not None:  # for A < 0: min(L, -c * A)
        bound = -cfg.dual_clip * advantages
        dual_binds = (advantages < 0) & (bound < per_token)
        per_token = torch.where(dual_binds, bound, per_token)
    loss = aggregate(per_token, mask, cfg.loss_aggregation, cfg.response_length, token_normalizer)
    with torch.no_grad():
        clipfrac = aggregate(binds.float(), mask, "token_mean", cfg.response_length)
        approxkl = 0.5 * (logprobs_diff**2).mean()
        extra = clip_statistics(ratio, advantages, mask, cfg, dual_binds)
    return PolicyLoss(loss, clipfrac, ratio, approxkl, extra)


def clip_statistics(ratio, advantages, mask, cfg: ObjectiveConfig, dual_binds=None) -> dict:
    """Token shares (over the counted tokens) of each clip that a non-default key turns on, named as the metrics:
    `policy/clipfrac_low` (``r < 1 - eps_low`` and ``A < 0``) and `policy/clipfrac_high` (``r > 1 + eps_high`` and
    ``A > 0``: TRL's ``clip_ratio/low_mean`` and ``high_mean``) with asymmetric clipping or GSPO, and
    `policy/dual_clipfrac` (``A < 0`` and the dual bound ``-c * A`` is the loss) with `dual_clip`, and
    `policy/cispo_clipfrac` (``r > 1 + eps_high`` and ``A > 0``, TRL's ``cispo_clip_ratio``) with CISPO."""
    stats = {}
    if cfg.policy_loss == "clipped" and (cfg.cliprange_low != cfg.cliprange_high or cfg.ratio_level == "sequence"):
        stats["policy/clipfrac_low"] = aggregate(((ratio < 1 - cfg.cliprange_low) & (advantages < 0)).float(), mask,
                                                 "token_mean", 1)
        stats["policy/clipfrac_high"] = aggregate(((ratio > 1 + cfg.cliprange_high) & (advantages > 0)).float(),
                                                  mask, "token_mean", 1)
    if cfg.policy_loss == "cispo":
        stats["policy/cispo_clipfrac"] = aggregate(((ratio > 1 + cfg.cliprange_high) & (advantages > 0)).float(),
                                                   mask, "token_mean", 1)
    if dual_binds is not None:
        stats["policy/dual_clipfrac"] = aggregate(dual_binds.float(), mask, "token_mean", 1)
    return stats


# ------------------------------------------------------------------------------------------------------- one step


class ObjectiveTerms(NamedTuple):
    policy: PolicyLoss
    penalty: torch.Tensor | None
    """``kl_coef * kl_loss - entropy_coef * entropy_loss`` (None when both are off): added to the policy loss."""
    kl_loss: torch.Tensor | None
    """The aggregated KL loss term before its coefficient (`kl_in="loss"`)."""
    entropy: torch.Tensor | None
    """Per-position entropy ``(batch, T)`` with its graph (`entropy_coef > 0`), for the loss and the statistic."""
    entropy_loss: torch.Tensor | None
    """The aggregated entropy before its coefficient (`entropy_coef > 0`)."""


def loss_mask(padding_mask: torch.Tensor, contain_eos_token: torch.Tensor, cfg: ObjectiveConfig) -> torch.Tensor:
    """The tokens the policy loss counts: the response tokens; with `mask_truncated_completions` (DAPO, sec. 3.4,
    overlong filtering; TRL's key) not those of completions without the stop token (cut at `response_length`)."""
    mask = ~padding_mask
    if cfg.mask_truncated_completions:
        mask = mask & contain_eos_token.unsqueeze(1)
    return mask


def objective_terms(cfg: ObjectiveConfig, new_logprobs, old_logprobs, advantages, mask, ref_logprobs=None,
                    kl_coef: float = 0.0, logits=None, token_normalizer=None) -> ObjectiveTerms:
    """The policy side of one micro-batch's loss: :func:`clipped_policy_loss` plus, aggregated the same way
    (:func:`aggregate`), ``kl_coef *`` the KL of ``cfg.loss_kl_estimator`` to ``ref_logprobs`` (when
    ``cfg.kl_in_loss``; with ``cfg.use_bias_correction_kl`` each token's KL times the policy's ratio ``r``, with its
    gradient: DeepSeek-V3.2's correction, which makes k3's gradient the unbiased reverse-KL gradient off-policy) and ``- entropy_coef *`` the entropy of ``logits`` (when ``cfg.entropy_coef > 0``; an
    entropy bonus, e.g. verl's ``entropy_coeff``). The trainer adds the value and ptx terms."""
    policy = clipped_policy_loss(new_logprobs, old_logprobs, advantages, mask, cfg, token_normalizer)
    penalty = kl_loss = entropy = entropy_loss = None
    if cfg.kl_in_loss:
        kl_per_token = kl_loss_per_token(new_logprobs, ref_logprobs, cfg.loss_kl_estimator)
        if cfg.use_bias_correction_kl:
            kl_per_token = kl_per_token * policy.ratio
        kl_loss = aggregate(kl_per_token, mask, cfg.loss_aggregation, cfg.response_length, token_normalizer)
        penalty = kl_coef * kl_loss
    if cfg.entropy_coef > 0:
        entropy = token_entropy(logits)
        entropy_loss = aggregate(entropy, mask, cfg.loss_aggregation, cfg.response_length, token_normalizer)
        bonus = -cfg.entropy_coef * entropy_loss
        penalty = bonus if penalty is None else penalty + bonus
    return ObjectiveTerms(policy, penalty, kl_loss, entropy, entropy_loss)


def rollout_objective(cfg: ObjectiveConfig, rollout, inds, new_logprobs, logits, kl_coef: float,
                      token_normalizer: torch.Tensor | None = None) -> ObjectiveTerms:
    """:func:`objective_terms` of the micro-batch ``inds`` of a :class:`~trl_ext.ppo.rollout.containers.Rollout` (old and
    reference log-probs, advantages, :func:`loss_mask`) under the current policy's ``new_logprobs`` and ``logits``,
    with this update's ``kl_coef`` and the current mini-batch's ``token_normalizer`` (the trainer's loss step)."""
    mask = loss_mask(rollout.padding_mask[inds], rollout.contain_eos_token[inds], cfg)
    return objective_terms(cfg, new_logprobs, rollout.logprobs[inds], rollout.advantages[inds], mask,
                           rollout.ref_logprobs[inds], kl_coef, logits, token_normalizer)


def mini_batch_token_normalizer(cfg: ObjectiveConfig, rollout, inds, gradient_accumulation_steps: int,
                                accelerator=None) -> torch.Tensor | None:
    """The :func:`global_token_normalizer` of the mini-batch ``inds`` with ``global_token_mean``, else None."""
    if cfg.loss_aggregation != "global_token_mean":
        return None
    mask = loss_mask(rollout.padding_mask[inds], rollout.contain_eos_token[inds], cfg)
    return global_token_normalizer(mask, gradient_accumulation_steps, accelerator)


def objective_metrics(rollout, stats, cfg: ObjectiveConfig, accelerator) -> dict:
    """The metrics of the non-default objective keys (means over micro-batches and processes): the clip shares of
    :func:`clip_statistics`, `loss/entropy_avg` (the entropy bonus term before `entropy_coef`) and, with
    `mask_truncated_completions`, `objective/frac_truncated` (the share of completions left out of the loss); the
    `sampling/*` metrics of `dynamic_sampling`."""
    gather = accelerator.gather_for_metrics
    metrics = {name: gather(torch.stack(values).mean()).mean().item() for name, values in stats.objective.items()}
    metrics.update(rollout.sampling or {})  # dynamic_sampling (trl_ext.ppo.rollout.dynamic_sampling)
    if cfg.mask_truncated_completions:
        metrics["objective/frac_truncated"] = gather((~rollout.contain_eos_token).float().mean()).mean().item()
    return metrics
