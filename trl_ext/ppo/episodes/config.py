"""Config fields of multi-turn episodes with tools, mixed into :class:`trl_ext.PPOConfig`
(``max_tool_calling_iterations`` is TRL ``GRPOConfig``'s key, same meaning and default)."""

from __future__ import annotations

from dataclasses import dataclass

from ...field_rules import help_from_docstring

__all__ = ["ToolArgs"]


@help_from_docstring
@dataclass
class ToolArgs:
    """Config fields of the trainer's ``tools`` / ``environment_factory`` (:mod:`trl_ext.ppo.episodes`).

    Parameters:
        max_tool_calling_iterations (`int`, *optional*):
            The most rounds of tool calls in one episode (a round: run the calls of a turn, append their results,
            sample the next turn). None: no limit but `response_length`, as TRL's `GRPOConfig`. An episode still
            calling tools when the rounds run out ends there (`episodes/truncated_iterations_frac`).
        tool_timeout_s (`float`, *optional*, defaults to `30.0`):
            The longest a tool call may run; past it the model reads `{'error': 'Tool <name> timed out after <s>
            s'}`, the call counts in `tools/failure_frequency` and `tools/timeout_frequency`, and the run goes on.
            None: no limit (TRL's behaviour: a hung tool hangs the run).
        tool_num_workers (`int`, *optional*, defaults to `0`):
            `0`: tools run in the training process (a call past `tool_timeout_s` is abandoned in its thread).
            `> 0`: the standalone `tools` run in that many worker processes (a call past the limit is killed with
            its worker); environment methods always run in the training process (their state lives there).
    """

    # ranges: trl_ext.field_rules.RANGES
    max_tool_calling_iterations: int | None = None
    tool_timeout_s: float | None = 30.0
    tool_num_workers: int = 0

    def __post_init__(self):
        super().__post_init__()
