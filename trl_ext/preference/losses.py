"""Pure preference losses used by :class:`trl_ext.RewardTrainer` and :class:`trl_ext.DPOTrainer`.

Every function here is a plain tensor function (no trainer state) with its formula and source. The trainers only
orchestrate: they compute rewards or log-ratios and call these.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F


def smoothed_logsigmoid_loss(logits: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    r"""Element-wise binary cross-entropy of a preference whose label is flipped with probability ``eps``.

    ``loss = -(1 - eps) * logsigmoid(z) - eps * logsigmoid(-z)``

    With ``eps = 0`` this is exactly ``-logsigmoid(z)`` (returned without the second term, so the numbers are
    bit-identical to TRL's). Source: conservative DPO (cDPO, Mitchell 2023, "A note on DPO with noisy
    preferences"), as run by OpenRLHF, DeepSpeed-Chat, LLaMA-Factory and TRL <= 0.28 (`sigmoid` loss).
    Equivalently ``-logsigmoid(z) + eps * z``, because ``logsigmoid(z) - logsigmoid(-z) = z``.
    """
    if label_smoothing == 0.0:
        return -F.logsigmoid(logits)
    return -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def pairwise_reward_loss(
    rewards_chosen: torch.Tensor,
    rewards_rejected: torch.Tensor,
    margin: torch.Tensor | None = None,
    label_smoothing: float = 0.0,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    r"""Bradley-Terry reward-model loss over a batch of pairs, optionally label-smoothed.

    ``d = r_chosen - r_rejected - margin``;
    ``loss = mean(-(1 - eps) * logsigmoid(d) - eps * logsigmoid(-d)) + c * mean((r_chosen + r_rejected)^2)``

    With ``eps = 0`` this is TRL's `RewardTrainer` loss, term for term (InstructGPT, Ouyang et al. 2022, eq. 1;
    margin from Llama 2, Touvron et al. 2023; the centering term ``c`` = `center_rewards_coefficient` from
    Eisenstein et al. 2023, https://huggingface.co/papers/2312.09244, eq. 2). Label smoothing of the reward loss
    is the cDPO smoothing applied to the reward difference (see :func:`smoothed_logsigmoid_loss`).

    Returns the scalar batch loss.
    """
    diff = rewards_chosen - rewards_rejected
    if margin is not None:
        diff = diff - margin
    loss = smoothed_logsigmoid_loss(diff, label_smoothing).mean()
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * torch.mean((rewards_chosen + rewards_rejected) ** 2)
    return loss


@functools.lru_cache(maxsize=256)
def _pair_indices_cpu(counts: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    better, worse, example = [], [], []
    offset = 0
    for e, k in enumerate(counts):
        i, j = torch.triu_indices(k, k, offset=1)
        better.append(i + offset)
        worse.append(j + offset)
        example.append(torch.full_like(i, e))
        offset += k
    return torch.cat(better), torch.cat(worse), torch.cat(example)


def ranked_pair_indices(num_responses: Sequence[int] | torch.Tensor, device=None):
    """Indices of all ordered pairs of a flattened batch of ranked lists.

    The rewards of example ``e`` occupy ``K_e`` consecutive positions, best response first. Returns three
    ``LongTensor`` of length ``sum_e C(K_e, 2)``: ``better[p]`` and ``worse[p]`` (positions in the flattened
    batch, ``better`` ranked above ``worse``) and ``example[p]`` (the example each pair belongs to). Cached per
    tuple of K's (batches repeat the same few shapes).

    >>> ranked_pair_indices([3, 2])
    (tensor([0, 0, 1, 3]), tensor([1, 2, 2, 4]), tensor([0, 0, 0, 1]))
    """
    counts = tuple(int(k) for k in (num_responses.tolist() if torch.is_tensor(num_responses) else num_responses))
    return tuple(t.to(device) for t in _pair_indices_cpu(counts))


def ranked_reward_loss(
    rewards: torch.Tensor,
    num_responses: Sequence[int] | torch.Tensor,
    label_smoothing: float = 0.0,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    r"""K-wise ranked reward loss (InstructGPT, Ouyang et al. 2022, eq. 1), optionally label-smoothed.

    ``rewards`` holds the rewards of every response of every example, flattened; example ``e`` has ``K_e``
    responses, best first. For every ordered pair ``(i, j)``, ``i`` ranked above ``j``:

    ``l_ij = -(1 - eps) * logsigmoid(r_i - r_j) - eps * logsigmoid(r_j - r_i)  [+ c * (r_i + r_j)^2]``

    The loss of an example is the mean of ``l_ij`` over its ``C(K_e, 2)`` pairs (InstructGPT's ``1/C(K,2)``);
    the batch loss is the mean over examples. The optional centering term is TRL's
    `center_rewards_coefficient` term applied per pair, so an example with ``K = 2`` gives exactly
    :func:`pairwise_reward_loss` (without margin).
    """
    better, worse, example = ranked_pair_indices(num_responses, device=rewards.device)
    num_examples = len(num_responses)
    pair_counts = torch.zeros(num_examples, dtype=rewards.dtype, device=rewards.device)
    pair_counts.index_add_(0, example, torch.ones_like(better, dtype=rewards.dtype))

    def per_example_mean(values):
        sums = torch.zeros(num_examples, dtype=values.dtype, device=values.device).index_add(0, example, values)
        return (sums / pair_counts).mean()

    loss = per_example_mean(smoothed_logsigmoid_loss(rewards[better] - rewards[worse], label_smoothing))
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * per_example_mean((rewards[better] + rewards[worse]) ** 2)
    return loss


def cdpo_loss(
    chosen_logratios: torch.Tensor,
    rejected_logratios: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    r"""Per-pair conservative DPO (cDPO) loss.

    ``d = (log pi(y_c|x) - log pi_ref(y_c|x)) - (log pi(y_r|x) - log pi_ref(y_r|x))``;
    ``loss = -(1 - eps) * logsigmoid(beta * d) - eps * logsigmoid(-beta * d)``

    ``eps = 0`` is the DPO loss (Rafailov et al. 2023, eq. 7). Source: Mitchell 2023, "A note on DPO with noisy
    preferences & relationship to IPO"; the same formula as OpenRLHF's and DeepSpeed-Chat's DPO loss and TRL's
    ``sigmoid`` loss up to TRL 0.28.
    """
    return smoothed_logsigmoid_loss(beta * (chosen_logratios - rejected_logratios), label_smoothing)


def robust_label_smoothing_for_cdpo(label_smoothing: float) -> float:
    r"""The value of TRL's `robust` label smoothing whose loss equals cDPO with ``label_smoothing``.

    TRL's `robust` DPO loss (Chowdhury et al. 2024, rDPO) with flip rate ``e'`` is
    ``R = (-(1 - e') * logsigmoid(x) + e' * logsigmoid(-x)) / (1 - 2e')``, ``x = beta * d``. With
    ``logsigmoid(-x) = logsigmoid(x) - x`` this is ``R = -logsigmoid(x) - x * e' / (1 - 2e')``, and cDPO is
    ``C = -logsigmoid(x) + eps * x``. So ``R = C`` exactly when ``e' / (1 - 2e') = -eps``, i.e.
    ``e' = -eps / (1 - 2 eps)``. :class:`trl_ext.DPOTrainer` uses this to run cDPO through TRL's own loss code
    instead of forking it.
    """
    return -label_smoothing / (1.0 - 2.0 * label_smoothing)
