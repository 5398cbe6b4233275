"""accelerate's stack of open DataLoaders: the state that decides when TRL's PPO accumulates gradients.

With accelerate's default ``sync_with_dataloader=True`` (which TRL's PPO keeps), ``accelerator.accumulate`` steps the
optimizer on *every* micro-batch while the DataLoader on top of accelerate's process-wide stack of open DataLoaders
(``GradientState.dataloader_references``) is at its last batch, and every ``gradient_accumulation_steps``
micro-batches otherwise. In PPO that stack holds the prompt DataLoader (re-opened at each epoch) and the
sample-generation DataLoader, which ``generate_completions`` leaves open after one batch. So with
``gradient_accumulation_steps > 1`` some updates do not accumulate, depending on this history. No checkpoint holds
it: :func:`dataloader_stack` records it (which of the trainer's DataLoaders are open, in order, and whether each is
at its last batch) and :func:`restore_dataloader_stack` rebuilds it, so that a resumed run accumulates exactly as
the uninterrupted run would have. ``PPOConfig.sync_with_dataloader=False`` removes the dependence altogether.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def dataloader_stack(gradient_state, dataloaders: Mapping[str, object]) -> list[tuple[str, bool]]:
    """The open DataLoaders among `dataloaders` (name -> accelerate DataLoader), bottom to top, with their
    end-of-data flags."""
    names = {id(dl): name for name, dl in dataloaders.items() if dl is not None}
    return [
        (names[id(dl)], bool(dl.end_of_dataloader))
        for dl in gradient_state.dataloader_references
        if dl is not None and id(dl) in names
    ]


def restore_dataloader_stack(
    gradient_state,
    dataloaders: Mapping[str, object],
    stack: list[tuple[str, bool]],
    *,
    keep_flags: Collection[str] = (),
) -> None:
    """Make `stack` (from :func:`dataloader_stack`) the top of accelerate's stack; other DataLoaders stay below it
    in their order. The end-of-data flags of the names in `keep_flags` (DataLoaders being iterated right now) are
    left as they are."""
    ours = {id(dl) for dl in dataloaders.values() if dl is not None}
    others = [dl for dl in gradient_state.dataloader_references if dl is None or id(dl) not in ours]
    for name, at_end in stack:
        if name not in keep_flags:
            dataloaders[name].end_of_dataloader = at_end
    gradient_state.dataloader_references = others + [dataloaders[name] for name, _ in stack]
