"""The dataclasses of a recipe that are the pipeline's own: :class:`PipelineArguments` (the recipe keys beyond TRL's
and the trainer's config) and :class:`Recipe` (a validated, resolved recipe), with the key lists the loader
(:mod:`trl_ext.recipe_loader.loader`) checks them against."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["ENTRY_KEYS", "INHERITED_MODEL_KEYS", "PATH_KEYS", "QLORA_QUANTIZATION_KEYS", "QLORA_VALUE_LORA_KEYS",
           "TRAINERS", "UNSUPPORTED_KEYS", "PipelineArguments", "Recipe", "scalar_model_config"]

TRAINERS = ("sft", "reward", "dpo", "ppo")

# Keys of TRL's ModelConfig that the reward and value models inherit from the policy when not set with a prefix.
INHERITED_MODEL_KEYS = ("model_revision", "dtype", "attn_implementation")
# QLoRA-safe defaults: with a quantized LoRA policy, the reward and value models' unset quantization keys follow the
# policy's, and the value model trains a LoRA adapter with the policy's LoRA keys (its own value_* keys win).
QLORA_QUANTIZATION_KEYS = ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "use_bnb_nested_quant",
                           "bnb_4bit_quant_storage")
QLORA_VALUE_LORA_KEYS = ("use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
                         "lora_target_parameters", "use_rslora", "use_dora")
# Trainer-config fields that trl-ext's pipeline does not use (it loads the policy from ``model_name_or_path``).
UNSUPPORTED_KEYS = {"sft_model_path": "set model_name_or_path to the policy (SFT) checkpoint instead"}
# Keys whose value, when it looks like a local path, must exist.
PATH_KEYS = (
    "model_name_or_path", "dataset_name", "reward_model_path", "value_model_path", "ptx_dataset_name",
    "eval_dataset_name", "chat_template_path", "deepspeed",
)
# Keys whose values are `module:function` entries (trl_ext.user_code.entries): taken as data, not through the argument
# parser (a mapping stays a mapping); written with absolute file paths in the resolved recipe.
ENTRY_KEYS = ("reward_funcs", "tools", "environment_factory")


@dataclass
class PipelineArguments:
    """Recipe keys of the trl-ext pipeline beyond TRL's ScriptArguments, ModelConfig and the trainer config; each
    key's meaning and rules: docs/recipes.md."""

    trainer: str = field(default=None, metadata={"help": "Trainer to run.", "choices": list(TRAINERS)})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Train into an existing non-empty output_dir."})
    reinit_score_head: bool = field(
        default=False, metadata={"help": "Reward training: re-initialise the score head with one output."}
    )
    cuda_expandable_segments: bool = field(
        default=True,
        metadata={"help": "CUDA runs: set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True unless the user set it."},
    )
    upcast_non_quantized: bool = field(
        default=True,
        metadata={"help": "Quantized models: float32 embeddings, LM head, norms (peft's upcast); false keeps dtype."},
    )
    reward_funcs: Optional[list[str]] = field(
        default=None,
        metadata={"help": "PPO: reward functions ('module:function', 'file.py:function', {name:, kwargs:}, {url:})."},
    )
    tools: Optional[list[str]] = field(
        default=None, metadata={"help": "PPO: tools the model may call ('module:function', 'file.py:function')."}
    )
    environment_factory: Optional[str] = field(
        default=None,
        metadata={"help": "PPO: environment ('module:callable', 'file.py:callable', or {name: spec, ...})."},
    )
    value_model_path: Optional[str] = field(
        default=None, metadata={"help": "PPO: value model checkpoint (defaults to reward_model_path)."}
    )
    value_reinit_score_head: bool = field(default=False, metadata={"help": "PPO: a fresh one-output value head."})
    shared_base: bool = field(
        default=False,
        metadata={"help": "PPO: reward and value models as LoRA adapters with their own heads on the policy's base."},
    )
    ptx_dataset_name: Optional[str] = field(default=None, metadata={"help": "PPO-ptx: pretraining-mix dataset."})
    ptx_dataset_config: Optional[str] = field(default=None, metadata={"help": "PPO-ptx: dataset config name."})
    ptx_dataset_split: str = field(default="train", metadata={"help": "PPO-ptx: dataset split."})
    ptx_text_column: str = field(default="text", metadata={"help": "PPO-ptx: text column."})
    eval_dataset_name: Optional[str] = field(
        default=None, metadata={"help": "Evaluation data, when not dataset_name's dataset_test_split."}
    )
    eval_dataset_split: str = field(default="train", metadata={"help": "With eval_dataset_name: its split."})
    allow_empty_responses: bool = field(
        default=False, metadata={"help": "Accept empty or whitespace-only responses in the data."}
    )
    wandb_project: Optional[str] = field(default=None, metadata={"help": "W&B project (WANDB_PROJECT)."})
    wandb_entity: Optional[str] = field(default=None, metadata={"help": "W&B entity (WANDB_ENTITY)."})
    wandb_group: Optional[str] = field(default=None, metadata={"help": "W&B run group (WANDB_RUN_GROUP)."})
    wandb_tags: Optional[list[str]] = field(default=None, metadata={"help": "W&B run tags (WANDB_TAGS)."})


