"""The check of a PPO trainer's reward and value models that share the policy's base
(:mod:`trl_ext.models.shared_base`), when the trainer is built: the same policy, no second peft config, no engine
that shards the base."""

from __future__ import annotations

import os

from ..errors import UserInputError
from ..models.shared_base import SharedBaseScalarModel

__all__ = ["check_shared_base_roles"]


def check_shared_base_roles(model, reward_model, value_model, peft_config, args) -> bool:
    """Validate reward/value models that share the policy's base before a trainer is built; True if any does.

    Raises:
        UserInputError: such a model sits on another model than ``model``, ``peft_config`` is given as well (the
            policy must already carry its adapter), or the run uses DeepSpeed or FSDP (not supported with a
            shared base).
    """
    shared = False
    for role, scalar in (("reward_model", reward_model), ("value_model", value_model)):
        if not isinstance(scalar, SharedBaseScalarModel):
            continue
        shared = True
        if scalar.policy is not model:
            raise UserInputError(
                f"{role}: its adapter sits on another model's base than the policy passed as `model`; build it with "
                "trl_ext.models.shared_base.add_scalar_adapter(policy, ...) on that same policy"
            )
    if not shared:
        return False
    if peft_config is not None:
        raise UserInputError(
            "peft_config: with reward/value adapters on the policy's base, the policy already is a peft model; pass "
            "peft_config=None"
        )
    use_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" or bool(
        getattr(args, "deepspeed", None)
    )
    use_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" or bool(getattr(args, "fsdp", None))
    if use_deepspeed or use_fsdp:
        raise UserInputError(
            "shared base: reward/value adapters on the policy's base are supported on one device or with DDP, not "
            f"with {'DeepSpeed' if use_deepspeed else 'FSDP'}; load separate reward and value models instead"
        )
    return True
