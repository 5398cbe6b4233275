"""trl-ext's own PPO base trainer: TRL 1.12's `experimental.ppo.PPOTrainer` minus its training loop, for TRL >= 1.13.
How it works: docs/ppo-internals.md#the-ppo-base-trainer."""

from __future__ import annotations

import copy
import math
import os
import textwrap
from collections import defaultdict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import gather_object
from peft import PeftConfig, PeftModel, get_peft_model
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, GenerationConfig, TrainerControl, TrainerState
from transformers.integrations import get_reporting_integration_callbacks
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from transformers.trainer import DEFAULT_CALLBACKS, DEFAULT_PROGRESS_CALLBACK
from transformers.trainer_callback import CallbackHandler, ExportableState, PrinterCallback
from transformers.utils import is_rich_available

from ...models.activation_checkpointing import checkpointing_disable, checkpointing_enable, is_checkpointing
from ...models.scalar_heads import scalar_model_outputs
from ...trl_internals import (
    BaseTrainer,
    disable_dropout_in_model,
    log_table_to_comet_experiment,
    prepare_deepspeed,
    unwrap_model_for_generation,
)
from ..rollout.sampling import sample_generation_kwargs
from ..rollout.sequences import batch_generation, truncate_response
from .base_config import PPOBaseConfig

__all__ = ["OnlineTrainerState", "PolicyAndValueWrapper", "PPOBaseTrainer"]


@dataclass
class OnlineTrainerState(TrainerState):
    """HF's [`~transformers.TrainerState`] plus the number of episodes (sampled responses) seen so far; saved as
    `trainer_state.json` in every checkpoint, as by TRL's PPO."""

    episode: int = 0


class PolicyAndValueWrapper(nn.Module):
    """The policy and the value model as one module, so that one `accelerator.prepare` (DDP, DeepSpeed) and one
    optimizer cover both (the MOSS-RLHF arrangement TRL's PPO uses).

    `forward(**inputs)` returns `(policy output, per-token values)`: the value model's backbone runs on the same
    inputs and its `score` head on the last hidden state.
    """

    def __init__(self, policy: nn.Module, value_model: nn.Module) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.critic_backbone = getattr(value_model, value_model.base_model_prefix)
        self.is_gradient_checkpointing = is_checkpointing(policy)

    # TRL's generation context calls these names; the policy gets transformers' current API (no FutureWarning)
    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        checkpointing_enable(self.policy, gradient_checkpointing_kwargs)
        self.is_gradient_checkpointing = True

    def gradient_checkpointing_disable(self):
        checkpointing_disable(self.policy)
        self.is_gradient_checkpointing = False

    def forward(self, **kwargs):
        output = self.critic_backbone(**kwargs)
        values = self.value_model.score(output.hidden_states[-1])
        return self.policy(**kwargs), values


def _exact_div(a: int, b: int, what: str) -> int:
    if a % b:
        raise ValueError(f"{what}, inexact division: {a} / {b} = {a / b}")
    return a // b


def _frozen_copy(model: nn.Module) -> nn.Module:
    """A reference model: a deep copy of `model` in eval mode, no parameter trainable."""
    if is_deepspeed_zero3_enabled():
        raise ValueError(
            "DeepSpeed ZeRO-3 cannot copy the policy into a reference model; pass `ref_model` (loaded with "
            "`AutoModelForCausalLM.from_pretrained`) or use a PEFT policy (reference = adapters disabled)"
        )
    reference = copy.deepcopy(model)
    for param in reference.parameters():
        param.requires_grad = False
    return reference.eval()


def _cast_for_bf16_kbit_training(model: nn.Module) -> None:
    """A 4-bit PEFT policy trained in bf16: norms in float32, float32 embeddings and LM head in bfloat16."""
    for name, module in model.named_modules():
        if isinstance(module, nn.LayerNorm) or "norm" in name:
            module.to(torch.float32)
        elif any(part in name for part in ("lm_head", "embed_tokens", "wte", "wpe")):
            weight = getattr(module, "weight", None)
            if weight is not None and weight.dtype == torch.float32:
                module.to(torch.bfloat16)


