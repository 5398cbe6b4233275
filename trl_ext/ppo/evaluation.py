"""Evaluation during training (``eval_strategy: steps``) on :class:`trl_ext.PPOTrainer`'s ``eval_dataset``, scored
with the run's rewards as TRL's ``GRPOTrainer`` scores its evaluation; the training RNG streams are left as they
were. How it works: docs/ppo-internals.md#evaluation-during-training."""

from __future__ import annotations

import contextlib
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
from transformers import GenerationConfig
from transformers.trainer_utils import speed_metrics

from ..field_rules import help_from_docstring
from ..models.scalar_heads import scalar_model_outputs
from ..rewards.metrics import reward_metrics
from ..rewards.scoring import RewardScores
from ..trl_internals import unwrap_model_for_generation
from .rollout.sequences import first_true_indices, padded_model_inputs

__all__ = ["EvaluationArgs", "Evaluation", "evaluation_on", "gather_rows"]


@help_from_docstring
@dataclass
class EvaluationArgs:
    """Config fields of evaluation during training (:mod:`trl_ext.ppo.evaluation`), beside HF's `eval_strategy`,
    `eval_steps`, `eval_delay` and `per_device_eval_batch_size`.

    Parameters:
        eval_do_sample (`bool`, *optional*, defaults to `False`):
            `False`: each evaluation prompt gets one greedy completion. `True`: one completion sampled at
            `temperature`, as the rollouts sample, from a copy of the RNG state (the training's stream is unchanged).
    """

    eval_do_sample: bool = False


def evaluation_on(args) -> bool:
    """Whether `args.eval_strategy` asks for evaluation (anything but `"no"`; an enum or its string)."""
    strategy = getattr(args, "eval_strategy", "no")
    return str(getattr(strategy, "value", strategy)).lower() != "no"


def gather_rows(accelerator, tensor: torch.Tensor) -> torch.Tensor:
    """Every process's rows of `tensor` in process order, when the processes hold different numbers of rows."""
    if accelerator.num_processes == 1:
        return tensor
    flag = tensor.dtype == torch.bool  # padding would make a bool tensor an integer one on some processes only
    sizes = accelerator.gather(torch.tensor([tensor.shape[0]], device=tensor.device)).tolist()
    padded = accelerator.pad_across_processes(tensor.to(torch.uint8) if flag else tensor, dim=0)
    gathered = accelerator.gather(padded)
    width = padded.shape[0]
    rows = torch.cat([gathered[i * width : i * width + n] for i, n in enumerate(sizes)])
    return rows.bool() if flag else rows


@contextlib.contextmanager
def restored_rng_states(device: torch.device):
    """Restore the torch (CPU and `device` if CUDA), numpy and Python RNG states on exit."""
    devices = [device.index or 0] if device.type == "cuda" else []
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


