"""Every name trl-ext takes from TRL outside TRL's public top level, and nowhere else.

The names of :data:`FROM_TRL` load on first use (``from trl_ext.trl_internals import pad``); one that the installed
TRL lacks raises :class:`MovedInTRL`, naming it. The small pure helpers are copied below instead, each with its TRL
source. Checked on :data:`CHECKED_ON` (tests/test_trl_internals.py; docs/trl-versions.md says what a newer TRL means).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import torch

__all__ = ["CHECKED_ON", "FROM_TRL", "MovedInTRL", "disable_dropout_in_model", "get_config_model_id",
           "get_dataset_column_names", "nanstd", "pad", "trl_chat_template"]

CHECKED_ON = ("1.12.0", "1.16.0")
"""The TRL releases on which every name below was imported and the copies compared with TRL's."""

FROM_TRL = {  # our name: (TRL module, TRL name)
    # TRL 1.13+ runs it as a fused Triton kernel on CUDA: not copied, so trl-ext gets that kernel where TRL has it
    "selective_log_softmax": ("trl.trainer.utils", "selective_log_softmax"),
    "create_model_from_path": ("trl.trainer.utils", "create_model_from_path"),
    "log_table_to_comet_experiment": ("trl.trainer.utils", "log_table_to_comet_experiment"),
    "unwrap_model_for_generation": ("trl.models.utils", "unwrap_model_for_generation"),
    "prepare_deepspeed": ("trl.models.utils", "prepare_deepspeed"),
    "BaseTrainer": ("trl.trainer.base_trainer", "_BaseTrainer"),
    "BaseConfig": ("trl.trainer.base_config", "_BaseConfig"),
    "tokenize": ("trl.data_utils", "_tokenize"),
    "DataCollatorForPreference": ("trl.trainer.reward_trainer", "DataCollatorForPreference"),
    "suppress_seqcls_warning": ("trl.trainer.reward_trainer", "suppress_seqcls_warning"),
    "parse_response": ("trl.chat_template_utils", "parse_response"),
    "get_training_chat_template": ("trl.chat_template_utils", "get_training_chat_template"),
    "is_chat_template_prefix_preserving": ("trl.chat_template_utils", "is_chat_template_prefix_preserving"),
    "add_response_schema": ("trl.chat_template_utils", "add_response_schema"),
    "supports_tool_calling": ("trl.chat_template_utils", "supports_tool_calling"),
    # TRL 1.10-1.12 only: trl_ext.ppo.base asks for them when it chooses TRL's PPO as the parent
    "ExperimentalPPOConfig": ("trl.experimental.ppo", "PPOConfig"),
    "ExperimentalPPOTrainer": ("trl.experimental.ppo", "PPOTrainer"),
    "OnlineTrainerState": ("trl.experimental.ppo.ppo_trainer", "OnlineTrainerState"),
}
UNTIL_1_12 = ("ExperimentalPPOConfig", "ExperimentalPPOTrainer", "OnlineTrainerState")


class MovedInTRL(ImportError):
    """A name of :data:`FROM_TRL` that the installed TRL does not have where trl-ext looks for it."""

    def __init__(self, module: str, name: str, cause: BaseException):
        import trl

        super().__init__(f"trl-ext needs {module}.{name}, which TRL {trl.__version__} does not provide ({cause}); "
                         f"trl-ext was checked on TRL {' and '.join(CHECKED_ON)}: install one of those "
                         "(docs/trl-versions.md)")


def __getattr__(name: str):
    if name not in FROM_TRL:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attr = FROM_TRL[name]
    try:
        value = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise MovedInTRL(module, attr, error) from error
    globals()[name] = value
    return value


def trl_chat_template(filename: str) -> str:
    """The text of one of the chat templates TRL ships (``trl/chat_templates/<filename>``)."""
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / filename).read_text(encoding="utf-8")


# ------------------------------------------------------------------ copies (the same in TRL 1.12 and 1.16)


def pad(tensors: list[torch.Tensor], padding_value: int = 0, padding_side: str = "right",
        pad_to_multiple_of: int | None = None) -> torch.Tensor:
    """TRL's ``trl.trainer.utils.pad``: the tensors padded to one shape along every dimension, stacked."""
    output_shape = np.max([t.shape for t in tensors], 0).tolist()
    if pad_to_multiple_of is not None:
        remainder = output_shape[0] % pad_to_multiple_of
        if remainder != 0:
            output_shape[0] += pad_to_multiple_of - remainder
    output = torch.full((len(tensors), *output_shape), padding_value, dtype=tensors[0].dtype, device=tensors[0].device)
    for i, t in enumerate(tensors):
        if padding_side == "left":
            seq_start = output_shape[0] - t.shape[0]
        elif padding_side == "right":
            seq_start = 0
        else:
            raise ValueError("padding_side must be 'left' or 'right'")
        slices = (slice(seq_start, seq_start + t.shape[0]),) + tuple(slice(0, s) for s in t.shape[1:])
        output[i][slices] = t
    return output


def nanstd(tensor: torch.Tensor, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> torch.Tensor:
    """TRL's ``trl.trainer.utils.nanstd``: the unbiased std over the non-NaN entries (NaN with fewer than two)."""
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction  # Bessel's correction
    std = torch.sqrt(variance)
    if keepdim:
        return std
    if dim is None:
        return std.squeeze()
    if isinstance(dim, int):
        return std.squeeze(dim)
    for d in sorted((d if d >= 0 else d + std.ndim) for d in dim)[::-1]:
        std = std.squeeze(d)
    return std


def disable_dropout_in_model(model: torch.nn.Module) -> None:
    """TRL's ``trl.trainer.utils.disable_dropout_in_model``: every ``nn.Dropout``'s ``p`` set to 0."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0


def get_config_model_id(config) -> str:
    """TRL's ``trl.trainer.utils.get_config_model_id``: the config's ``_name_or_path`` (``""`` without one)."""
    return getattr(config, "_name_or_path", "")


def get_dataset_column_names(dataset) -> list[str]:
    """TRL's ``trl.data_utils.get_dataset_column_names``: an iterable dataset's from its first row."""
    return list(next(iter(dataset)).keys()) if dataset.column_names is None else dataset.column_names
