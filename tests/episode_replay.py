"""Replaying a pre-tokenized SFT episode through trl_ext.PPOTrainer's own multi-turn rollout (the environment tests
of recipes/tool_use: the guessing game, the quiz)."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def replay(tokenizer, example: dict, environment_factory, prompt: list[dict], row: dict, *,
           max_tool_calling_iterations: int, response_length: int):
    """An SFT episode (``example``: ``input_ids``, ``completion_mask``) played by the trainer's rollout (Toolbox +
    MultiTurnRollout) with ``environment_factory``, reset with ``row``'s columns; each "sampled" turn is the
    example's next run of completion_mask 1 after the prefix, and every prefix the rollout asks to continue must be
    the example's. Returns (rollout, the episode, its environment)."""
    from trl_ext.ppo.episodes.multi_turn import MultiTurnRollout
    from trl_ext.ppo.episodes.toolbox import Toolbox

    toolbox = Toolbox(None, environment_factory, tokenizer)
    args = SimpleNamespace(response_length=response_length, max_tool_calling_iterations=max_tool_calling_iterations,
                           tool_timeout_s=None, tool_num_workers=0)
    rollout = MultiTurnRollout(toolbox, args, tokenizer)
    ids, mask = example["input_ids"], example["completion_mask"]

    def sample(queries, max_new_tokens):
        prefix = [t for t in queries[0].tolist() if t != tokenizer.pad_token_id]
        assert ids[:len(prefix)] == prefix  # the rollout's prefix is the SFT row's
        end = next((j for j in range(len(prefix), len(ids)) if not mask[j]), len(ids))
        turn = ids[len(prefix):end][:max_new_tokens]
        return torch.cat((queries, torch.tensor([turn])), 1), torch.zeros(1, len(turn))

    data = rollout.begin({"input_ids": torch.tensor([[tokenizer.pad_token_id]]), "prompt": [prompt],
                          **{key: [value] for key, value in row.items()}})
    _, _, batch = rollout.run(data["input_ids"], sample)
    return rollout, batch.episodes[0], toolbox.environments[0]
