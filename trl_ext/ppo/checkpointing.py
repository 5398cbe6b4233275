"""Checkpoints and resume of :class:`trl_ext.PPOTrainer`: what a PPO checkpoint adds to HF's, and the state before an
update (for the NaN/inf policy, which saves it when an update turns out bad).

A complete checkpoint holds, besides HF's files (policy or its adapter, optimizer, scheduler, RNG states,
``trainer_state.json``): the value model in ``value_model/`` and, per process, ``trl_ext_ppo_state_{rank}.pt`` (KL
controller, prompt and ptx stream positions).
"""

from __future__ import annotations

import glob
import os
import random
import warnings

import numpy as np
import torch
from transformers.integrations.deepspeed import deepspeed_load_checkpoint

from ..errors import UserInputError
from ..runtime.checkpoints import load_weights_in_place
from ..runtime.engines import gathered_parameters
from .objective.kl_controllers import KLController

__all__ = ["PPOCheckpointMixin", "VALUE_MODEL_DIR", "ppo_state_file"]

VALUE_MODEL_DIR = "value_model"
"""Sub-folder of a PPO checkpoint that holds the value model (`save_pretrained`: full weights or its adapter)."""


def ppo_state_file(checkpoint_dir: str, process_index: int) -> str:
    """Path of one process's trl-ext PPO state in a checkpoint (KL controller, prompt and ptx stream positions)."""
    return os.path.join(checkpoint_dir, f"trl_ext_ppo_state_{process_index}.pt")


class PPOCheckpointMixin:
    """The checkpoint and resume steps of :class:`trl_ext.PPOTrainer` (override one to change what is saved)."""

    def save_extra_checkpoint_files(self, checkpoint_dir: str) -> None:
        """Add to a checkpoint what HF's `_save_checkpoint` leaves out for PPO: the value model (main process) and
        each process's trl-ext state (KL controller, prompt and ptx stream positions)."""
        unwrapped = self.accelerator.unwrap_model(self.model)
        if self.critic.has_value_model:  # a critic-free run's stand-in has no weights
            with gathered_parameters(unwrapped.value_model, self.accelerator):  # ZeRO-3: whole weights, all processes
                if self.args.should_save:  # full weights, or its adapter and score head
                    unwrapped.value_model.save_pretrained(os.path.join(checkpoint_dir, VALUE_MODEL_DIR))
        os.makedirs(checkpoint_dir, exist_ok=True)
        state = {
            "world_size": self.accelerator.num_processes,
            "kl_controller": self.kl_ctl.state_dict() if hasattr(self.kl_ctl, "state_dict") else None,
            "prompt_stream": self.prompt_iterator.state_dict() if self.prompt_iterator is not None else None,
            "ptx_stream": self.ptx_stream.state_dict() if self.ptx_stream is not None else None,
        }
        torch.save(state, ppo_state_file(checkpoint_dir, self.accelerator.process_index))

    def load_checkpoint(self, checkpoint: str) -> None:
        """Restore weights, optimizer, LR scheduler, KL controller, data stream positions and RNG states.

        Called by `train(resume_from_checkpoint=...)` after `init_train_state` (which restored `self.state`) and
        `init_data_streams`.
        """
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
        if not self.is_deepspeed_enabled and not os.path.isfile(os.path.join(checkpoint, "optimizer.pt")):
            raise UserInputError(
                f"resume_from_checkpoint: {checkpoint} has no optimizer.pt (saved with save_only_model=True?); "
                "resume from a full checkpoint"
            )
        if self.is_deepspeed_enabled:
            # DeepSpeed's own checkpoint (`global_step*/`, written by HF's `_save_checkpoint`) holds the weights of
            # policy and value model and the (sharded) optimizer state; the LR scheduler is TRL's (scheduler.pt).
            if not glob.glob(os.path.join(checkpoint, "global_step*")):
                raise UserInputError(
                    f"resume_from_checkpoint: {checkpoint} has no DeepSpeed checkpoint (global_step*/); it was not "
                    "written by a DeepSpeed run; resume with the engine that wrote it"
                )
            deepspeed_load_checkpoint(self.model, checkpoint, load_module_strict=True)
        else:
            unwrapped = self.accelerator.unwrap_model(self.model)
            load_weights_in_place(unwrapped.policy, checkpoint)
            if self.critic.has_value_model:  # in place: the optimizer stays valid
                load_weights_in_place(unwrapped.value_model, os.path.join(checkpoint, VALUE_MODEL_DIR))
        self._load_optimizer_and_scheduler(checkpoint)
        if extra["kl_controller"] is not None and hasattr(self.kl_ctl, "load_state_dict"):
            self.kl_ctl.load_state_dict(extra["kl_controller"])
        elif not isinstance(self.kl_ctl, KLController):
            warnings.warn("kl_controller has no state_dict/load_state_dict: its state was not restored", stacklevel=2)
        if (extra["ptx_stream"] is None) != (self.ptx_stream is None):
            raise UserInputError(
                f"resume_from_checkpoint: {checkpoint} was saved with ptx "
                f"{'off' if extra['ptx_stream'] is None else 'on'}; resume with the same ptx_coef/ptx_dataset"
            )
        if self.ptx_stream is not None:
            self.ptx_stream.load_state_dict(extra["ptx_stream"])
        if extra["prompt_stream"] is not None:
            self.prompt_iterator.load_state_dict(extra["prompt_stream"])
        self._load_rng_state(checkpoint)

    def capture_update_start(self) -> dict:
        """What an update changes before its first optimizer step: episode count, RNG states, data positions.

        Together with the (not yet changed) weights, optimizer, scheduler and KL controller this is the state
        before the update; `save_update_start_checkpoint` writes it when the update turns out to be bad.
        """
        return {
            "episode": self.state.episode,
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "prompt_stream": self.prompt_iterator.state_dict(),
            "ptx_stream": self.ptx_stream.state_dict() if self.ptx_stream is not None else None,
        }

    def save_update_start_checkpoint(self) -> str:
        """Rewind episode, RNGs and data positions to the start of the current update and save `checkpoint-N`
        (N = completed updates). Only valid before the update's first optimizer step."""
        start = self._update_start_state
        self.state.episode = start["episode"]
        random.setstate(start["python"])
        np.random.set_state(start["numpy"])
        torch.set_rng_state(start["torch"])
        if start["cuda"] is not None:
            torch.cuda.set_rng_state_all(start["cuda"])
        self.prompt_iterator.load_state_dict(start["prompt_stream"])
        if start["ptx_stream"] is not None:
            self.ptx_stream.load_state_dict(start["ptx_stream"])
        self._save_checkpoint(self.model, trial=None)
        return self.last_checkpoint
