"""trl-ext's copy of TRL 1.12's PPO configuration, the base of :class:`trl_ext.PPOConfig` on TRL >= 1.13 (which
removed it; :mod:`trl_ext.ppo.base` chooses). A test checks every field, default and help against TRL 1.12's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ...trl_internals import BaseConfig


@dataclass
class PPOBaseConfig(BaseConfig):
    """TRL 1.12's `experimental.ppo.PPOConfig`, field for field (each help is TRL's), for the base trainer
    :class:`~trl_ext.ppo.base.base_trainer.PPOBaseTrainer`. Its defaults differ from `TrainingArguments`' in
    `learning_rate` (3e-6), `logging_steps` (10), `gradient_checkpointing` (True) and `bf16` (True unless `fp16`)."""

    # TrainingArguments field with a PPO-specific default
    learning_rate: float = field(default=3e-6, metadata={"help": "The initial learning rate for AdamW."})

    dataset_num_proc: int | None = field(
        default=None, metadata={"help": "Number of processes to use for processing the dataset."}
    )
    num_mini_batches: int = field(default=1, metadata={"help": "Number of minibatches to split a batch into."})
    total_episodes: int | None = field(default=None, metadata={"help": "Total number of episodes in the dataset."})
    local_rollout_forward_batch_size: int = field(
        default=64, metadata={"help": "Per rank no grad forward pass in the rollout phase."}
    )
    num_sample_generations: int = field(
        default=10,
        metadata={
            "help": "Number of debugging samples generations (i.e., `generate_completions` calls) throughout training."
        },
    )
    response_length: int = field(default=53, metadata={"help": "Length of the response."})
    stop_token: Literal["eos"] | None = field(
        default=None,
        metadata={
            "help": "Specifies the stop token to use for text generation. This parameter is mutually exclusive with "
            "`stop_token_id`."
        },
    )
    stop_token_id: int | None = field(
        default=None,
        metadata={
            "help": "Specifies the ID of the stop token to use for text generation. If `None`, no stop token ID is "
            "applied, unless `stop_token` is specified. This parameter is mutually exclusive with `stop_token`."
        },
    )
    temperature: float = field(default=0.7, metadata={"help": "Sampling temperature."})
    missing_eos_penalty: float | None = field(
        default=None,
        metadata={
            "help": "Penalty applied to the score when the model fails to generate an EOS token. This is useful to "
            "encourage to generate completions shorter than the maximum length (`max_new_tokens`). The penalty must "
            "be a positive value."
        },
    )
    sft_model_path: str = field(default="EleutherAI/pythia-160m", metadata={"help": "Path to the SFT model."})
    world_size: int | None = field(
        default=None, metadata={"help": "Number of processes (GPUs) to use for the training."}
    )
    num_total_batches: int | None = field(default=None, metadata={"help": "Number of total batches to train."})
    micro_batch_size: int | None = field(
        default=None,
        metadata={"help": "Micro batch size across devices (HF's `per_device_train_batch_size` * `world_size`)."},
    )
    local_batch_size: int | None = field(
        default=None,
        metadata={"help": "Batch size per GPU (HF's `per_device_train_batch_size` * `gradient_accumulation_steps`)."},
    )
    batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Batch size across devices (HF's `per_device_train_batch_size` * `world_size` * "
            "`gradient_accumulation_steps`)."
        },
    )
    local_mini_batch_size: int | None = field(default=None, metadata={"help": "Mini batch size per GPU."})
    mini_batch_size: int | None = field(default=None, metadata={"help": "Mini batch size across GPUs."})
    push_to_hub: bool = field(default=False, metadata={"help": "Whether to push the model to the Hub after training."})
    reward_model_path: str = field(default="EleutherAI/pythia-160m", metadata={"help": "Path to the reward model."})
    model_adapter_name: str | None = field(
        default=None,
        metadata={"help": "Name of the train target PEFT adapter, when using LoRA with multiple adapters."},
    )
    ref_adapter_name: str | None = field(
        default=None, metadata={"help": "Name of the reference PEFT adapter, when using LoRA with multiple adapters."}
    )
    num_ppo_epochs: int = field(default=4, metadata={"help": "Number of epochs to train."})
    whiten_rewards: bool = field(default=False, metadata={"help": "Whether to whiten the rewards."})
    kl_coef: float = field(default=0.05, metadata={"help": "KL coefficient."})
    kl_estimator: Literal["k1", "k3"] = field(
        default="k1",
        metadata={
            "help": "Which estimator for KL-Divergence to use from Approximating KL Divergence "
            "(http://joschu.net/blog/kl-approx.html). Defaults to 'k1', a straightforward, unbiased estimator. Can be "
            "set to 'k3', an unbiased estimator with lower variance which 'appears to be a strictly better "
            "estimator'. Cannot be set to 'k2', as it is used for logging purposes."
        },
    )
    cliprange: float = field(default=0.2, metadata={"help": "Clip range."})
    vf_coef: float = field(default=0.1, metadata={"help": "Value function coefficient."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clip range for the value function."})
    gamma: float = field(default=1.0, metadata={"help": "Discount factor."})
    lam: float = field(default=0.95, metadata={"help": "Lambda value for GAE."})
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "This setting applies to DeepSpeed ZeRO-3. If enabled, the policy model weights are gathered for "
            "generation, improving generation speed. However, disabling this option allows training models that "
            "exceed the VRAM capacity of a single GPU, albeit at the cost of slower generation."
        },
    )
