"""Reward-model trainer: TRL's `RewardTrainer` with label smoothing, ranked data and reward centering."""

from __future__ import annotations

import inspect

import torch
from trl import RewardTrainer as _TRLRewardTrainer

from ..models.dtypes import KeepLoadedDtypesMixin
from ..runtime.checkpoints import AtomicCheckpointMixin
from ..runtime.interruption import InterruptibleTrainMixin
from ..runtime.nonfinite import NonFiniteLossGuardMixin
from ..trl_internals import get_config_model_id, get_dataset_column_names, pad
from .losses import pairwise_reward_loss, ranked_pair_indices, ranked_reward_loss
from .ranked_data import (
    DataCollatorForRankedPreference,
    preference_dataset_kind,
    prepare_ranked_dataset,
)
from .reward_centering import check_centering_supported, fold_reward_offset
from .reward_config import RewardConfig


class RewardTrainer(
    InterruptibleTrainMixin, NonFiniteLossGuardMixin, AtomicCheckpointMixin, KeepLoadedDtypesMixin, _TRLRewardTrainer
):
    """[`trl.RewardTrainer`] with trl-ext's extensions (all off by default: then the numbers are TRL's).

    - `args.label_smoothing`: label-smoothed pair loss (:func:`trl_ext.preference.losses.pairwise_reward_loss`).
    - Ranked data: a dataset with a `responses` column (K >= 2 responses, best first; see
      :mod:`trl_ext.preference.ranked_data`) trains on all C(K, 2) pairs of each example, every response scored
      once (:func:`trl_ext.preference.losses.ranked_reward_loss`). Pairwise and ranked datasets can be used for
      train and eval independently; one dataset holds one format. `per_device_train_batch_size` counts examples,
      so a batch holds `sum K` sequences.
    - `args.center_rewards_after_training`: after `train()`, :meth:`center_rewards` on `center_rewards_dataset`.
    - Reliability (:mod:`trl_ext.runtime.checkpoints`, :mod:`trl_ext.runtime.interruption`): checkpoints are written atomically;
      `train(resume_from_checkpoint=True)` takes the latest complete one; SIGINT/SIGTERM save a checkpoint at the
      end of the current optimizer step and raise :class:`trl_ext.runtime.interruption.TrainingInterrupted`; a NaN/inf
      loss or gradient raises :class:`trl_ext.runtime.nonfinite.NonFiniteError` after saving the state before the
      step, or with `nonfinite_policy="skip"` skips that step (:mod:`trl_ext.runtime.nonfinite`).
    - Parameter dtypes stay as loaded (:class:`trl_ext.models.dtypes.KeepLoadedDtypesMixin`): TRL casts the trainable
      parameters of a quantized model to bfloat16, trl-ext keeps them float32; with `fp16` every trainable
      parameter is float32.

    Args:
        *args, **kwargs: as for [`trl.RewardTrainer`].
        center_rewards_dataset ([`~datasets.Dataset`], *optional*):
            Reference set for reward centering, pairwise or ranked (its chosen / best responses are scored).
            Defaults to the train dataset.

    Metrics (TRL's names): `accuracy` and `margin` are over all ranked pairs of the batch (`r_better > r_worse`,
    `r_better - r_worse`); `min_reward`/`mean_reward`/`max_reward` over all responses; `num_tokens`; and
    `reward/center_offset` once, after centering.
    """

    def __init__(self, *args, center_rewards_dataset=None, **kwargs):
        bound = inspect.signature(_TRLRewardTrainer.__init__).bind(None, *args, **kwargs).arguments
        bound.pop("self")
        if bound.get("args") is None:  # TRL would build its own RewardConfig without our fields
            model = bound["model"]
            model_name = model if isinstance(model, str) else get_config_model_id(model.config)
            bound["args"] = RewardConfig(f"{model_name.split('/')[-1]}-Reward")
        elif not isinstance(bound["args"], RewardConfig):
            raise TypeError(f"`args` must be a trl_ext.RewardConfig, got {type(bound['args']).__name__}")
        user_collator = bound.get("data_collator")
        super().__init__(**bound)
        if user_collator is None:
            self.data_collator = DataCollatorForRankedPreference(
                pad_token_id=self.processing_class.pad_token_id, pad_to_multiple_of=self.args.pad_to_multiple_of
            )
        self.center_rewards_dataset = center_rewards_dataset
        if self.args.center_rewards_after_training:
            check_centering_supported(self.accelerator.unwrap_model(self.model))

    # ----------------------------------------------------------------------------------------------- data
    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        if preference_dataset_kind(dataset, dataset_name) == "pairwise":
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        return prepare_ranked_dataset(dataset, processing_class, args, dataset_name)

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["chosen_ids", "rejected_ids", "margin", "responses_ids"]

    # ----------------------------------------------------------------------------------------------- loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        num_responses = inputs.pop("num_responses", None)
        margin = inputs.pop("margin", None)
        inputs["use_cache"] = False
        outputs = model(**inputs)
        rewards = outputs.logits.squeeze(-1)

        if num_responses is None:  # pairwise batch from TRL's collator: [chosen..., rejected...]
            better, worse = torch.chunk(rewards, chunks=2)
            loss = pairwise_reward_loss(
                better, worse, margin, self.args.label_smoothing, self.args.center_rewards_coefficient
            )
        else:  # ranked batch: K_e responses per example, best first
            loss = ranked_reward_loss(
                rewards, num_responses, self.args.label_smoothing, self.args.center_rewards_coefficient
            )
            better_idx, worse_idx, _ = ranked_pair_indices(num_responses, device=rewards.device)
            better, worse = rewards[better_idx], rewards[worse_idx]

        if mode == "train":
            num_tokens_in_batch = self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
            # TRL >= 1.13 counts each token once per tensor-parallel group (its `_tp_size`: the ranks of a group see
            # the same batch); TRL 1.10-1.12 has no such attribute and counts every gathered token.
            self._total_train_tokens += num_tokens_in_batch // getattr(self, "_tp_size", 1)
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]

        # Same metrics and names as TRL; accuracy and margin over all pairs of the batch.
        with torch.no_grad():
            if num_responses is None:  # TRL's code: every process holds 2 * batch rewards
                all_rewards = self.accelerator.gather(outputs.logits)
                min_reward, mean_reward, max_reward = all_rewards.min(), all_rewards.mean(), all_rewards.max()
            else:  # processes hold different numbers of responses: gather per-process statistics instead
                local = rewards.detach().float()
                stats = torch.stack([local.min(), local.max(), local.sum(), torch.tensor(float(local.numel()))
                                     .to(local.device)])
                stats = self.accelerator.gather(stats[None]).view(-1, 4)
                min_reward, max_reward = stats[:, 0].min(), stats[:, 1].max()
                mean_reward = stats[:, 2].sum() / stats[:, 3].sum()
            self._metrics[mode]["min_reward"].append(min_reward.item())
            self._metrics[mode]["mean_reward"].append(mean_reward.item())
            self._metrics[mode]["max_reward"].append(max_reward.item())
            mean_accuracy = (better > worse).float().mean()
            mean_accuracy = self.accelerator.gather_for_metrics(mean_accuracy).mean().item()
            self._metrics[mode]["accuracy"].append(mean_accuracy)
            mean_margin = (better - worse).mean()
            mean_margin = self.accelerator.gather_for_metrics(mean_margin).mean()
            self._metrics[mode]["margin"].append(mean_margin.item())

        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Ranked batches return the loss only: their rewards (sum K per batch) have no fixed shape to gather
        across batches and processes. Pairwise batches go through TRL unchanged."""
        if "num_responses" not in inputs:
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        inputs = self._prepare_inputs(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        return loss.detach(), None, None

    # ------------------------------------------------------------------------------------------ centering
    def train(self, *args, **kwargs):
        output = super().train(*args, **kwargs)
        if self.args.center_rewards_after_training:
            self.center_rewards(self.center_rewards_dataset)
        return output

    @torch.no_grad()
    def reference_rewards(self, dataset=None) -> torch.Tensor:
        """Rewards of the chosen (pairwise) or best (ranked) response of every row of `dataset` (default: the
        train dataset), scored in batches of `per_device_eval_batch_size`, each tokenized as for training."""
        if dataset is None:
            dataset = self.train_dataset
        else:
            dataset = self._prepare_dataset(dataset, self.processing_class, self.args, "center_rewards")
        column = "chosen_ids" if "chosen_ids" in get_dataset_column_names(dataset) else "responses_ids"
        sequences = [row[column] if column == "chosen_ids" else row[column][0] for row in dataset]
        model = self.model
        was_training = model.training
        model.eval()
        rewards = []
        batch_size = self.args.per_device_eval_batch_size
        device = self.accelerator.device
        for start in range(0, len(sequences), batch_size):
            ids = [torch.tensor(s) for s in sequences[start : start + batch_size]]
            input_ids = pad(ids, padding_value=self.processing_class.pad_token_id, padding_side="right")
            attention_mask = pad([torch.ones_like(s) for s in ids], padding_value=0, padding_side="right")
            out = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False)
            rewards.append(out.logits.squeeze(-1).float().cpu())
        model.train(was_training)
        return torch.cat(rewards)

    def center_rewards(self, dataset=None) -> float:
        """Subtract the mean reward on `dataset` (default: chosen/best responses of the train set) from the score
        head's bias (:func:`trl_ext.preference.reward_centering.fold_reward_offset`); log and return the offset."""
        offset = self.reference_rewards(dataset).mean().item()
        fold_reward_offset(self.accelerator.unwrap_model(self.model), offset)
        self.log({"reward/center_offset": offset})
        return offset
