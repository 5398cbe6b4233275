"""``critic_warmup`` (verl's key of that name): for a run's first N updates only the value model trains. How it
works: docs/ppo-internals.md#critic-warm-up."""

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
