"""The scorer :class:`trl_ext.PPOTrainer` calls: reward models and reward functions -> one score per completion. How
it works: docs/internals-recipes.md#reward-scoring."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch

from ..errors import UserInputError
from .contract import (
    RewardFunctionError,
    call_reward_funcs,
    check_rewards,
    is_reward_model,
    keyword_columns,
    reward_func_names,
)

__all__ = ["RewardScorer", "RewardScores", "build_reward_list"]


def build_reward_list(reward_model, reward_funcs, reward_weights) -> tuple[list, list[float], list[str]]:
    """The rewards of a run, the reward model first when there is one, their weights and their metric names (the
    reward model's is ``reward_model``; the others' TRL's, see :func:`~trl_ext.rewards.contract.reward_func_names`).

    Raises:
        UserInputError: no reward at all, a `reward_funcs` entry that is neither callable nor a model, or
            `reward_weights` of the wrong length.
    """
    if reward_funcs is None:
        funcs = []
    elif not isinstance(reward_funcs, (list, tuple)):  # one function (or model); anything else is refused below
        funcs = [reward_funcs]
    else:
        funcs = list(reward_funcs)
    for i, func in enumerate(funcs):
        if not (callable(func) or is_reward_model(func)):
            raise UserInputError(f"reward_funcs[{i}]: {func!r} is neither a callable nor a reward model")
    rewards = ([reward_model] if reward_model is not None else []) + funcs
    if not rewards:
        raise UserInputError("reward_model: None and no reward_funcs; pass a reward model, reward_funcs, or both")
    names = (["reward_model"] if reward_model is not None else []) + reward_func_names(funcs)
    if reward_weights is None:
        return rewards, [1.0] * len(rewards), names
    if len(reward_weights) != len(rewards):
        listing = ", ".join(names)
        raise UserInputError(
            f"reward_weights: {len(reward_weights)} weights for {len(rewards)} rewards ({listing}; the reward model "
            "first when there is one); give one weight per reward"
        )
    return rewards, [float(w) for w in reward_weights], names


@dataclass
class RewardScores:
    """One update's rewards on this process: ``per_reward[j, i]`` (NaN = None/timeout/error), the weighted score,
    and what the metrics need."""

    names: list[str]
    per_reward: torch.Tensor
    score: torch.Tensor
    unscorable: torch.Tensor
    timeouts: list[int]
    errors: list[int]
    logged_metrics: dict = field(default_factory=dict)
    extra_columns: dict = field(default_factory=dict)
    completions: list = field(default_factory=list)
    prompts: list = field(default_factory=list)


class RewardScorer:
    """Scores completions with reward models and TRL-contract reward functions (see the module docstring).

    Args:
        rewards: reward models (``torch.nn.Module``, scored by the trainer with the policy's tokenizer) and
            callables, in order (:func:`build_reward_list`).
        weights: one per reward.
        names: one per reward, unique (the metric names).
        tokenizer: the policy's tokenizer (decodes prompts and completions).
        pad_token_id: the padding id of the rollout tensors.
        num_workers: ``0`` in process; ``> 0`` a :class:`~trl_ext.user_code.workers.FunctionPool` runs the functions.
        timeout_s: the pool's per-call limit.
    """

    def __init__(self, rewards: list, weights: list[float], names: list[str], tokenizer, pad_token_id: int,
                 num_workers: int = 0, timeout_s: float | None = None):
        self.rewards = rewards
        self.names = names
        self.weights = torch.tensor(weights, dtype=torch.float32)
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id
        self.model_indices = [i for i, r in enumerate(rewards) if is_reward_model(r)]
        self.func_indices = [i for i, r in enumerate(rewards) if not is_reward_model(r)]
        self.pool = None
        if num_workers > 0 and self.func_indices:
            from ..user_code.workers import FunctionPool

            self.pool = FunctionPool([rewards[i] for i in self.func_indices], num_workers, timeout_s)
        self._prompts, self._columns, self._pending, self._state = [], {}, {}, None
        self._extras, self._metrics = {}, {}
        self._episode_completions, self._environments = None, None

    @property
    def reward_models(self) -> list:
        return [self.rewards[i] for i in self.model_indices]

    def close(self) -> None:
        """Stop the worker processes (if any)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    # ------------------------------------------------------------------ one update

    def begin(self, queries: torch.Tensor, columns: dict[str, list], trainer_state=None) -> None:
        """Start an update: the rollout's prompts (left-padded ids; the dataset's ``prompt`` column when the batch
        has it, else the decoded ids) and columns (one value per row, rows repeated per sample)."""
        n = queries.shape[0]
        for key, values in columns.items():
            if len(values) != n:
                raise RewardFunctionError(f"dataset column '{key}': {len(values)} values for {n} completions")
        if "prompt" in columns:
            self._prompts = list(columns["prompt"])
        else:
            self._prompts = self.tokenizer.batch_decode(queries, skip_special_tokens=True)
        self._columns = keyword_columns(columns)
        self._state = trainer_state
        self._pending = {}
        self._extras, self._metrics = {}, {}
        self._episode_completions, self._environments = None, None

    def use_episodes(self, completions: list, environments: list | None = None) -> None:
        """Multi-turn episodes (``tools``): the completions are these message lists (assistant turns with their
        ``tool_calls``, tool results), as TRL passes them, and ``environments`` (one per row, or None) goes to every
        function as the ``environments`` keyword. Until the next :meth:`begin`."""
        self._episode_completions, self._environments = list(completions), environments

    def _completion_inputs(self, responses: torch.Tensor, start: int) -> dict:
        """The contract's keywords for rows ``start .. start + len(responses)`` (truncated responses)."""
        is_pad = responses == self.pad_token_id
        lengths = torch.where(is_pad.any(1), is_pad.int().argmax(1), responses.shape[1])  # tokens before a pad
        ids = [row[:length].tolist() for row, length in zip(responses, lengths.tolist())]
        stop = start + len(ids)
        prompts = self._prompts[start:stop]
        if self._episode_completions is not None:  # multi-turn: the episode's messages (nothing to decode)
            completions = self._episode_completions[start:stop]
        elif prompts and isinstance(prompts[0], list):  # conversational: completions as assistant messages
            completions = [[{"role": "assistant", "content": text}]
                           for text in self.tokenizer.batch_decode(ids, skip_special_tokens=True)]
        else:
            completions = self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        inputs = {"prompts": prompts, "completions": completions, "completion_ids": ids}
        if self._environments is not None:
            inputs["environments"] = self._environments[start:stop]
        inputs.update({key: values[start:stop] for key, values in self._columns.items()})
        return inputs

    def submit(self, start: int, responses: torch.Tensor) -> None:
        """With workers: start the calls of rows ``start ..`` (one per completion and function). In process: no-op."""
        if self.pool is None:
            return
        inputs = self._completion_inputs(responses, start)
        state = self._light_state()
        for row in range(len(inputs["completions"])):
            row_inputs = {key: values[row : row + 1] for key, values in inputs.items()}
            row_inputs["trainer_state"] = state
            for slot in range(len(self.func_indices)):
                self._pending[(start + row, slot)] = (self.pool.submit(slot, row_inputs), row_inputs)

    def _light_state(self):
        """The trainer state for a worker: without the log history (sent with every call)."""
        if self._state is None:
            return None
        state = copy.copy(self._state)
        state.log_history = []
        return state

    def _log_extra(self, column: str, values: list) -> None:
        self._extras.setdefault(column, []).extend(values)

    def _log_metric(self, name: str, value: float) -> None:
        self._metrics.setdefault(name, []).append(float(value))

    def score(self, responses: torch.Tensor, model_scores: dict[int, torch.Tensor]) -> RewardScores:
        """All rewards of the update's (truncated) ``responses`` and their weighted score.

        Args:
            responses: ``(batch, length)`` responses truncated at the stop token (pad after it).
            model_scores: ``{reward index: (batch,) scores}`` of the reward models.
        """
        n, device = responses.shape[0], responses.device
        per_reward = torch.full((n, len(self.rewards)), math.nan, dtype=torch.float32)
        for index, scores in model_scores.items():
            per_reward[:, index] = scores.detach().float().cpu()
        timeouts, errors = [0] * len(self.rewards), [0] * len(self.rewards)
        inputs = self._completion_inputs(responses, 0)
        if self.func_indices and self.pool is None:
            call_inputs = {**inputs, "trainer_state": self._state, "log_extra": self._log_extra,
                           "log_metric": self._log_metric}
            funcs = {index: (self.names[index], self.rewards[index]) for index in self.func_indices}
            for index, values in call_reward_funcs(funcs, call_inputs).items():
                per_reward[:, index] = torch.tensor(values, dtype=torch.float32)
        elif self.pool is not None:
            self._collect(responses, per_reward, timeouts, errors)
        weighted = per_reward * self.weights.unsqueeze(0)
        unscorable = torch.isnan(per_reward).all(1)
        score = torch.nansum(weighted, 1)  # an unscorable row sums to 0
        return RewardScores(
            names=self.names, per_reward=per_reward, score=score.to(device), unscorable=unscorable.to(device),
            timeouts=timeouts, errors=errors, logged_metrics=dict(self._metrics), extra_columns=dict(self._extras),
            completions=inputs["completions"], prompts=inputs["prompts"],
        )

    def _collect(self, responses, per_reward, timeouts, errors) -> None:
        """The workers' results: rows never submitted are submitted now; a timeout or an error scores NaN."""
        submitted = {row for row, _ in self._pending}
        missing = [row for row in range(responses.shape[0]) if row not in submitted]
        for row in missing:
            self.submit(row, responses[row : row + 1])
        for (row, slot), (pending, row_inputs) in sorted(self._pending.items()):
            index = self.func_indices[slot]
            result = pending.result()
            for column, values in (result.extras or {}).items():
                self._log_extra(column, values)
            for name, values in (result.metrics or {}).items():
                for value in values:
                    self._log_metric(name, value)
            if result.status == "timeout":
                timeouts[index] += 1
            elif result.status == "error":
                errors[index] += 1
            else:
                per_reward[row, index] = check_rewards(self.names[index], result.value, row_inputs)[0]
        self._pending = {}
