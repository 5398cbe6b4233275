"""Checkpoints, their one home: atomic saves and checkpoint discovery for every trl-ext trainer, and what a PPO
checkpoint adds to HF's (:class:`PPOCheckpoints`).

Transformers 5.23's ``Trainer._save_checkpoint`` writes straight into ``output_dir/checkpoint-N``: a run killed
mid-save leaves a half-written ``checkpoint-N`` that ``resume_from_checkpoint=True`` (``get_last_checkpoint``)
would take for a whole one. :class:`AtomicCheckpointMixin` lets the parent write everything into
``output_dir/tmp-checkpoint-N/checkpoint-N`` (a name that neither HF's ``get_last_checkpoint`` nor checkpoint rotation
matches), adds the subclass's extra files (:meth:`~AtomicCheckpointMixin.save_extra_checkpoint_files`), waits for
every process, and only then renames the folder to ``output_dir/checkpoint-N`` (one ``os.replace``, atomic on
POSIX file systems). Rotation (``save_total_limit``) runs after the rename.

A complete PPO checkpoint holds, besides HF's files (policy or its adapter, optimizer, scheduler, RNG states,
``trainer_state.json``): the value model in ``value_model/`` and, per process, ``trl_ext_ppo_state_{rank}.pt`` (KL
controller, prompt and ptx stream positions).
"""

from __future__ import annotations

import glob
import os
import random
import re
import shutil
import warnings

import numpy as np
import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from ..errors import UserInputError

__all__ = ["AtomicCheckpointMixin", "PPOCheckpoints", "VALUE_MODEL_DIR", "latest_checkpoint", "load_weights_in_place",
           "ppo_state_file", "resolve_checkpoint"]

STAGING_PREFIX = "tmp-"
"""Prefix of the folder a checkpoint is written into before it is renamed (``tmp-checkpoint-N``)."""

COMPLETE_MARKER = "trainer_state.json"
"""A checkpoint folder without this file is not a checkpoint (HF writes it last)."""

_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def latest_checkpoint(output_dir: str) -> str | None:
    """The highest-numbered complete ``checkpoint-N`` folder in ``output_dir``, or None.

    Skips ``tmp-checkpoint-N`` staging folders (an interrupted save) and any ``checkpoint-N`` without
    ``trainer_state.json`` (a folder written by something that does not save atomically).
    """
    if not os.path.isdir(output_dir):
        return None
    steps = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_NAME.match(name)
        if match and os.path.isfile(os.path.join(output_dir, name, COMPLETE_MARKER)):
            steps.append((int(match.group(1)), name))
    return os.path.join(output_dir, max(steps)[1]) if steps else None


