"""The value model's own training, from which parameters are its own in the one module (TRL's
``PolicyAndValueWrapper``) and the one optimizer that policy and value model share (:func:`policy_only_parameters`):
``critic_warmup`` (verl's key of that name: for a run's first N updates only the value model trains) and
``critic_learning_rate`` (its parameter groups at their own rate, :func:`with_critic_learning_rate`). How it works:
docs/ppo-internals.md#critic-warm-up."""

from __future__ import annotations

import torch

__all__ = ["CriticWarmup", "policy_only_parameters", "with_critic_learning_rate"]


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


def policy_only_parameters(wrapper) -> list[torch.nn.Parameter]:
    """The trainable parameters of ``wrapper.policy`` that ``wrapper.value_model`` does not train: not among the value
    model's own parameters, nor (a shared base) in its adapter on the policy's model."""
    value_model = wrapper.value_model
    value_ids = {id(p) for p in value_model.parameters()}
    adapter = getattr(value_model, "adapter_name", None)
    return [p for name, p in wrapper.policy.named_parameters()
            if p.requires_grad and id(p) not in value_ids and (adapter is None or f".{adapter}." not in name)]


def with_critic_learning_rate(optimizer: torch.optim.Optimizer, wrapper, lr: float) -> torch.optim.Optimizer:
    """``optimizer`` with each parameter group split in two: the policy's parameters, then the value model's (its
    head, its model or its adapter on a shared base) in a group of their own at ``lr`` (OpenRLHF's
    ``--critic_learning_rate``, verl's ``critic.optim.lr``); the other settings of each group kept, empty groups
    dropped. Call it before the LR scheduler is built: it scales every group's own rate."""
    policy_ids = {id(p) for p in policy_only_parameters(wrapper)}
    policy_groups, value_groups = [], []
    for group in optimizer.param_groups:
        policy = [p for p in group["params"] if id(p) in policy_ids]
        value = [p for p in group["params"] if id(p) not in policy_ids]
        policy_groups += [{**group, "params": policy}] if policy else []
        value_groups += [{**group, "params": value, "lr": lr}] if value else []
    optimizer.param_groups[:] = policy_groups + value_groups
    return optimizer
