"""The PPO prompts: an endless, resumable stream over the (accelerate-prepared) prompt DataLoader, and the grouping
of ``num_samples_per_prompt`` samples of each prompt (a DataLoader of ``local_batch_size / k`` prompts, each prompt
repeated ``k`` times)."""

from __future__ import annotations

from typing import Any

import torch

from ...runtime.epoch_stream import EpochStream

__all__ = ["PromptStream", "grouped_prompt_loader", "repeat_prompts"]


class PromptStream(EpochStream):
    """Yields the prompt DataLoader's batches epoch after epoch, like TRL's ``repeat_generator``, and can resume.

    A shuffling DataLoader draws its epoch's order when its iterator starts: from the global torch RNG (one
    process: ``RandomSampler`` and the DataLoader's base seed) and, under several processes, from accelerate's
    synchronized sampler generator. So the stream records those RNG states just before each epoch starts.
    ``state_dict()`` holds the epoch, the number of batches already taken in it and those RNG states; after
    ``load_state_dict`` the next ``next()`` rebuilds the epoch's iterator under the recorded RNG states, skips the
    batches already taken, then puts the global torch RNG back as it was (so the rest of the run is unaffected).
    Same RNG consumption as TRL's generator: the epoch's iterator starts at the first ``next()`` of the epoch.
    """

    name = "train_dataset (the PPO prompts)"

    def __init__(self, dataloader):
        super().__init__()
        self.dataloader = dataloader
        self.epoch_rng_state: dict[str, Any] | None = None
        self._pending_fast_forward = False

    def open_epoch(self):
        if self._pending_fast_forward:
            self._pending_fast_forward = False
            if self.epoch_rng_state is not None:  # None: saved before the first batch, nothing to replay
                return self._replay_epoch()
        self.epoch_rng_state = self._rng_state()
        return iter(self.dataloader)

    def _generator(self) -> torch.Generator | None:
        return getattr(self.dataloader, "synchronized_generator", None)

    def _rng_state(self) -> dict[str, Any]:
        state = {"torch": torch.get_rng_state(), "epoch": self.epoch}
        generator = self._generator()
        if generator is not None:
            state["generator"] = generator.get_state()
        if hasattr(self.dataloader, "iteration"):
            state["iteration"] = int(self.dataloader.iteration)
        return state

    def _set_rng_state(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        generator = self._generator()
        if generator is not None and "generator" in state:
            generator.set_state(state["generator"])
        if "iteration" in state and hasattr(self.dataloader, "iteration"):
            self.dataloader.iteration = state["iteration"]

    def _replay_epoch(self):
        current = torch.get_rng_state()  # restored by the resume from the checkpoint's rng_state.pth
        self._set_rng_state(self.epoch_rng_state)
        iterator = iter(self.dataloader)
        for _ in range(self.batches_in_epoch):
            next(iterator)
        # The epoch's draws are replayed; the sampler generator stays where they left it (as in the original run),
        # the global RNG goes back to the checkpoint's state.
        torch.set_rng_state(current)
        return iterator

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch, "epoch_rng_state": self.epoch_rng_state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self.epoch_rng_state = state["epoch_rng_state"]
        self._iterator = None
        self._pending_fast_forward = True


def grouped_prompt_loader(k: int, local_batch_size: int, train_dataset, data_collator, accelerator, seed: int,
                          local_seed: int):
    """With ``k = num_samples_per_prompt > 1``: the prompt DataLoader of ``local_batch_size / k`` prompts (prepared)
    that replaces the parent's (None when ``k`` is 1: the parent's stays).

    Seeded as the parent seeds its own (``seed`` right before ``accelerator.prepare``, then the process's
    ``local_seed``), so the shuffle is the same on every process and the torch RNG ends where the parent left it.
    """
    from torch.utils.data import DataLoader

    if k == 1:
        return None
    dataloader = DataLoader(train_dataset, batch_size=local_batch_size // k, shuffle=True, collate_fn=data_collator,
                            drop_last=True)
    torch.manual_seed(seed)
    prepared = accelerator.prepare(dataloader)
    torch.manual_seed(local_seed)
    return prepared


def repeat_prompts(batch: dict, k: int) -> dict:
    """Each prompt of a collated batch `k` times in a row (`[p0, p0, p1, p1, ...]` for `k = 2`), its tensors and its
    list columns (the dataset columns reward functions get) alike."""
    if k == 1:
        return batch

    def repeat(value):
        if torch.is_tensor(value):
            return value.repeat_interleave(k, dim=0)
        if isinstance(value, list):
            return [item for item in value for _ in range(k)]
        return value

    return {key: repeat(value) for key, value in batch.items()}
