"""Pretraining-mix (PPO-ptx): tokenization, an endless, resumable, independently seeded batch stream, and
:class:`PretrainingMix`, the feature's one object in the trainer (LM loss, the separate ptx step's backward)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler

from ..errors import UserInputError
from ..runtime.epoch_stream import EpochStream


def tokenize_ptx_dataset(dataset, tokenizer, max_length: int):
    """Return ``dataset`` with only ``input_ids`` and ``attention_mask``, truncated to ``max_length`` tokens.

    Accepts plain text in a ``text`` column (tokenized with ``tokenizer``) or already tokenized ``input_ids``
    (an ``attention_mask`` column is kept if present, else made of ones). Sequences shorter than 2 tokens have no
    next-token target and are dropped.
    """
    columns = dataset.column_names
    if "input_ids" in columns:

        def cut(example):
            ids = list(example["input_ids"])[:max_length]
            mask = list(example["attention_mask"])[:max_length] if "attention_mask" in columns else [1] * len(ids)
            return {"input_ids": ids, "attention_mask": mask}

        dataset = dataset.map(cut, remove_columns=columns)
    elif "text" in columns:
        dataset = dataset.map(
            lambda batch: tokenizer(batch["text"], truncation=True, max_length=max_length),
            batched=True,
            remove_columns=columns,
        )
        dataset = dataset.select_columns(["input_ids", "attention_mask"])
    else:
        raise UserInputError(
            f"ptx_dataset: needs a 'text' column (plain text) or an 'input_ids' column (tokenized), got {columns}"
        )
    dataset = dataset.filter(lambda example: sum(example["attention_mask"]) >= 2)
    if len(dataset) == 0:
        raise UserInputError("ptx_dataset: no sequence has 2 or more tokens; give it real text")
    return dataset


class PtxStream(EpochStream):
    """Endless stream of padded ptx batches, cycled epoch after epoch, independent of every other RNG.

    Each process reads its own shard of a permutation that depends only on ``seed`` and the epoch
    (``torch.utils.data.DistributedSampler``); the DataLoader gets its own generator, so drawing ptx batches
    never touches the global torch RNG (the prompt stream and generation are unaffected).
    ``state_dict()`` is ``{"epoch", "batches_in_epoch"}``; ``load_state_dict`` fast-forwards to it.
    """

    name = "ptx_dataset (the pretraining mix)"

    def __init__(self, dataset, tokenizer, batch_size: int, seed: int, num_replicas: int = 1, rank: int = 0):
        super().__init__()
        self.sampler = DistributedSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            collate_fn=lambda rows: _pad_right(rows, pad_id),
            generator=torch.Generator().manual_seed(seed),
        )

    def open_epoch(self):
        self.sampler.set_epoch(self.epoch)
        iterator = iter(self.loader)
        for _ in range(self.batches_in_epoch):  # after load_state_dict
            next(iterator)
        return iterator

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batches_in_epoch = int(state["epoch"]), int(state["batches_in_epoch"])
        self._iterator = None


def _pad_right(rows, pad_id: int) -> dict[str, torch.Tensor]:
    length = max(len(r["input_ids"]) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        input_ids[i, :n] = torch.tensor(r["input_ids"], dtype=torch.long)
        attention_mask[i, :n] = torch.tensor(r["attention_mask"], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@dataclass(frozen=True)
class PtxConfig:
    """The ptx keys of a :class:`~trl_ext.PPOConfig`, resolved (``batch_size``: ``ptx_batch_size`` or
    ``per_device_train_batch_size``)."""

    coef: float
    mode: str
    max_length: int
    batch_size: int
    seed: int

    @classmethod
    def from_args(cls, args) -> "PtxConfig":
        return cls(args.ptx_coef, args.ptx_mode, args.ptx_max_length,
                   args.ptx_batch_size or args.per_device_train_batch_size, args.seed)


class PretrainingMix:
    """PPO-ptx of one trainer (InstructGPT eq. 2): the tokenized text, its stream and the policy's LM loss on it,
    built once when the trainer gets a ``ptx_dataset`` with ``ptx_coef > 0``. The trainer's steps call it:
    ``next_ptx_batch`` (:meth:`next_batch`), ``compute_ptx_loss`` (:meth:`lm_loss`) and, with
    ``ptx_mode="separate"``, ``ptx_step`` (:meth:`backward_separate`).

    Args:
        dataset: the ptx texts (see :func:`tokenize_ptx_dataset`).
        tokenizer: the policy's tokenizer.
        cfg: the ptx keys (:class:`PtxConfig`).
        accelerator: the process's rank and count (each process streams its own shard).
    """

    def __init__(self, dataset, tokenizer, cfg: PtxConfig, accelerator):
        self.coef, self.mode = cfg.coef, cfg.mode
        self.dataset = tokenize_ptx_dataset(dataset, tokenizer, cfg.max_length)
        self.stream = PtxStream(self.dataset, tokenizer, batch_size=cfg.batch_size, seed=cfg.seed,
                                num_replicas=accelerator.num_processes, rank=accelerator.process_index)

    def next_batch(self) -> dict:
        """The next ptx micro-batch (its own data order, cycled)."""
        return next(self.stream)

    @staticmethod
    def lm_loss(policy, batch: dict, device) -> torch.Tensor:
        """The policy's LM loss on a ptx batch (:func:`trl_ext.ppo.objective.losses.ptx_lm_loss`)."""
        from .objective.losses import ptx_lm_loss

        input_ids = batch["input_ids"].to(device)
        attention_mask = batch["attention_mask"].to(device)
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        logits = policy(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits
        return ptx_lm_loss(logits, input_ids, attention_mask)

    def backward_separate(self, lm_loss: torch.Tensor, accelerator, policy) -> None:
        """DeepSpeed-Chat's separate ptx step of ``ptx_mode="separate"``, before its optimizer step: backward of
        ``ptx_coef * lm_loss``. Runs right after a PPO optimizer step. Only the policy gets gradients (the value
        head's stay None, so the optimizer leaves it alone). Under several processes the policy gradients are
        averaged by hand, because this forward does not go through the DistributedDataParallel wrapper."""
        # accelerator.backward divides by gradient_accumulation_steps; this is one whole step, so undo it.
        accelerator.backward(self.coef * lm_loss * accelerator.gradient_accumulation_steps)
        if accelerator.num_processes > 1:
            for param in policy.parameters():
                if param.grad is not None:
                    param.grad = accelerator.reduce(param.grad, reduction="mean")
