"""Activation (gradient) checkpointing through whichever API the installed transformers has: 5.23 renamed
``gradient_checkpointing_enable/disable`` and ``is_gradient_checkpointing`` to ``activation_checkpointing_*`` and
``is_activation_checkpointing`` and made the old names deprecated aliases that warn on every call. trl-ext calls the
new names where they exist (so its own calls raise no ``FutureWarning``) and the old ones on older transformers.
"""

from __future__ import annotations

__all__ = ["checkpointing_disable", "checkpointing_enable", "is_checkpointing"]


def is_checkpointing(model) -> bool:
    """Whether activation checkpointing is on for ``model`` (a transformers or peft model)."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(getattr(model, "is_gradient_checkpointing", False))  # pragma: no cover - transformers < 5.23


def checkpointing_enable(model, kwargs: dict | None = None) -> None:
    """Turn activation checkpointing on, with ``kwargs`` (e.g. ``{"use_reentrant": False}``)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # pragma: no cover - transformers < 5.23
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def checkpointing_disable(model) -> None:
    """Turn activation checkpointing off."""
    if hasattr(model, "activation_checkpointing_disable"):
        model.activation_checkpointing_disable()
    else:  # pragma: no cover - transformers < 5.23
        model.gradient_checkpointing_disable()