@dataclass
class Recipe:
    """A validated, resolved recipe.

    Attributes:
        path: the YAML file it came from.
        trainer: `"sft"`, `"reward"`, `"dpo"` or `"ppo"`.
        script_args: TRL `ScriptArguments` (dataset keys).
        model_args: TRL `ModelConfig` of the trained model (the policy for SFT/DPO/PPO, the reward model for reward).
        training_args: the trainer's config (`trl_ext.SFTConfig`, `RewardConfig`, `DPOConfig` or `PPOConfig`).
        pipeline: :class:`PipelineArguments`.
        reward_model_args / value_model_args: PPO only, `ModelConfig`s of the reward and value models (None when
            the run has none: `reward_funcs` only, or a critic-free `advantage_estimator`).
        reward_funcs: PPO only, the callables of `reward_funcs` (imported, factories called), in order.
        reward_func_entries: how messages name each of them (`recipe: key 'reward_funcs' entry N '...'`).
        tools / tool_entries: PPO only, the callables of `tools` and how messages name them.
        environment_factory: PPO only, the callable of `environment_factory` (a dict of them for several), or None.
        environment_lines: what `trl-ext check` prints about each environment (class, tools, reward).
        explicit: the keys the recipe and the command line set, with their resolved values.
        notes: remarks for the user (printed by `trl-ext check`).
        env: the recipe's `env` mapping (environment variables).
    """

    path: Path
    trainer: str
    script_args: Any
    model_args: Any
    training_args: Any
    pipeline: PipelineArguments
    reward_model_args: Any = None
    value_model_args: Any = None
    reward_funcs: list = field(default_factory=list)
    reward_func_entries: list = field(default_factory=list)
    tools: list = field(default_factory=list)
    tool_entries: list = field(default_factory=list)
    environment_factory: Any = None
    environment_lines: list = field(default_factory=list)
    explicit: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    env: dict = field(default_factory=dict)

    def to_yaml(self) -> str:
        """The resolved recipe as YAML: `trl-ext train` accepts it again."""
        import yaml

        return yaml.safe_dump(self.explicit, sort_keys=False, default_flow_style=None)


def _followed_policy_keys(prefix: str, given: set, policy_args) -> dict:
    """The QLoRA-safe defaults (see :data:`QLORA_QUANTIZATION_KEYS`): the ModelConfig fields of the reward or value
    model that follow the policy because the recipe leaves them unset; none unless the policy is quantized with
    LoRA. Setting either ``load_in_*`` key takes the model's quantization out of the policy's hands."""
    if not (policy_args.use_peft and (policy_args.load_in_4bit or policy_args.load_in_8bit)):
        return {}
    keys = [k for k in QLORA_QUANTIZATION_KEYS if k not in given]
    if given & {"load_in_4bit", "load_in_8bit"}:
        keys = [k for k in keys if not k.startswith("load_in_")]
    if prefix == "value":
        keys += [k for k in QLORA_VALUE_LORA_KEYS if k not in given]
    return {k: getattr(policy_args, k) for k in keys if hasattr(policy_args, k)}


def scalar_model_config(prefixed, prefix: str, policy_args, path: Optional[str]):
    """A ``trl.ModelConfig`` for the reward or value model from its ``<prefix>_*`` keys (``prefixed``: the parsed
    dataclass, None for unset keys); unset keys take ModelConfig's defaults, except :data:`INHERITED_MODEL_KEYS` and,
    with a quantized LoRA policy, the QLoRA-safe defaults. The one place both the loader and ``trl-ext plan`` get
    them."""
    import dataclasses

    from trl import ModelConfig

    from ..errors import UserInputError

    given = {f.name[len(prefix) + 1:]: getattr(prefixed, f.name) for f in dataclasses.fields(prefixed)
             if getattr(prefixed, f.name) is not None}
    kwargs = {"model_name_or_path": path, "lora_task_type": "SEQ_CLS"}
    for key in INHERITED_MODEL_KEYS + ("trust_remote_code",):
        if hasattr(policy_args, key):
            kwargs[key] = getattr(policy_args, key)
    kwargs.update(_followed_policy_keys(prefix, set(given), policy_args))
    kwargs.update(given)
    try:
        return ModelConfig(**kwargs)
    except ValueError as err:
        raise UserInputError(f"recipe: {prefix} model: {str(err).splitlines()[0]}") from None
