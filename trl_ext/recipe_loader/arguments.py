"""The dataclasses of a recipe that are the pipeline's own: :class:`PipelineArguments` (the recipe keys beyond TRL's
and the trainer's config) and :class:`Recipe` (a validated, resolved recipe), with the key lists the loader
(:mod:`trl_ext.recipe_loader.loader`) checks them against."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

__all__ = ["ENTRY_KEYS", "INHERITED_MODEL_KEYS", "PATH_KEYS", "TRAINERS", "UNSUPPORTED_KEYS", "PipelineArguments",
           "Recipe"]

TRAINERS = ("sft", "reward", "dpo", "ppo")

# Keys of TRL's ModelConfig that the reward and value models inherit from the policy when not set with a prefix.
INHERITED_MODEL_KEYS = ("model_revision", "dtype", "attn_implementation")
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
    """Recipe keys of the trl-ext pipeline beyond TRL's ScriptArguments, ModelConfig and the trainer config.

    Parameters:
        trainer (`str`):
            Which trainer to run: `"sft"`, `"reward"`, `"dpo"` or `"ppo"`.
        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            Train into an existing non-empty `output_dir`. Without it such a run is refused.
        reinit_score_head (`bool`, *optional*, defaults to `False`):
            Reward training: start from a fresh one-output score head even if the checkpoint has a head with more
            outputs (passed to `trl_ext.models.load_scalar_model(reinit_head=...)`).
        cuda_expandable_segments (`bool`, *optional*, defaults to `True`):
            CUDA runs: set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before CUDA allocates, unless the
            environment already sets `PYTORCH_CUDA_ALLOC_CONF` (the user's value wins); logged. Less memory reserved
            beyond what tensors use (`trl_ext.runtime.cuda_memory`, `docs/ppo-memory.md`). `false` leaves it unset.
        upcast_non_quantized (`bool`, *optional*, defaults to `True`):
            Quantized (4/8-bit) models: `True` makes the weights that stay unquantized (embeddings, LM head, norms)
            float32, as peft's `prepare_model_for_kbit_training` does, so activations and the KV cache are
            float32; `False` keeps them in `dtype` (the 4-bit compute dtype, e.g. bfloat16): about half the memory
            for those weights and the activations, faster. Norms compute in float32 inside either way; LoRA weights,
            score heads that train and their optimizer states stay float32. Applies to every model of the run
            (policy, reference, reward, value, shared base). See `docs/dtypes.md`.
        reward_funcs (`list`, *optional*):
            PPO: reward functions beside (or instead of) the reward model, called as TRL's `GRPOTrainer` calls them.
            Each entry is `"module:function"` (or dotted `"module.function"`), `"path/to/file.py:function"` (relative
            to the recipe's folder), a factory `{name: FACTORY, kwargs: {...}}` whose call returns the function, or
            a remote reward `{url: http://host:port/path, timeout_s: 30, retries: 2, label_column: label}`
            (`trl_ext.rewards.resolve`). With it `reward_model_path` is optional; `reward_weights` has one weight
            per reward, the reward model's first. See `docs/reward-functions-recipes.md`.
        tools (`list`, *optional*):
            PPO: functions the model may call (TRL `GRPOTrainer`'s `tools`): each episode then runs several turns, the
            tool results masked out of every loss term (`docs/tools.md`). Entries as `reward_funcs`'
            (`"module:function"`, `"path/to/file.py:function"` relative to the recipe's folder, a factory
            `{name: FACTORY, kwargs: {...}}`); each must be typed and have a docstring with an `Args:` section (its
            JSON schema goes into the prompt). The dataset's `prompt` column must be chat messages.
        environment_factory (`str` or `dict`, *optional*):
            PPO: `"module:callable"` or `"path/to/file.py:callable"` building an environment (TRL `GRPOTrainer`'s
            `environment_factory`): its public methods are tools, `reset(**row)` starts each episode, an optional
            `get_reward()` is a reward source (then neither `reward_model_path` nor `reward_funcs` is needed). A
            mapping `{name: "module:callable", ...}` gives several, chosen per row by an `environment` column.
        value_model_path (`str`, *optional*):
            PPO: checkpoint of the value model. Defaults to `reward_model_path`; without a reward model
            (`reward_funcs` only) to the policy's `model_name_or_path` with a fresh one-output head.
        value_reinit_score_head (`bool`, *optional*, defaults to `False`):
            PPO: as `reinit_score_head`, for the value model.
        shared_base (`bool`, *optional*, defaults to `False`):
            PPO: one base for policy, reference, reward and value. The reward and value models become LoRA adapters,
            each with its own score head, on the policy's base (quantized or not; needs `use_peft: true`):
            `reward_model_path` must be the LoRA adapter directory a reward recipe with `use_peft` writes, trained
            on the policy's `model_name_or_path`; the value adapter starts from `value_model_path` (an adapter
            directory on the same base; default: the reward adapter) or, when `value_model_path` is the policy's
            `model_name_or_path`, fresh (the policy's LoRA settings, overridden by `value_lora_*` keys). The reward
            adapter is frozen. Without a reward model (`reward_funcs` only) only the value adapter shares the base,
            fresh unless `value_model_path` names an adapter; a critic-free run without a reward model has nothing
            to share and is refused. `reward_*` keys and `value_*` keys other than LoRA settings do not apply.
        ptx_dataset_name (`str`, *optional*):
            PPO-ptx: hub name, local file or `save_to_disk` directory of the pretraining-mix text.
        ptx_dataset_config (`str`, *optional*):
            PPO-ptx: dataset configuration name.
        ptx_dataset_split (`str`, *optional*, defaults to `"train"`):
            PPO-ptx: split to use.
        ptx_text_column (`str`, *optional*, defaults to `"text"`):
            PPO-ptx: column holding the plain text (a tokenized `input_ids` column is used as is).
        eval_dataset_name (`str`, *optional*):
            Evaluation data (`eval_strategy`; PPO's sample generations) from another dataset than `dataset_name`:
            hub name, local file or `save_to_disk` directory, same columns as the train split. Default: the
            `dataset_test_split` of `dataset_name` (TRL's ScriptArguments). A run with `eval_strategy` on and no
            evaluation data is refused before any model loads (`trl-ext check` too, for local data).
        eval_dataset_split (`str`, *optional*, defaults to `"train"`):
            With `eval_dataset_name`: the split to use (a local file's only split is `train`).
        allow_empty_responses (`bool`, *optional*, defaults to `False`):
            Accept empty or whitespace-only responses (`chosen`, `rejected`, `responses`, `completion`) in the data,
            e.g. sampled responses that ended at once, as "saying nothing" examples. Without it such a row is
            refused before training (`trl-ext check` for local data). Empty prompts are always refused.
        wandb_project (`str`, *optional*):
            Weights & Biases project (sets `WANDB_PROJECT`); used with `report_to: wandb`.
        wandb_entity (`str`, *optional*):
            Weights & Biases entity (sets `WANDB_ENTITY`).
        wandb_group (`str`, *optional*):
            Weights & Biases run group (sets `WANDB_RUN_GROUP`).
        wandb_tags (`list[str]`, *optional*):
            Weights & Biases run tags (sets `WANDB_TAGS`).
    """

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
