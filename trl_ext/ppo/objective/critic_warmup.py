"""``critic_warmup`` (verl's key of that name): for a run's first N updates only the value model trains.

GAE's advantages are only as good as the value model, and a fresh value head predicts noise; verl therefore lets the
critic fit the returns of the first rollouts before the actor moves. Here the policy and the value model are one module
with one optimizer (TRL's ``PolicyAndValueWrapper``), so holding the policy is done in two places:

* the loss: while held, each micro-batch's loss is the value term alone; the policy's terms (surrogate, KL and
  entropy terms, joint ptx) stay in the graph at weight 0, so that every parameter takes part in the backward
  (DDP needs that) and gets a zero gradient;
* the optimizer step: the held parameters' gradients are dropped (set to None) first, so torch's optimizers skip them:
  their weights and their optimizer state stay untouched (Adam's first policy step after the warm-up is a first
  step), and ``max_grad_norm`` clips the value model's gradients alone.

No policy step is taken (no separate ptx step either); the rollouts, their metrics (``loss/policy_avg``, ...), the KL
controller and the learning-rate schedule run as in any update. The held parameters are the policy's trainable ones
that are not the value model's (with a shared base, the value adapter lives in the policy's model: it still trains).
Under DeepSpeed the engine owns the gradients and steps every parameter: the policy's are zero there, which leaves its
weights unchanged under Adam without weight decay. The state is the number of completed updates, so a run resumed
inside the warm-up holds the policy for the rest of it.
"""

from __future__ import annotations

import torch

from .value_parameters import policy_only_parameters

__all__ = ["CriticWarmup"]


class CriticWarmup:
    """The first ``updates`` updates train the value model alone (module docstring). The trainer builds it once
    (:meth:`build`; None when ``critic_warmup`` is 0) and calls :meth:`begin` at ``optimize``, :meth:`loss` in
    ``compute_micro_batch_loss``, :meth:`hold` in ``optimizer_step`` and :meth:`metrics` in ``update_metrics``.

    Args:
        updates: ``critic_warmup``.
        held: the parameters held while warming up (:func:`policy_only_parameters`).
    """

    def __init__(self, updates: int, held: list[torch.nn.Parameter]):
        self.updates = updates
        self.held = held
        self.holding = False
        """Whether the current update holds the policy."""

    @classmethod
    def build(cls, args, wrapper) -> "CriticWarmup | None":
        """The run's warm-up from ``args.critic_warmup`` and the unwrapped policy-and-value module; None when off."""
        if not args.critic_warmup:
            return None
        return cls(args.critic_warmup, policy_only_parameters(wrapper))

    def begin(self, completed_updates: int) -> None:
        """At the start of an update's optimisation: it holds the policy while fewer than ``updates`` are complete."""
        self.holding = completed_updates < self.updates

    def loss(self, loss: torch.Tensor, value_term: torch.Tensor) -> torch.Tensor:
        """A micro-batch's loss: ``loss`` as it is, or, while holding, ``value_term`` (``vf_coef`` times the value loss)
        with ``loss``'s other terms at weight 0 (in the graph, no gradient)."""
        if not self.holding:
            return loss
        return value_term + 0.0 * (loss - value_term)

    def hold(self) -> None:
        """Before an optimizer step: while holding, the held parameters' gradients dropped, so the step skips them."""
        if self.holding:
            for parameter in self.held:
                parameter.grad = None

    def metrics(self) -> dict:
        """``critic/warmup``: 1 when this update held the policy (only the value model trained), else 0."""
        return {"critic/warmup": 1.0 if self.holding else 0.0}
