"""Endless iteration over a DataLoader, epoch after epoch, that knows where it is (so that a run can resume)."""

from __future__ import annotations

from ..errors import UserInputError


class EpochStream:
    """Yields a DataLoader's batches epoch after epoch and counts ``epoch`` and ``batches_in_epoch``.

    Subclasses say how an epoch's iterator is opened (:meth:`open_epoch`): that is where their RNG handling lives,
    and after ``load_state_dict`` it must skip the ``batches_in_epoch`` batches already taken. A DataLoader whose
    epoch holds no batch (fewer rows than one batch, the incomplete batch dropped) is refused at the first ``next()``
    instead of looping for ever; ``name`` says which data it is.
    """

    name = "the dataset"

    def __init__(self):
        self.epoch = 0
        self.batches_in_epoch = 0
        self._iterator = None

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self._iterator is None:
                self._iterator = self.open_epoch()
            try:
                batch = next(self._iterator)
            except StopIteration:
                if self.batches_in_epoch == 0:
                    raise UserInputError(
                        f"{self.name} gives no batch: it has fewer rows than one batch per process (the last, "
                        "incomplete batch is dropped); use more rows or a smaller batch") from None
                self._iterator = None
                self.epoch += 1
                self.batches_in_epoch = 0
                continue
            self.batches_in_epoch += 1
            return batch

    def open_epoch(self):
        """An iterator over the batches of epoch ``self.epoch`` not taken yet."""
        raise NotImplementedError
