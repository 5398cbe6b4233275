"""KL-penalty controllers for PPO: how the coefficient ``beta`` of the per-token KL penalty evolves. How it works:
docs/ppo-internals.md#kl-controllers."""

from __future__ import annotations

from typing import Any, Literal, get_args

KLControllerName = Literal["fixed", "adaptive", "doubling"]
KL_CONTROLLERS = get_args(KLControllerName)


class KLController:
    """Base class: holds the KL coefficient ``value`` and updates it once per PPO update.

    Subclasses override :meth:`update`. ``state_dict()`` returns every public attribute that is a plain number,
    so a subclass that keeps its state in such attributes gets checkpointing for free.
    """

    def __init__(self, init_kl_coef: float):
        self.value = float(init_kl_coef)

    def update(self, kl: float, n_steps: int) -> None:
        """Update ``value`` after a PPO update whose mean sequence KL was ``kl``, over ``n_steps`` episodes."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """The controller's state (plain Python numbers), for checkpoints."""
        return {k: v for k, v in vars(self).items() if not k.startswith("_") and isinstance(v, (int, float))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict`."""
        for key, value in state.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.state_dict().items())
        return f"{type(self).__name__}({fields})"


class FixedKLController(KLController):
    """Constant coefficient: ``beta_{t+1} = beta_t`` (TRL 1.12 PPO, ``kl_coef``)."""

    def update(self, kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController(KLController):
    """Proportional controller of Ziegler et al. 2019 (arXiv:1909.08593, section 2.2).

    ``e = clip(KL / target - 1, -0.2, 0.2)`` and ``beta <- beta * (1 + e * n_steps / horizon)``, where
    ``n_steps`` is the number of episodes in the update. Same code as TRL 0.7's ``AdaptiveKLController``,
    trlx and OpenRLHF; their defaults are target 6 and horizon 10000.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        super().__init__(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, kl: float, n_steps: int) -> None:
        error = min(max(kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


class DoublingKLController(KLController):
    """Adaptive KL penalty of the PPO paper (Schulman et al. 2017, arXiv:1707.06347, section 4).

    After each update: ``beta <- beta / 2`` if ``KL < target / 1.5``; ``beta <- beta * 2`` if ``KL > target * 1.5``;
    unchanged otherwise. (``n_steps`` is ignored.)
    """

    def __init__(self, init_kl_coef: float, target: float):
        super().__init__(init_kl_coef)
        self.target = float(target)

    def update(self, kl: float, n_steps: int) -> None:
        if kl < self.target / 1.5:
            self.value /= 2.0
        elif kl > self.target * 1.5:
            self.value *= 2.0


def build_kl_controller(name: str, init_kl_coef: float, target: float = 6.0, horizon: int = 10000) -> KLController:
    """The controller named ``name`` (one of :data:`KL_CONTROLLERS`), starting at ``init_kl_coef``."""
    if name == "fixed":
        return FixedKLController(init_kl_coef)
    if name == "adaptive":
        return AdaptiveKLController(init_kl_coef, target, horizon)
    if name == "doubling":
        return DoublingKLController(init_kl_coef, target)
    from ...errors import UserInputError

    raise UserInputError(f"kl_controller: unknown value {name!r}; use one of {', '.join(KL_CONTROLLERS)}")
