"""Episodes played outside training with the trainer's own turn loop (:class:`MultiTurnRollout`): an evaluator gives
the prompts (chat messages, with their dataset columns for ``reset``) and a sampler, and gets the episodes RL would
play with that sampler, token for token (same rendering, same length and rounds caps, same tool execution).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from .multi_turn import EpisodeBatch, MultiTurnRollout
from .toolbox import Toolbox

__all__ = ["play_episodes"]


def play_episodes(processing_class, prompts: list[list[dict]], sample, *, response_length: int,
                  max_tool_calling_iterations: int | None, tools=None, environment_factory=None,
                  rows: list[dict] | None = None, tool_timeout_s: float | None = None,
                  chat_template_kwargs: dict | None = None) -> tuple[EpisodeBatch, list | None]:
    """Play ``prompts`` as :class:`trl_ext.PPOTrainer` with ``tools`` / ``environment_factory`` plays them:
    ``(batch, environments)``, the episodes (with their environments' per-turn rewards, ``Episode.turn_rewards``) and
    each row's environment (None without ``environment_factory``).

    ``sample(queries, max_new_tokens) -> (query_responses, logprobs)`` samples one turn after each left-padded query
    (the trainer's :meth:`sample_turn` contract); ``rows``: each prompt's other dataset columns (``reset(**row)``
    gets them with ``prompt``, as in training). Tool calls run in this process (``tool_num_workers`` 0)."""
    args = SimpleNamespace(response_length=response_length, max_tool_calling_iterations=max_tool_calling_iterations,
                           tool_timeout_s=tool_timeout_s, tool_num_workers=0)
    toolbox = Toolbox(tools, environment_factory, processing_class, chat_template_kwargs)
    loop = MultiTurnRollout(toolbox, args, processing_class)
    rows = rows if rows is not None else [{} for _ in prompts]
    columns = {key: [row[key] for row in rows] for key in (rows[0] if rows else {})}
    data = {**columns, "prompt": list(prompts), "input_ids": torch.zeros((len(prompts), 1), dtype=torch.long)}
    try:  # no attention mask: begin renders every prompt with its row's tools
        queries = loop.begin(data)["input_ids"]
        _, _, batch = loop.run(queries, sample)
    finally:
        loop.close()
    return batch, toolbox.environments
