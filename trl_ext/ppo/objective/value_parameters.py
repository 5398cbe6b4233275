"""Which trained parameters are the value model's, in the one module (TRL's ``PolicyAndValueWrapper``) and the one
optimizer that policy and value model share: for ``critic_warmup`` (hold the policy's) and ``critic_learning_rate``
(the value model's own parameter groups)."""

from __future__ import annotations

import torch

__all__ = ["policy_only_parameters", "with_critic_learning_rate"]


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