def resolve_checkpoint(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """Turn a ``resume_from_checkpoint`` argument into a checkpoint folder (or None for a fresh start).

    ``True`` (or the strings ``"true"``/``"latest"``) means the latest complete ``checkpoint-N`` in ``output_dir``;
    a path must be a complete checkpoint folder. ``False``/``None``/``"false"``/``""`` mean no resume.
    Raises :class:`~trl_ext.errors.UserInputError` naming the folder when there is nothing to resume from.
    """
    if isinstance(resume_from_checkpoint, str):
        lowered = resume_from_checkpoint.strip().lower()
        if lowered in ("", "false", "no", "none"):
            return None
        if lowered in ("true", "yes", "latest"):
            resume_from_checkpoint = True
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    if resume_from_checkpoint is True:
        found = latest_checkpoint(output_dir)
        if found is None:
            raise UserInputError(
                f"resume_from_checkpoint: no complete checkpoint-N folder in output_dir {output_dir!r}; "
                "give a checkpoint path or start without resume_from_checkpoint"
            )
        return found
    path = os.fspath(resume_from_checkpoint)
    if not os.path.isfile(os.path.join(path, COMPLETE_MARKER)):
        raise UserInputError(
            f"resume_from_checkpoint: {path!r} is not a complete checkpoint folder (no {COMPLETE_MARKER}); "
            "give a checkpoint-N folder or true for the latest one"
        )
    return path


class AtomicCheckpointMixin:
    """Mixin for HF ``Trainer`` subclasses (TRL's PPO, reward and DPO trainers): checkpoints appear whole or not at all.

    Put it before the trainer class in the bases. ``self.last_checkpoint`` holds the path of the last checkpoint
    this trainer published. Subclasses add files to a checkpoint by overriding :meth:`save_extra_checkpoint_files`;
    they are written into the staging folder, so they are part of the same atomic rename.
    """

    _checkpoint_staging_dir: str | None = None
    last_checkpoint: str | None = None

    def _get_output_dir(self, trial) -> str:
        if self._checkpoint_staging_dir is not None:
            return self._checkpoint_staging_dir
        return super()._get_output_dir(trial)

    def save_extra_checkpoint_files(self, checkpoint_dir: str) -> None:
        """Write extra files into ``checkpoint_dir`` (the staging folder). Runs on every process; default: none."""

    def _save_checkpoint(self, model, trial) -> None:
        run_dir = self._get_output_dir(trial)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        final_dir = os.path.join(run_dir, name)
        staging_root = os.path.join(run_dir, STAGING_PREFIX + name)
        staged_dir = os.path.join(staging_root, name)
        accelerator = self.accelerator
        if self.args.should_save and os.path.exists(staging_root):  # left over from a save that was killed
            shutil.rmtree(staging_root)
        accelerator.wait_for_everyone()
        self._checkpoint_staging_dir = staging_root
        try:
            super()._save_checkpoint(model, trial)
            self.save_extra_checkpoint_files(staged_dir)
        finally:
            self._checkpoint_staging_dir = None
        if self.state.best_model_checkpoint and self.state.best_model_checkpoint.startswith(staging_root):
            self.state.best_model_checkpoint = final_dir
            if self.args.should_save:  # the saved state named the staging folder
                self.state.save_to_json(os.path.join(staged_dir, COMPLETE_MARKER))
        accelerator.wait_for_everyone()
        if self.args.should_save:
            _publish(staged_dir, final_dir)
            shutil.rmtree(staging_root, ignore_errors=True)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        accelerator.wait_for_everyone()
        self.last_checkpoint = final_dir


def _publish(staged_dir: str, final_dir: str) -> None:
    """Rename ``staged_dir`` to ``final_dir``; an existing ``final_dir`` (same step saved again) is replaced."""
    if os.path.exists(final_dir):
        old = os.path.join(os.path.dirname(staged_dir), "replaced")
        os.replace(final_dir, old)
        os.replace(staged_dir, final_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged_dir, final_dir)


def load_weights_in_place(model, directory: str) -> None:
    """Copy the weights saved by ``model.save_pretrained(directory)`` into ``model``'s existing parameters.

    In place, so an optimizer built over the parameters stays valid (HF's ``Trainer._load_from_checkpoint`` would
    also load every sub-folder holding an adapter as an extra adapter, which a PPO checkpoint has: the value model).
    A PEFT model gets each of its adapters back (``default`` from ``directory``, others from ``directory/NAME``),
    except the reward/value adapters of a shared base (:mod:`trl_ext.models.shared_base`), which their own models
    save and load; such a reward/value model gets its adapter and score head back; a plain model its full state
    dict (``model.safetensors`` or a sharded index). Raises ``FileNotFoundError`` naming the folder when the
    weights are missing.
    """
    from peft import PeftModel
    from peft.utils import load_peft_weights, set_peft_model_state_dict
    from transformers.trainer_utils import load_sharded_checkpoint
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME

    from ..models.shared_base import SharedBaseScalarModel, policy_adapter_names

    if isinstance(model, SharedBaseScalarModel):
        if not os.path.isfile(os.path.join(directory, "adapter_model.safetensors")):
            raise FileNotFoundError(f"checkpoint has no adapter weights in {directory}")
        model.load_weights(directory)
        return
    if isinstance(model, PeftModel):
        for name in policy_adapter_names(model):
            path = directory if name == "default" else os.path.join(directory, name)
            if not os.path.isfile(os.path.join(path, "adapter_model.safetensors")):
                raise FileNotFoundError(f"checkpoint has no weights for adapter {name!r} in {path}")
            set_peft_model_state_dict(model, load_peft_weights(path, device="cpu"), adapter_name=name)
        return
    safe = os.path.join(directory, SAFE_WEIGHTS_NAME)
    if os.path.isfile(safe):
        import safetensors.torch

        result = model.load_state_dict(safetensors.torch.load_file(safe, device="cpu"), strict=False)
        unexpected = list(result.unexpected_keys)
        missing = [k for k in result.missing_keys if k not in _tied_keys(model)]
        if unexpected or missing:
            raise RuntimeError(
                f"weights in {directory} do not fit the model: missing {missing}, unexpected {unexpected}"
            )
    elif os.path.isfile(os.path.join(directory, SAFE_WEIGHTS_INDEX_NAME)):
        load_sharded_checkpoint(model, directory, strict=False)
    else:
        raise FileNotFoundError(f"checkpoint has no model weights in {directory}")


def _tied_keys(model) -> set[str]:
    """Names of parameters that share storage with another one (``save_pretrained`` keeps only one of them)."""
    by_storage: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        by_storage.setdefault(tensor.data_ptr(), []).append(name)
    return {name for names in by_storage.values() if len(names) > 1 for name in names}


VALUE_MODEL_DIR = "value_model"
"""Sub-folder of a PPO checkpoint that holds the value model (`save_pretrained`: full weights or its adapter)."""


def ppo_state_file(checkpoint_dir: str, process_index: int) -> str:
    """Path of one process's trl-ext PPO state in a checkpoint (KL controller, prompt and ptx stream positions)."""
    return os.path.join(checkpoint_dir, f"trl_ext_ppo_state_{process_index}.pt")


class PPOCheckpoints:
    """What a PPO checkpoint adds to HF's (module docstring), and the state before an update (for the NaN/inf policy,
    which saves it when an update turns out bad): the part behind :class:`trl_ext.PPOTrainer`'s checkpoint and resume
    steps, built once.

    Args:
        accelerator: the run's accelerator (rank, process count, unwrapping).
        model: the trainer's policy-and-value model as prepared (``.policy``, ``.value_model`` once unwrapped).
        value_model: whether the run has a value model (a critic-free run's stand-in has no weights).
        should_save: whether this process writes the shared files (``args.should_save``).
        deepspeed: the model is DeepSpeed's engine (its own checkpoint holds the weights and the optimizer).
        kl_controller: the KL controller (its ``state_dict``, if it has one, is saved).
        ptx_stream: the ptx batch stream (None without PPO-ptx).
    """

    def __init__(self, *, accelerator, model, value_model: bool, should_save: bool, deepspeed: bool, kl_controller,
                 ptx_stream=None):
        self.accelerator, self.model = accelerator, model
        self.value_model, self.should_save, self.deepspeed = value_model, should_save, deepspeed
        self.kl_controller, self.ptx_stream = kl_controller, ptx_stream

    def save(self, checkpoint_dir: str, prompt_stream) -> None:
        """Write into ``checkpoint_dir`` the value model (main process) and this process's trl-ext state (KL
        controller, prompt and ptx stream positions). Runs on every process."""
        from .engines import gathered_parameters

        unwrapped = self.accelerator.unwrap_model(self.model)
        if self.value_model:
            with gathered_parameters(unwrapped.value_model, self.accelerator):  # ZeRO-3: whole weights, all processes
                if self.should_save:  # full weights, or its adapter and score head
                    unwrapped.value_model.save_pretrained(os.path.join(checkpoint_dir, VALUE_MODEL_DIR))
        os.makedirs(checkpoint_dir, exist_ok=True)
        state = {
            "world_size": self.accelerator.num_processes,
            "kl_controller": (self.kl_controller.state_dict() if hasattr(self.kl_controller, "state_dict")
                              else None),
            "prompt_stream": prompt_stream.state_dict() if prompt_stream is not None else None,
            "ptx_stream": self.ptx_stream.state_dict() if self.ptx_stream is not None else None,
        }
        torch.save(state, ppo_state_file(checkpoint_dir, self.accelerator.process_index))

    def read(self, checkpoint: str) -> dict:
        """This process's trl-ext state of ``checkpoint``, after checking that this run can resume from it (same
        number of processes, an optimizer state, DeepSpeed's own checkpoint under DeepSpeed)."""
        state_path = ppo_state_file(checkpoint, self.accelerator.process_index)
        if not os.path.isfile(state_path):
            raise UserInputError(
                f"resume_from_checkpoint: {checkpoint} has no {os.path.basename(state_path)}; it was not written by "
                "trl_ext.PPOTrainer or by a run with as many processes as this one"
            )
        extra = torch.load(state_path, weights_only=True)
        if extra["world_size"] != self.accelerator.num_processes:
            raise UserInputError(
                f"resume_from_checkpoint: {checkpoint} was written by {extra['world_size']} processes, this run has "
                f"{self.accelerator.num_processes}; resume with the same number of processes"
            )
        if not self.deepspeed and not os.path.isfile(os.path.join(checkpoint, "optimizer.pt")):
            raise UserInputError(
                f"resume_from_checkpoint: {checkpoint} has no optimizer.pt (saved with save_only_model=True?); "
                "resume from a full checkpoint"
            )
        if self.deepspeed and not glob.glob(os.path.join(checkpoint, "global_step*")):
            raise UserInputError(
                f"resume_from_checkpoint: {checkpoint} has no DeepSpeed checkpoint (global_step*/); it was not "
                "written by a DeepSpeed run; resume with the engine that wrote it"
            )
        return extra

    def load_weights(self, checkpoint: str) -> None:
        """Policy and value model from ``checkpoint``, in place (the optimizer stays valid). Under DeepSpeed, its own
        checkpoint (``global_step*/``, written by HF's ``_save_checkpoint``) holds the weights of both and the
        (sharded) optimizer state; the LR scheduler is TRL's (``scheduler.pt``)."""
        if self.deepspeed:
            from transformers.integrations.deepspeed import deepspeed_load_checkpoint

            deepspeed_load_checkpoint(self.model, checkpoint, load_module_strict=True)
            return
        unwrapped = self.accelerator.unwrap_model(self.model)
        load_weights_in_place(unwrapped.policy, checkpoint)
        if self.value_model:
            load_weights_in_place(unwrapped.value_model, os.path.join(checkpoint, VALUE_MODEL_DIR))

    def load_state(self, extra: dict, checkpoint: str, prompt_stream) -> None:
        """The KL controller and the stream positions from ``extra`` (:meth:`read`)."""
        if extra["kl_controller"] is not None and hasattr(self.kl_controller, "load_state_dict"):
            self.kl_controller.load_state_dict(extra["kl_controller"])
        elif not (hasattr(self.kl_controller, "state_dict") and hasattr(self.kl_controller, "load_state_dict")):
            warnings.warn("kl_controller has no state_dict/load_state_dict: its state was not restored", stacklevel=3)
        if (extra["ptx_stream"] is None) != (self.ptx_stream is None):
            raise UserInputError(
                f"resume_from_checkpoint: {checkpoint} was saved with ptx "
                f"{'off' if extra['ptx_stream'] is None else 'on'}; resume with the same ptx_coef/ptx_dataset"
            )
        if self.ptx_stream is not None:
            self.ptx_stream.load_state_dict(extra["ptx_stream"])
        if extra["prompt_stream"] is not None:
            prompt_stream.load_state_dict(extra["prompt_stream"])

    def capture(self, episode: int, prompt_stream) -> dict:
        """What an update changes before its first optimizer step: episode count, RNG states, data positions.

        Together with the (not yet changed) weights, optimizer, scheduler and KL controller this is the state
        before the update; :meth:`rewind` puts it back when the update turns out to be bad.
        """
        return {
            "episode": episode,
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "prompt_stream": prompt_stream.state_dict(),
            "ptx_stream": self.ptx_stream.state_dict() if self.ptx_stream is not None else None,
        }

    def rewind(self, start: dict, prompt_stream) -> int:
        """RNGs and data positions back to ``start`` (:meth:`capture`); returns its episode count. Only valid before
        the update's first optimizer step."""
        random.setstate(start["python"])
        np.random.set_state(start["numpy"])
        torch.set_rng_state(start["torch"])
        if start["cuda"] is not None:
            torch.cuda.set_rng_state_all(start["cuda"])
        prompt_stream.load_state_dict(start["prompt_stream"])
        if start["ptx_stream"] is not None:
            self.ptx_stream.load_state_dict(start["ptx_stream"])
        return start["episode"]
