"""The PPO prompt stream: an endless, resumable iterator over the (accelerate-prepared) prompt DataLoader."""

from __future__ import annotations

from typing import Any

import torch

from ...runtime.epoch_stream import EpochStream


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