class PPOBaseTrainer(BaseTrainer):
    """The PPO trainer base trl-ext carries for TRL >= 1.13: TRL 1.12's `experimental.ppo.PPOTrainer` but `train()`
    (same constructor arguments, attributes, checkpoints and sample generations; the arguments: docs/ppo.md, "The
    trainer's arguments"); :class:`trl_ext.PPOTrainer` adds the training loop."""

    _tag_names = ["trl", "ppo"]
    _name = "PPO"
    _paper = {
        "title": "Fine-Tuning Language Models from Human Preferences",
        "id": "1909.08593",
        # docstyle-ignore
        "citation": textwrap.dedent("""\
            @article{mziegler2019fine-tuning,
                title        = {{Fine-Tuning Language Models from Human Preferences}},
                author       = {Daniel M. Ziegler and Nisan Stiennon and Jeffrey Wu and Tom B. Brown and Alec Radford and Dario Amodei and Paul F. Christiano and Geoffrey Irving},
                year         = 2019,
                eprint       = {arXiv:1909.08593}
            }"""),
    }

    # HF Trainer.__init__ (not called: this trainer builds its own accelerator, state and DataLoaders) sets these;
    # HF's checkpoint save and load read them.
    is_fsdp_xla_enabled = is_fsdp_xla_v1_enabled = is_fsdp_xla_v2_enabled = False
    is_distributed_loading_by_transformers = False

    def __init__(
        self,
        args: PPOBaseConfig,
        processing_class,
        model,
        ref_model,
        reward_model,
        train_dataset,
        value_model,
        data_collator=None,
        eval_dataset=None,
        optimizers=(None, None),
        callbacks=None,
        peft_config=None,
    ) -> None:
        if train_dataset is None:
            raise ValueError("`train_dataset` is required")
        if ref_model is model:
            raise ValueError(
                "`model` and `ref_model` cannot be the same object. If you want `ref_model` to be the "
                "same as `model`, you must make a copy of it, or `None` if you use peft."
            )
        self.args = args
        self.processing_class = processing_class
        self.policy_model = model
        if data_collator is None:
            data_collator = DataCollatorWithPadding(processing_class)

        # The stop token also becomes the policy's EOS for generation
        if args.stop_token and args.stop_token_id:
            raise ValueError("You cannot set both `stop_token` and `stop_token_id`.")
        if args.stop_token:
            if args.stop_token != "eos":
                raise ValueError(
                    f"Unknown `stop_token` {args.stop_token}. Allowed values are: `'eos'` and `None` (no stop token)."
                )
            self.stop_token_id = processing_class.eos_token_id
        else:
            self.stop_token_id = args.stop_token_id  # None or an id
        self.policy_model.generation_config.eos_token_id = self.stop_token_id
        if args.kl_estimator not in {"k1", "k3"}:
            raise ValueError(
                "kl_estimator must be either 'k1' (straightforward, unbiased) or 'k3' (lower variance, unbiased, "
                "appears to be a strictly better estimator). See "
                "[Approximating KL Divergence](http://joschu.net/blog/kl-approx.html) for details."
            )

        if peft_config is not None:
            self.policy_model = self._wrap_policy_in_peft(self.policy_model, peft_config)
        self.is_peft_model = isinstance(self.policy_model, PeftModel)
        self.model_adapter_name = args.model_adapter_name
        self.ref_adapter_name = args.ref_adapter_name
        if ref_model:
            self.ref_model = ref_model
        elif self.is_peft_model:
            self.ref_model = None  # the policy with its adapters disabled (`null_ref_context`)
        else:
            self.ref_model = _frozen_copy(self.policy_model)

        self.reward_model = reward_model
        self.train_dataset = train_dataset
        self.train_dataset_len = len(train_dataset)
        self.value_model = value_model
        self.data_collator = data_collator
        self.eval_dataset = eval_dataset
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = None  # read by HF Trainer's create_optimizer

        # Batch sizes
        if args.total_episodes is None:  # episodes given as epochs
            args.total_episodes = int(args.num_train_epochs * self.train_dataset_len)
        accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps)
        self.accelerator = accelerator
        args.world_size = accelerator.num_processes
        args.local_batch_size = args.per_device_train_batch_size * args.gradient_accumulation_steps
        args.micro_batch_size = int(args.per_device_train_batch_size * args.world_size)
        args.batch_size = int(args.local_batch_size * args.world_size)
        args.mini_batch_size = _exact_div(
            args.batch_size, args.num_mini_batches, "`batch_size` must be a multiple of `num_mini_batches`"
        )
        args.local_mini_batch_size = _exact_div(
            args.local_batch_size, args.num_mini_batches, "`local_batch_size` must be a multiple of `num_mini_batches`"
        )
        if args.whiten_rewards and args.local_mini_batch_size < 8:
            raise ValueError(
                f"Per-rank minibatch size {args.local_mini_batch_size} is insufficient for whitening (whiten_rewards "
                "needs local_mini_batch_size >= 8)"
            )
        args.num_total_batches = math.ceil(args.total_episodes / args.batch_size)  # may exceed total_episodes
        self.local_seed = args.seed + accelerator.process_index * 100003  # a prime
        if args.num_sample_generations > 0:
            self.sample_generations_freq = max(1, args.num_total_batches // args.num_sample_generations)
        self.local_dataloader_batch_size = args.local_batch_size

        # Models, optimizer
        for module in (self.policy_model, self.ref_model, self.value_model, self.reward_model):
            if module is not None:
                disable_dropout_in_model(module)
        self.model = PolicyAndValueWrapper(self.policy_model, self.value_model)
        self.model.config = self.policy_model.config  # model card, push to hub
        # The LR scheduler steps once per update, called by the training loop
        self.create_optimizer_and_scheduler(num_training_steps=args.num_total_batches)

        # HF Trainer machinery: callbacks, control, state
        default_callbacks = DEFAULT_CALLBACKS + get_reporting_integration_callbacks(self.args.report_to)
        self.callbacks = default_callbacks if callbacks is None else default_callbacks + callbacks
        self.callback_handler = CallbackHandler(
            self.callbacks, self.model, self.processing_class, self.optimizer, self.lr_scheduler
        )
        self.add_callback(PrinterCallback if self.args.disable_tqdm else DEFAULT_PROGRESS_CALLBACK)
        self.control = TrainerControl()
        self.state = OnlineTrainerState(
            is_local_process_zero=self.is_local_process_zero(),
            is_world_process_zero=self.is_world_process_zero(),
            stateful_callbacks=[
                cb for cb in self.callback_handler.callbacks + [self.control] if isinstance(cb, ExportableState)
            ],
        )
        self.current_flos = 0
        self.hp_search_backend = None
        self.is_deepspeed_enabled = getattr(self.accelerator.state, "deepspeed_plugin", None) is not None
        self.is_fsdp_enabled = getattr(self.accelerator.state, "fsdp_plugin", None) is not None
        self.hub_model_id = None
        if self.args.push_to_hub:
            self.init_hf_repo()
        if self.args.should_save:
            os.makedirs(self.args.output_dir, exist_ok=True)
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names)

        # DataLoaders. Every process shuffles the prompts alike (seeded with args.seed right before `prepare`), then
        # continues with its own seed.
        self.dataloader = DataLoader(
            self.train_dataset,
            batch_size=self.local_dataloader_batch_size,
            shuffle=True,
            collate_fn=self.data_collator,
            drop_last=True,  # equal batches: the rollout tensors have fixed shapes
        )
        torch.manual_seed(args.seed)
        self.model, self.optimizer, self.dataloader = accelerator.prepare(self.model, self.optimizer, self.dataloader)
        torch.manual_seed(self.local_seed)
        self.eval_dataloader = DataLoader(
            self.eval_dataset,
            batch_size=args.per_device_eval_batch_size,
            collate_fn=self.data_collator,
            drop_last=True,
        )
        self.eval_dataloader = accelerator.prepare(self.eval_dataloader)

        if self.ref_model is None and not self.is_peft_model:
            raise ValueError("No reference model and model is not a Peft model.")
        if self.is_deepspeed_enabled:
            self.reward_model = prepare_deepspeed(self.reward_model, accelerator)
            if self.ref_model is not None:
                self.ref_model = prepare_deepspeed(self.ref_model, accelerator)
        else:
            if self.ref_model is not None:
                self.ref_model = self.ref_model.to(self.accelerator.device)
            self.reward_model = self.reward_model.to(self.accelerator.device)

    # ------------------------------------------------------------------ PEFT

    def _wrap_policy_in_peft(self, policy, peft_config):
        if not isinstance(peft_config, PeftConfig):
            raise TypeError(
                f"`peft_config` must be a `peft.PeftConfig` instance (e.g. `peft.LoraConfig`), "
                f"got {type(peft_config).__name__}."
            )
        if isinstance(policy, PeftModel):
            raise ValueError(
                "You passed a `PeftModel` instance together with a `peft_config` to the trainer. Please first "
                "merge and unload the existing adapter, save the resulting base model, and then pass that base "
                "model along with the new `peft_config` to the trainer."
            )
        policy = get_peft_model(policy, peft_config)
        if self.args.bf16 and getattr(policy, "is_loaded_in_4bit", False):
            _cast_for_bf16_kbit_training(policy)
        return policy

    # ------------------------------------------------------------------ HF Trainer hooks

    def get_train_dataloader(self) -> DataLoader:
        return self.dataloader

    def get_eval_dataloader(self) -> DataLoader:
        return self.eval_dataloader

    def train(self, *args, **kwargs):
        raise NotImplementedError(
            "PPOBaseTrainer has no training loop; train with trl_ext.PPOTrainer (the update as named steps)"
        )

    @contextmanager
    def null_ref_context(self):
        """The reference model of a PEFT policy: the policy with its adapters disabled, or with `ref_adapter_name`
        active (then `model_adapter_name`, or `default`, again afterwards)."""
        policy = self.accelerator.unwrap_model(self.model).policy  # also under DistributedDataParallel
        with (
            policy.disable_adapter()
            if self.is_peft_model and not self.ref_adapter_name
            else nullcontext()
        ):
            if self.ref_adapter_name:
                policy.set_adapter(self.ref_adapter_name)
            yield
            if self.ref_adapter_name:
                policy.set_adapter(self.model_adapter_name or "default")

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """Save the policy only (what inference needs), not the value model."""
        backup_model = self.model
        if hasattr(self.model, "policy"):
            self.model = self.model.policy
        if self.is_deepspeed_enabled:
            backup_deepspeed = self.deepspeed
            self.deepspeed = self.model
        try:
            super().save_model(output_dir, _internal_call)
        finally:
            self.model = backup_model
            if self.is_deepspeed_enabled:
                self.deepspeed = backup_deepspeed

    def _save_checkpoint(self, model, trial):
        """HF's checkpoint, with TRL's model card (`README.md` in `output_dir`) written first."""
        if self.args.hub_model_id is None:
            model_name = Path(self.args.output_dir).name
        else:
            model_name = self.args.hub_model_id.split("/")[-1]
        self.create_model_card(model_name=model_name)
        super()._save_checkpoint(model, trial)

    # ------------------------------------------------------------------ sample generations

    def generate_completions(self, sampling: bool = False):
        """Greedy-ish (temperature 0.01) responses to the eval prompts with their reward-model scores, as a table:
        printed (first 5 rows, with `rich`), logged to wandb (`completions`) and Comet (`completions.csv`).
        `sampling=True` uses the first eval batch only (what training does every `sample_generations_freq`
        updates). Draws from the torch RNG."""
        if self.eval_dataset is None:
            return
        args = self.args
        processing_class = self.processing_class
        generation_kwargs = sample_generation_kwargs(args)  # TRL's temperature 0.01, with the sampling keys
        generation_config = GenerationConfig(**generation_kwargs)
        table = defaultdict(list)
        with unwrap_model_for_generation(
            self.model,
            self.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            generation_kwargs=generation_kwargs,  # works around transformers#42762, as TRL does
        ) as unwrapped_model:
            for batch in self.eval_dataloader:
                query = batch["input_ids"]
                with torch.no_grad():
                    context_length = query.shape[1]
                    query_response, _ = batch_generation(
                        unwrapped_model.policy, query, query.shape[0], processing_class.pad_token_id,
                        generation_config,
                    )
                    response = query_response[:, context_length:]
                    postprocessed_response = response
                    if self.stop_token_id is not None:  # the stop token id may be 0
                        postprocessed_response = truncate_response(
                            self.stop_token_id, processing_class.pad_token_id, response
                        )
                    table["query"].extend(gather_object(processing_class.batch_decode(query, skip_special_tokens=True)))
                    table["model response"].extend(gather_object(processing_class.batch_decode(postprocessed_response)))
                    postprocessed_query_response = torch.cat((query, postprocessed_response), 1)
                    _, score, _ = scalar_model_outputs(
                        self.reward_model, postprocessed_query_response, processing_class.pad_token_id, context_length
                    )
                    table["score"].extend(self.accelerator.gather_for_metrics(score).float().cpu().numpy())
                if sampling:
                    break
        self._log_completions(table)

    def _log_completions(self, table: dict) -> None:
        """Show the sample-generation table (main process): rich console table, wandb `completions`, Comet CSV."""
        df = pd.DataFrame(table)
        if not self.accelerator.is_main_process:
            return
        if is_rich_available():
            print_rich_table(df.iloc[0:5])
        if "wandb" in self.args.report_to:
            import wandb

            if wandb.run is not None:
                wandb.log({"completions": wandb.Table(dataframe=df)})
        if "comet_ml" in self.args.report_to:
            log_table_to_comet_experiment(name="completions.csv", table=df)


def print_rich_table(df) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_lines=True)
    for column in df.columns:
        table.add_column(column)
    for _, row in df.iterrows():
        table.add_row(*row.astype(str).tolist())
    Console().print(table)
