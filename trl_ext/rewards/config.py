"""Config fields of reward functions, mixed into :class:`trl_ext.PPOConfig` (names and defaults as TRL's
``GRPOConfig`` where it has them: ``reward_weights``, ``log_completions``, ``num_completions_to_print``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import UserInputError

__all__ = ["RewardFunctionArgs"]


@dataclass
class RewardFunctionArgs:
    """Config fields of the trainer's ``reward_funcs`` (:mod:`trl_ext.rewards`).

    Parameters:
        reward_weights (`list[float]`, *optional*):
            One weight per reward: the reward model first when the trainer has one, then `reward_funcs` in order.
            The score of a completion is `sum_i w_i * r_i` over the rewards that did not return None (TRL's
            `nansum`). Defaults to 1.0 for each.
        reward_num_workers (`int`, *optional*, defaults to `0`):
            `0`: reward functions run in the training process, as in TRL (an exception stops the run, naming the
            function and the completion). `> 0`: that many worker processes run them, one call per completion;
            a call that raises or runs past `reward_timeout_s` scores None for its completion, is counted in
            `rewards/<name>/errors` or `/timeouts`, and the run goes on. With workers, the completions of a rollout
            chunk are scored while the next chunk generates and while the reference/value passes run.
        reward_timeout_s (`float`, *optional*):
            With `reward_num_workers > 0`: the longest a call may run before its worker is killed and replaced.
            None: no limit.
        log_completions (`bool`, *optional*, defaults to `False`):
            Each update, log a table of prompt, completion, each reward and the advantage: a `wandb.Table` named
            `completions` when wandb is in `report_to`, and lines of `completions.jsonl` in `output_dir`; also
            printed (see `num_completions_to_print`).
        num_completions_to_print (`int`, *optional*, defaults to `4`):
            With `log_completions`: how many rows to print to the console each update, the update's first ones
            (None: all, 0: none). The file and the wandb table always get every row. TRL's GRPO prints all by
            default; a few keep the console readable (a batch of 64 completions would print 64 lines per update).
    """

    reward_weights: list[float] | None = field(
        default=None,
        metadata={"help": "One weight per reward (the reward model first, then reward_funcs); default 1.0 each."},
    )
    reward_num_workers: int = field(
        default=0,
        metadata={"help": "Worker processes for reward functions (0: in process; > 0: timeouts and errors counted, "
                          "the run goes on)."},
    )
    reward_timeout_s: float | None = field(
        default=None,
        metadata={"help": "With reward_num_workers > 0: seconds a reward call may run before it scores None."},
    )
    log_completions: bool = field(
        default=False,
        metadata={"help": "Log prompts, completions, rewards and advantages each update (wandb table, "
                          "completions.jsonl, console)."},
    )
    num_completions_to_print: int | None = field(
        default=4,
        metadata={"help": "With log_completions: rows printed to the console each update (None: all, 0: none); the "
                          "file and the wandb table get all."},
    )

    def __post_init__(self):
        if self.reward_weights is not None:
            weights = self.reward_weights
            if isinstance(weights, (int, float)) and not isinstance(weights, bool):
                self.reward_weights = weights = [float(weights)]
            if not isinstance(weights, (list, tuple)) or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in weights
            ):
                raise UserInputError(f"reward_weights: expected a list of finite numbers, got {weights!r}")
            self.reward_weights = [float(w) for w in weights]
        # ranges of reward_num_workers, reward_timeout_s, num_completions_to_print: trl_ext.field_rules
        if self.reward_timeout_s is not None and self.reward_num_workers == 0:
            raise UserInputError(
                "reward_timeout_s: needs reward_num_workers > 0 (a call in the training process cannot be "
                "stopped safely); set reward_num_workers, or remove reward_timeout_s"
            )
        super().__post_init__()
