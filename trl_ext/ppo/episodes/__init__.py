"""Multi-turn episodes with tools and environments in :class:`trl_ext.PPOTrainer` (TRL GRPOTrainer's contract):
:mod:`.toolbox` (the contract: tools, environments, chat template), :mod:`.tool_rules` (its checks, for the
trainer and the recipe loader), :mod:`.tool_calls` (running calls with a time limit), :mod:`.multi_turn` (the
turn loop), :mod:`.turn_rewards` (environments' per-turn rewards in the update's rewards), :mod:`.play` (the same
loop outside training, for evaluators), :mod:`.config` (the config fields). GAE over the episode's action tokens:
:mod:`trl_ext.ppo.objective.action_gae`. Guide: ``docs/tools.md``."""

from .config import ToolArgs
from .multi_turn import Episode, EpisodeBatch, MultiTurnRollout
from .play import play_episodes
from .tool_calls import ToolCallCounts, ToolExecutor
from .toolbox import Toolbox
from .turn_rewards import TurnRewards

__all__ = ["Episode", "EpisodeBatch", "MultiTurnRollout", "ToolArgs", "ToolCallCounts", "ToolExecutor", "Toolbox",
           "TurnRewards", "play_episodes"]
