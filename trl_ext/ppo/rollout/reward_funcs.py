"""What :class:`trl_ext.PPOTrainer`'s steps call for ``reward_funcs`` (TRL GRPO's reward functions, reward models
mixed in): one object the trainer's steps call; the contract, the scorer and the metrics are
:mod:`trl_ext.rewards`.

* :func:`prepare_reward_funcs` (before the parent's ``__init__``): the run's rewards and weights, a collator that
  keeps the dataset's columns, and a stand-in reward model for the parent when there is none;
* :func:`build_reward_scoring` (after it): models in ``reward_funcs`` to the device, frozen, and the feature's one
  object, :class:`RewardFunctionScoring` (the :class:`~trl_ext.rewards.scoring.RewardScorer` and its worker pool),
  which the trainer's named steps call (see the class).

Without ``reward_funcs`` none of this runs: the trainer scores with its reward model exactly as before.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from transformers import DataCollatorWithPadding

from ...errors import UserInputError
from ...models.scalar_heads import scalar_model_outputs
from ...rewards.columns import ColumnsCollator, batch_columns
from ...rewards.metrics import reward_metrics
from ...rewards.scoring import RewardScorer, build_reward_list

__all__ = ["NoRewardModel", "RewardFunctionScoring", "build_reward_scoring", "prepare_reward_funcs"]


class NoRewardModel(nn.Module):
    """What the parent trainer gets as ``reward_model`` when the run has reward functions only; the trainer puts
    ``None`` back right after the parent's ``__init__``. It has a config and one frozen number because the parent
    hands its reward model to ``prepare_deepspeed`` under DeepSpeed, which reads ``config`` and wants parameters."""

    def __init__(self):
        super().__init__()
        from transformers import PretrainedConfig

        self.config = PretrainedConfig()
        self.placeholder = nn.Parameter(torch.zeros(1), requires_grad=False)


def prepare_reward_funcs(args, processing_class, reward_model, reward_funcs, data_collator, columns=None,
                         extra_keywords=()):
    """Before the parent's ``__init__``: ``(reward_model for the parent, data_collator, rewards)``, ``rewards`` being
    ``(rewards, weights, names)`` (:func:`~trl_ext.rewards.scoring.build_reward_list`), or None without
    ``reward_funcs``.

    ``rewards`` is None without ``reward_funcs`` (then ``reward_model`` is required and ``reward_weights`` must be
    unset or a single weight of 1).

    Raises:
        UserInputError: no reward at all, a bad ``reward_funcs`` entry, ``reward_weights`` of the wrong length, a
            function whose signature does not fit the train dataset's ``columns`` (None: not known) and the
            trainer's ``extra_keywords`` (``environments`` with environments).
    """
    if reward_funcs is None:
        if reward_model is None:
            raise UserInputError("reward_model: None and no reward_funcs; pass a reward model, reward_funcs, or both")
        if args.reward_weights is not None and args.reward_weights != [1.0]:
            raise UserInputError(
                f"reward_weights: {args.reward_weights} given, but the run has one reward (the reward model) and no "
                "reward_funcs; remove reward_weights"
            )
        if args.reward_num_workers:
            warnings.warn("reward_num_workers is ignored: the run has no reward_funcs", stacklevel=3)
        return reward_model, data_collator, None
    rewards = build_reward_list(reward_model, reward_funcs, args.reward_weights)  # (rewards, weights, names)
    from ...rewards.resolve import check_reward_func

    for func, name in zip(*rewards[::2]):  # each function's signature against the train dataset's columns
        if not isinstance(func, nn.Module):
            check_reward_func(func, f"reward_funcs: {name}", columns, extra_keywords)
    data_collator = ColumnsCollator(data_collator or DataCollatorWithPadding(processing_class))
    return (reward_model if reward_model is not None else NoRewardModel()), data_collator, rewards


def build_reward_scoring(reward_list, reward_model, processing_class, args, accelerator
                         ) -> tuple["RewardFunctionScoring | None", object]:
    """After the parent's ``__init__``: the run's :class:`RewardFunctionScoring` (None without ``reward_funcs``) and
    its reward model as the parent prepared it (``reward_model``), None when the run has reward functions only."""
    if isinstance(getattr(reward_model, "module", reward_model), NoRewardModel):  # also DeepSpeed's
        reward_model = None
    if reward_list is None:
        return None, reward_model
    rewards, weights, names = reward_list
    if reward_model is not None:
        rewards = [reward_model, *rewards[1:]]  # the parent moved it to the device (or DeepSpeed)
    for i, reward in enumerate(rewards):
        if isinstance(reward, nn.Module) and reward is not reward_model:
            reward.eval()
            reward.requires_grad_(False)
            if not hasattr(reward, "adapter_name"):  # a SharedBaseScalarModel lives on the policy already
                rewards[i] = reward.to(accelerator.device)
    scorer = RewardScorer(rewards, weights, names, processing_class, processing_class.pad_token_id,
                          num_workers=args.reward_num_workers, timeout_s=args.reward_timeout_s)
    if reward_model is None and args.num_sample_generations > 0:
        warnings.warn(
            "num_sample_generations: TRL's sample generations are scored by a reward model and this run has none; "
            "they are skipped (set log_completions: true for a table of completions and their rewards)",
            stacklevel=3,
        )
    scoring = RewardFunctionScoring(scorer, processing_class.pad_token_id, args.num_samples_per_prompt,
                                    accelerator.gather_for_metrics)
    return scoring, reward_model


class RewardFunctionScoring:
    """``reward_funcs`` in one trainer: the :class:`~trl_ext.rewards.scoring.RewardScorer` (and its worker pool),
    built once by :func:`build_reward_scoring`, called at the trainer's named steps:

    * :meth:`begin` (``sample_and_score``, before generation): the prompt batch's ids and dataset columns;
    * :meth:`submit` (each generated chunk, or each finished row of continuous batching): truncated responses to
      the workers (a no-op in process);
    * :meth:`model_scores` (``compute_scores``, per chunk) and :meth:`finish` (``score_rollouts``): the rollout's
      rewards and weighted score;
    * :meth:`zero_unscorable` (``compute_advantages``) and :meth:`metrics` (``update_metrics``);
    * :meth:`close` (end of ``train``): the worker processes.
    """

    def __init__(self, scorer: RewardScorer, pad_token_id: int, num_samples_per_prompt: int, gather):
        self.scorer = scorer
        self.pad_token_id = pad_token_id
        self.num_samples_per_prompt = num_samples_per_prompt
        self.gather = gather

    def begin(self, batch: dict, state) -> None:
        """Before generation: the prompt batch's ids and columns to the scorer."""
        self.scorer.begin(batch["input_ids"], batch_columns(batch), state)

    def submit(self, start: int, truncated_responses: torch.Tensor) -> None:
        """Right after a chunk is generated: its truncated responses to the workers (a no-op in process)."""
        self.scorer.submit(start, truncated_responses)

    def use_episodes(self, episodes, environments) -> None:
        """With ``tools``, after generation: the episodes' messages are the completions (and ``environments``)."""
        self.scorer.use_episodes(episodes.completions, environments)

    def model_scores(self, postprocessed_query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """``(chunk, models)`` scores of the reward models among the rewards (the scoring pass, per chunk)."""
        scores = [scalar_model_outputs(model, postprocessed_query_response, self.pad_token_id, context_length)[1]
                  for model in self.scorer.reward_models]
        if not scores:
            return torch.zeros(postprocessed_query_response.shape[0], 0, device=postprocessed_query_response.device)
        return torch.stack(scores, 1)

    def finish(self, rollout, model_scores: torch.Tensor) -> torch.Tensor:
        """After the scoring pass: every reward of the rollout (``rollout.reward_scores``); returns the scores."""
        per_model = {index: model_scores[:, j] for j, index in enumerate(self.scorer.model_indices)}
        rollout.reward_scores = self.scorer.score(rollout.postprocessed_responses, per_model)
        return rollout.reward_scores.score.to(model_scores.device)

    @staticmethod
    def zero_unscorable(rollout) -> None:
        """Completions that no reward scored (every one said None) teach nothing: advantage 0 on their tokens."""
        scores = getattr(rollout, "reward_scores", None)
        if scores is not None and bool(scores.unscorable.any()):
            rollout.advantages = torch.masked_fill(rollout.advantages, scores.unscorable.unsqueeze(1), 0)

    def metrics(self, rollout) -> dict:
        """The reward-function metrics of the update (:mod:`trl_ext.rewards.metrics`), the environments' per-turn
        rewards counted in ``reward`` and the group metrics."""
        sequence_lengths = rollout.sequence_lengths
        if rollout.observation_mask is not None:  # tools: TRL counts the model's tokens only (its `tool_mask`)
            sequence_lengths = (~rollout.padding_mask).sum(1) - 1
        return reward_metrics(rollout.reward_scores, sequence_lengths, rollout.contain_eos_token,
                              self.num_samples_per_prompt, self.gather, with_workers=self.scorer.pool is not None,
                              turn_rewards=rollout.turn_rewards)

    def close(self) -> None:
        """Stop the worker processes (the next ``train()`` restarts them)."""
        self.scorer.close()
