"""What trl-ext's PPO extends, depending on the installed TRL: the one place that decides it (this module), the base
trl-ext carries for TRL 1.13+ (``base_trainer.py``, ``base_config.py``) and the fixes to the parent's methods that
apply on either base (``parent_fixes.py``: DDP/DeepSpeed wrappers, shared bases, critic-free runs). How it works:
docs/ppo-internals.md#what-the-ppo-extends."""

from __future__ import annotations

import importlib.util
import os

# PPO lives in trl.experimental in TRL 1.10-1.12; we depend on it on purpose, so its warning is noise.
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

__all__ = ["PPO_BASE", "TRL_HAS_PPO", "OnlineTrainerState", "ParentPPOConfig", "ParentPPOTrainer"]

PPO_BASE_VARIABLE = "TRL_EXT_PPO_BASE"


def _trl_has_ppo() -> bool:
    try:
        return importlib.util.find_spec("trl.experimental.ppo") is not None
    except ModuleNotFoundError:  # no trl.experimental at all
        return False


TRL_HAS_PPO: bool = _trl_has_ppo()
"""Whether the installed TRL ships `trl.experimental.ppo` (TRL 1.10-1.12)."""


def _choose_base() -> str:
    wanted = os.environ.get(PPO_BASE_VARIABLE, "auto").strip().lower() or "auto"
    if wanted not in ("auto", "trl", "trl-ext"):
        raise ImportError(f"{PPO_BASE_VARIABLE}={wanted!r}: use 'auto' (default), 'trl' or 'trl-ext'")
    if wanted == "trl" and not TRL_HAS_PPO:
        import trl

        raise ImportError(
            f"{PPO_BASE_VARIABLE}=trl: TRL {trl.__version__} has no trl.experimental.ppo (removed in TRL 1.13); "
            "unset it to use trl-ext's own PPO base, or install trl<1.13"
        )
    if wanted == "auto":
        return "trl" if TRL_HAS_PPO else "trl-ext"
    return wanted


PPO_BASE: str = _choose_base()
"""What trl-ext's PPO extends: ``"trl"`` (TRL's `experimental.ppo` classes) or ``"trl-ext"`` (trl-ext's own)."""

if PPO_BASE == "trl":
    from ...trl_internals import ExperimentalPPOConfig as ParentPPOConfig
    from ...trl_internals import ExperimentalPPOTrainer as ParentPPOTrainer
    from ...trl_internals import OnlineTrainerState
else:
    from .base_config import PPOBaseConfig as ParentPPOConfig
    from .base_trainer import OnlineTrainerState
    from .base_trainer import PPOBaseTrainer as ParentPPOTrainer