class Evaluation:
    """`eval_dataset` generated on and scored every `eval_steps` updates (module docstring): the trainer's part for
    its ``evaluate()``, built once (:meth:`build`) from the config's evaluation keys, the data, the models and the
    accelerator.

    State: this process's shard of the evaluation rows (`indices`, with `valid` False on the padding repeats), the
    generation config, and `history`, the metrics of every evaluation so far."""

    def __init__(self, args, *, dataset, data_collator, model, accelerator, processing_class, reward_scoring=None,
                 reward_model=None):
        self.dataset, self.data_collator = dataset, data_collator
        self.model, self.accelerator = model, accelerator
        self.pad_token_id, self.eos_token_id = processing_class.pad_token_id, processing_class.eos_token_id
        self.reward_scoring, self.reward_model = reward_scoring, reward_model
        n, world, rank = len(self.dataset), accelerator.num_processes, accelerator.process_index
        per_process = -(-n // world)
        start = min(rank * per_process, n)
        own = list(range(start, min(start + per_process, n)))
        self.valid = [True] * len(own) + [False] * (per_process - len(own))
        self.indices = own + [own[0] if own else 0] * (per_process - len(own))
        kwargs = {"max_new_tokens": args.response_length, "do_sample": bool(args.eval_do_sample)}
        if args.eval_do_sample:  # the rollouts' distribution: the run's temperature, no truncation
            kwargs.update(temperature=args.temperature + 1e-7, top_k=0, top_p=1.0)
        self.generation_kwargs = kwargs
        self.generation_config = GenerationConfig(**kwargs)
        self.batch_size = args.per_device_eval_batch_size
        self.gather_deepspeed3_params = args.ds3_gather_for_generation
        self.history: list[dict] = []

    @classmethod
    def build(cls, args, *, dataset, reward_scoring=None, **parts) -> "Evaluation | None":
        """The run's evaluation (None when `eval_strategy` is `"no"`); the reward functions' signatures are checked
        against the evaluation columns here, before training starts. ``parts``: the other arguments of the class."""
        if not evaluation_on(args):
            return None
        if reward_scoring is not None:
            from ..rewards.resolve import check_reward_func

            scorer = reward_scoring.scorer
            for index in scorer.func_indices:
                check_reward_func(scorer.rewards[index], f"reward_funcs: {scorer.names[index]} (eval_dataset)",
                                  list(dataset.column_names))
        return cls(args, dataset=dataset, reward_scoring=reward_scoring, **parts)

    def run(self, state, postprocess) -> dict:
        """One evaluation with the current policy; returns its metrics (`eval_*`, every process alike). ``state``:
        the trainer's (the reward functions' ``trainer_state``; its step names the evaluation in ``history``);
        ``postprocess``: the trainer's ``postprocess_responses`` (responses cut at the stop token)."""
        accelerator = self.accelerator
        started = time.time()
        with restored_rng_states(accelerator.device), torch.no_grad():
            parts = [self.score_batch(self.indices[i : i + self.batch_size], state, postprocess)
                     for i in range(0, len(self.indices), self.batch_size)]
        valid = torch.tensor(self.valid, dtype=torch.bool, device=accelerator.device)
        scores = _joined([p[0] for p in parts], valid)
        lengths, stops = (torch.cat([p[i].to(accelerator.device) for p in parts])[valid] for i in (1, 2))
        with_workers = self.reward_scoring is not None and self.reward_scoring.scorer.pool is not None
        metrics = reward_metrics(scores, lengths, stops, 1, lambda t: gather_rows(accelerator, t),
                                 with_workers=with_workers)
        metrics = {f"eval_{key}": value for key, value in metrics.items()}
        metrics.update(speed_metrics("eval", started, num_samples=len(self.dataset), num_steps=len(parts)))
        self.history.append({"step": state.global_step, **metrics})
        return metrics

    def score_batch(self, indices: list[int], state, postprocess) -> tuple[RewardScores, torch.Tensor, torch.Tensor]:
        """One batch of evaluation prompts: `(rewards, index of each response's last token, has the stop token)`."""
        batch = self.data_collator([self.dataset[i] for i in indices])
        queries = batch["input_ids"].to(self.accelerator.device)
        pad_token_id = self.pad_token_id
        context_length = queries.shape[1]
        with unwrap_model_for_generation(self.model, self.accelerator,
                                         gather_deepspeed3_params=self.gather_deepspeed3_params,
                                         generation_kwargs=self.generation_kwargs) as unwrapped_model:
            inputs = padded_model_inputs(queries, pad_token_id)
            sequences = unwrapped_model.policy.generate(input_ids=inputs["input_ids"],
                                                        attention_mask=inputs["attention_mask"],
                                                        generation_config=self.generation_config)
        responses = postprocess(sequences[:, context_length:])
        query_responses = torch.cat((queries, responses), 1)
        lengths = first_true_indices(responses == pad_token_id) - 1
        stops = torch.any(responses == self.eos_token_id, -1)
        if self.reward_scoring is not None:  # reward_funcs: functions and models, weighted
            self.reward_scoring.begin(batch, state)
            model_scores = self.reward_scoring.model_scores(query_responses, context_length)
            scorer = self.reward_scoring.scorer
            per_model = {index: model_scores[:, j] for j, index in enumerate(scorer.model_indices)}
            return scorer.score(responses, per_model), lengths, stops
        _, score, _ = scalar_model_outputs(self.reward_model, query_responses, pad_token_id, context_length)
        return RewardScores(names=["reward_model"], per_reward=score.detach().float().cpu().unsqueeze(1), score=score,
                            unscorable=torch.zeros_like(score, dtype=torch.bool), timeouts=[0], errors=[0]), \
            lengths, stops


def _joined(parts: list[RewardScores], valid: torch.Tensor) -> RewardScores:
    """The batches' rewards as one :class:`~trl_ext.rewards.scoring.RewardScores`, the padding rows left out."""
    first = parts[0]
    metrics: dict = {}
    for part in parts:
        for name, values in part.logged_metrics.items():
            metrics.setdefault(name, []).extend(values)
    return RewardScores(
        names=first.names, per_reward=torch.cat([p.per_reward for p in parts])[valid.cpu()],
        score=torch.cat([p.score.to(valid.device) for p in parts])[valid],
        unscorable=torch.cat([p.unscorable.to(valid.device) for p in parts])[valid],
        timeouts=[sum(t) for t in zip(*(p.timeouts for p in parts))],
        errors=[sum(e) for e in zip(*(p.errors for p in parts))], logged_metrics=metrics,
    )
