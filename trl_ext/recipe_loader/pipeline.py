"""Run a resolved :class:`~trl_ext.recipe_loader.Recipe`: open the data, load the models, build the trainer, train, save.

One function per trainer kind (:func:`train_sft`, :func:`train_reward`, :func:`train_dpo`, :func:`train_ppo`);
:func:`run` picks one.
Order matters: datasets are opened and their columns checked before any model loads, so a bad dataset costs no
model download. At the end the output directory holds the model (the adapter with LoRA), the tokenizer, the
resolved recipe (``trl_ext_recipe.yaml``) and ``trainer_state.json`` with the log history (also for PPO).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import UserInputError
from ..models.loaders import load_policy, load_scalar_model, load_tokenizer
from .data import check_columns, eval_source, open_eval_split, open_split, ptx_texts, tokenize_prompts
from .data_rows import check_prompt_lengths, check_rows, prompt_length_limit
from .loader import RECIPE_FILENAME, TINY_DIR_ENV, TINY_SCHEME, Recipe, tiny_models_dir  # noqa: F401 (re-exported)
from .validation import check_episodes


def resolve_model_path(path: str | None) -> str | None:
    """Map ``tiny://policy|reward|tokenizer`` to a directory of :func:`trl_ext.testing.build_tiny_models`
    (built once, by the main process first); other paths are returned unchanged."""
    if not path or not path.startswith(TINY_SCHEME):
        return path
    from accelerate import PartialState

    from ..testing import build_tiny_models

    with PartialState().main_process_first():
        models = build_tiny_models(tiny_models_dir())
    return str(getattr(models, path[len(TINY_SCHEME):]))


def _resolved(model_args):
    """``model_args`` with a ``tiny://`` model name replaced by its directory."""
    import dataclasses

    return dataclasses.replace(model_args, model_name_or_path=resolve_model_path(model_args.model_name_or_path))


def apply_environment(recipe: Recipe) -> None:
    """Set the recipe's ``env`` mapping and its wandb keys as environment variables."""
    for key, value in recipe.env.items():
        os.environ[key] = value
    p = recipe.pipeline
    for env, value in (
        ("WANDB_PROJECT", p.wandb_project),
        ("WANDB_ENTITY", p.wandb_entity),
        ("WANDB_RUN_GROUP", p.wandb_group),
        ("WANDB_TAGS", ",".join(p.wandb_tags) if p.wandb_tags else None),
    ):
        if value:
            os.environ[env] = value


def open_datasets(recipe: Recipe):
    """Open the train split and, when the run uses one, the eval split, and check their columns.

    The eval split is read when ``eval_strategy`` is not ``no`` (a missing split is then an error) and, for PPO, for
    TRL's sample generations when ``num_sample_generations > 0`` and the dataset has one.
    """
    s, args = recipe.script_args, recipe.training_args
    train = open_split(s.dataset_name, s.dataset_train_split, config=s.dataset_config,
                       streaming=s.dataset_streaming)
    text_column = getattr(args, "dataset_text_field", "text")  # SFT's text column
    check_columns(train, recipe.trainer, name=s.dataset_name, split=s.dataset_train_split, text_column=text_column)
    check_rows(train, recipe.trainer, name=s.dataset_name, split=s.dataset_train_split, text_column=text_column,
               allow_empty_responses=recipe.pipeline.allow_empty_responses)
    if recipe.trainer == "ppo" and hasattr(train, "__len__"):
        check_episodes(args, len(train))
    required = str(getattr(args, "eval_strategy", "no")).split(".")[-1].lower() != "no"
    sample_generations = recipe.trainer == "ppo" and args.num_sample_generations > 0
    if not (required or sample_generations):
        return train, None
    eval_ds = open_eval_split(recipe, required=required, streaming=s.dataset_streaming)
    if eval_ds is None:
        return train, None
    name, split = eval_source(recipe)[:2]
    check_columns(eval_ds, recipe.trainer, name=name, split=split, text_column=text_column)
    check_rows(eval_ds, recipe.trainer, name=name, split=split, text_column=text_column,
               allow_empty_responses=recipe.pipeline.allow_empty_responses)
    return train, eval_ds


def check_lengths(recipe: Recipe, tokenizer, *datasets, model_config=None) -> None:
    """Refuse a prompt that alone reaches the length limit (:mod:`trl_ext.recipe_loader.data_rows`), before models load.
    ``datasets``: the train and eval splits (None skipped)."""
    s = recipe.script_args
    limit = prompt_length_limit(recipe.trainer, recipe.training_args, model_config)
    for ds, (name, split) in zip(datasets, ((s.dataset_name, s.dataset_train_split), eval_source(recipe)[:2])):
        if ds is not None:
            check_prompt_lengths(ds, recipe.trainer, tokenizer, limit, name=name, split=split)


def refuse_empty_after_filtering(trainer, recipe: Recipe, *, out_existed: bool) -> None:
    """TRL's reward trainer drops pairs longer than max_length: refuse a run left with no pair, before it trains
    (and remove the empty output_dir that transformers' Trainer made, unless it was there before)."""
    ds = getattr(trainer, "train_dataset", None)
    if ds is not None and hasattr(ds, "__len__") and len(ds) == 0:
        out = Path(recipe.training_args.output_dir)
        if not out_existed and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise UserInputError(
            f"dataset '{recipe.script_args.dataset_name}': no row fits max_length: "
            f"{recipe.training_args.max_length} (TRL drops longer rows); raise max_length or shorten the rows"
        )


def open_ptx_dataset(recipe: Recipe):
    """The PPO-ptx text dataset, or None when the recipe has none."""
    p = recipe.pipeline
    if not p.ptx_dataset_name:
        return None
    ds = open_split(p.ptx_dataset_name, p.ptx_dataset_split, config=p.ptx_dataset_config,
                    key="ptx_dataset_name", split_key="ptx_dataset_split")
    check_columns(ds, "ptx", name=p.ptx_dataset_name, split=p.ptx_dataset_split, text_column=p.ptx_text_column)
    check_rows(ds, "ptx", name=p.ptx_dataset_name, split=p.ptx_dataset_split, text_column=p.ptx_text_column)
    return ptx_texts(ds, p.ptx_text_column)


def load_scalar_checkpoint(model_args, *, trainable: bool, reinit_head: bool = False, tokenizer=None,
                           upcast_non_quantized: bool = True):
    """A reward/value model from ``model_args``; also from a LoRA reward checkpoint (an adapter directory, as a
    reward recipe with ``use_peft`` writes), which ``load_scalar_model`` cannot read alone.

    For an adapter directory the base model named in its ``adapter_config.json`` is loaded with ``model_args``'
    quantization and the saved adapter and score head are put on top: frozen for a reward model; for a value
    model (``trainable``) the same adapter keeps training when ``use_peft`` is set (else it is merged into an
    unquantized base, which then trains in full). ``upcast_non_quantized``: as in ``load_scalar_model``.
    """
    import dataclasses
    import json

    path = model_args.model_name_or_path
    adapter = Path(path or "") / "adapter_config.json"
    if not (adapter.is_file() and not (Path(path) / "config.json").exists()):
        return load_scalar_model(model_args, reinit_head=reinit_head, tokenizer=tokenizer,
                                 upcast_non_quantized=upcast_non_quantized)
    from peft import PeftModel

    from ..models.dtypes import float32_trainable_parameters

    base = json.loads(adapter.read_text()).get("base_model_name_or_path")
    if not base:
        raise UserInputError(f"'{path}': adapter_config.json names no base_model_name_or_path")
    quantized = model_args.load_in_4bit or model_args.load_in_8bit
    if trainable and quantized and not model_args.use_peft:
        raise UserInputError(
            f"value model '{path}' is a LoRA adapter on a quantized base: set value_use_peft: true to train it"
        )
    base_args = dataclasses.replace(model_args, model_name_or_path=resolve_model_path(base), use_peft=False)
    # a trained adapter on a quantized base gets activation checkpointing, as load_scalar_model gives QLoRA models
    checkpointing = True if trainable and quantized and model_args.use_peft else None
    model = load_scalar_model(base_args, tokenizer=tokenizer, gradient_checkpointing=checkpointing,
                              upcast_non_quantized=upcast_non_quantized)
    model = PeftModel.from_pretrained(model, path, is_trainable=trainable and model_args.use_peft)
    if trainable and not model_args.use_peft:
        model = model.merge_and_unload()
        model.requires_grad_(True)
    else:
        float32_trainable_parameters(model)  # the score head peft copied from the base (trl_ext.models.dtypes)
    return model


def _model_config(model_args):
    """The policy checkpoint's config (a small file), or None when it cannot be read here."""
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                          trust_remote_code=model_args.trust_remote_code)
    except Exception:  # noqa: BLE001 - the model load reports it
        return None


def _resume_arg(recipe: Recipe):
    value = getattr(recipe.training_args, "resume_from_checkpoint", None)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return value


def _finish(trainer, recipe: Recipe, tokenizer) -> Path:
    """Save model, tokenizer, resolved recipe and trainer_state.json (log history) into output_dir."""
    out = Path(recipe.training_args.output_dir)
    trainer.save_model(str(out))  # PPO: the policy only (adapter if LoRA), also under DDP
    if trainer.accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        tokenizer.save_pretrained(str(out))
        (out / RECIPE_FILENAME).write_text(recipe.to_yaml())
        trainer.state.save_to_json(str(out / "trainer_state.json"))
    trainer.accelerator.wait_for_everyone()
    if "wandb" in (recipe.training_args.report_to or []):
        import wandb

        if wandb.run is not None:  # HF's callback leaves the run open: close it so its files are complete
            wandb.finish()
    return out


def train_sft(recipe: Recipe):
    """Supervised fine-tuning (``trl_ext.SFTTrainer``) of ``model_name_or_path`` from a resolved recipe; returns the
    trainer. The model loads as a policy does (quantization, LoRA); the data is in one of TRL's SFT formats."""
    from trl_ext import SFTTrainer

    train_ds, eval_ds = open_datasets(recipe)
    model_args = _resolved(recipe.model_args)
    tokenizer = load_tokenizer(model_args)
    check_lengths(recipe, tokenizer, train_ds, eval_ds)
    model = load_policy(model_args, tokenizer=tokenizer, upcast_non_quantized=recipe.pipeline.upcast_non_quantized)
    trainer = SFTTrainer(model=model, args=recipe.training_args, train_dataset=train_ds, eval_dataset=eval_ds,
                         processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=_resume_arg(recipe))
    _finish(trainer, recipe, tokenizer)
    return trainer


def train_reward(recipe: Recipe):
    """Train a reward model (``trl_ext.RewardTrainer``) from a resolved recipe; returns the trainer."""
    from trl_ext import RewardTrainer

    train_ds, eval_ds = open_datasets(recipe)
    model_args = _resolved(recipe.model_args)
    tokenizer = load_tokenizer(model_args)
    check_lengths(recipe, tokenizer, train_ds, eval_ds)
    model = load_scalar_model(model_args, reinit_head=recipe.pipeline.reinit_score_head, tokenizer=tokenizer,
                              upcast_non_quantized=recipe.pipeline.upcast_non_quantized)
    out_existed = Path(recipe.training_args.output_dir).exists()
    trainer = RewardTrainer(model=model, args=recipe.training_args, train_dataset=train_ds, eval_dataset=eval_ds,
                            processing_class=tokenizer)
    refuse_empty_after_filtering(trainer, recipe, out_existed=out_existed)
    trainer.train(resume_from_checkpoint=_resume_arg(recipe))
    _finish(trainer, recipe, tokenizer)
    return trainer


def train_dpo(recipe: Recipe):
    """Train a policy with DPO (``trl_ext.DPOTrainer``) from a resolved recipe; returns the trainer.

    With LoRA the reference is the policy with its adapter disabled; otherwise TRL loads a frozen copy.
    """
    from trl_ext import DPOTrainer

    train_ds, eval_ds = open_datasets(recipe)
    model_args = _resolved(recipe.model_args)
    tokenizer = load_tokenizer(model_args)
    check_lengths(recipe, tokenizer, train_ds, eval_ds)
    model = load_policy(model_args, tokenizer=tokenizer, upcast_non_quantized=recipe.pipeline.upcast_non_quantized)
    trainer = DPOTrainer(model=model, ref_model=None, args=recipe.training_args, train_dataset=train_ds,
                         eval_dataset=eval_ds, processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=_resume_arg(recipe))
    _finish(trainer, recipe, tokenizer)
    return trainer


def train_ppo(recipe: Recipe):
    """Train a policy with PPO (``trl_ext.PPOTrainer``) from a resolved recipe; returns the trainer.

    Policy from ``model_name_or_path`` (reference: adapter disabled with LoRA, else a frozen copy; under DeepSpeed
    ZeRO-3 the reference is loaded from ``model_name_or_path`` too, as TRL asks), reward model
    from ``reward_model_path`` (optional with ``reward_funcs``: the recipe's reward functions, resolved by the
    loader, go to the trainer as ``reward_funcs``), value model (none with a critic-free ``advantage_estimator``)
    from ``value_model_path`` (default: the reward model, else the policy's checkpoint with a fresh head), each with
    its own ``reward_*``/``value_*`` quantization and LoRA keys. Prompts come from the ``prompt`` column, tokenized
    as in TRL's PPO example; with reward functions, ``tools`` or ``environment_factory`` (resolved by the loader,
    :mod:`trl_ext.recipe_loader.tool_keys`) the dataset's other columns stay beside ``input_ids``. The eval split (if
    the dataset has one) feeds TRL's sample generations.
    """
    from trl_ext import PPOTrainer

    from ..ppo.combination_rules import check_eval_inputs
    from .reward_keys import check_reward_columns
    from .tool_keys import check_tool_data, check_tool_tokenizer, uses_tools

    args = recipe.training_args
    if args.model_init_kwargs:
        raise UserInputError("recipe: key 'model_init_kwargs' is for model ids given to PPOTrainer in Python; a recipe "
                             "loads its models from its model keys (dtype, attn_implementation, load_in_4bit, ...)")
    check_eval_inputs(args, True, uses_tools(recipe))  # evaluation of multi-turn episodes: refused before the data
    train_ds, eval_ds = open_datasets(recipe)
    check_reward_columns(recipe, train_ds.column_names)
    check_tool_data(recipe, train_ds, name=recipe.script_args.dataset_name,
                    split=recipe.script_args.dataset_train_split)  # tools: chat prompts, the environment column
    ptx = open_ptx_dataset(recipe)

    model_args = _resolved(recipe.model_args)
    tokenizer = load_tokenizer(model_args)
    tokenizer.padding_side = "left"  # generation needs left padding (as TRL's PPO example)
    check_tool_tokenizer(recipe, tokenizer)  # tools: a template that renders and parses tool calls
    # reward functions receive the dataset's other columns; tools render the `prompt` messages each update
    keep = bool(recipe.reward_funcs) or uses_tools(recipe)
    template_kwargs = args.chat_template_kwargs
    train_ds = tokenize_prompts(train_ds, tokenizer, num_proc=args.dataset_num_proc, keep_columns=keep,
                                chat_template_kwargs=template_kwargs)
    if eval_ds is not None:
        eval_ds = tokenize_prompts(eval_ds, tokenizer, num_proc=args.dataset_num_proc, keep_columns=keep,
                                   chat_template_kwargs=template_kwargs)
    check_lengths(recipe, tokenizer, train_ds, eval_ds, model_config=_model_config(model_args))

    policy, ref_model, reward_model, value_model = load_ppo_models(recipe, tokenizer)

    extra = {"reward_funcs": recipe.reward_funcs} if recipe.reward_funcs else {}
    if uses_tools(recipe):  # multi-turn episodes (trl_ext/ppo/episodes)
        extra.update(tools=recipe.tools or None, environment_factory=recipe.environment_factory)
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=ref_model,
                         reward_model=reward_model, value_model=value_model, train_dataset=train_ds,
                         eval_dataset=eval_ds, ptx_dataset=ptx, **extra)
    trainer.train(resume_from_checkpoint=_resume_arg(recipe))
    _finish(trainer, recipe, tokenizer)
    if value_model is not None:  # the trained value model (an adapter on a shared base lives nowhere else): kept
        from ..ppo.trainer import VALUE_MODEL_DIR

        value_model.save_pretrained(str(Path(args.output_dir) / VALUE_MODEL_DIR),
                                    is_main_process=trainer.accelerator.is_main_process)
        trainer.accelerator.wait_for_everyone()
    return trainer


def load_ppo_models(recipe: Recipe, tokenizer):
    """The PPO run's ``(policy, ref_model, reward_model, value_model)`` as the recipe's keys define them (what
    :func:`train_ppo` trains; ``benchmarks/gpu_ppo.py`` loads through it too, so its models follow the recipe keys).
    ``ref_model`` is None (TRL: the policy with its adapter disabled with LoRA, else a frozen copy) except under
    DeepSpeed ZeRO-3 without LoRA; ``reward_model`` None with reward functions only; ``value_model`` None with a
    critic-free ``advantage_estimator``."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    model_args = _resolved(recipe.model_args)
    upcast = recipe.pipeline.upcast_non_quantized
    policy = load_policy(model_args, tokenizer=tokenizer, upcast_non_quantized=upcast)
    ref_model = None  # TRL: the policy with its adapter disabled (LoRA), else a frozen copy of the policy
    if not model_args.use_peft and is_deepspeed_zero3_enabled():
        # TRL's copy (create_reference_model) refuses ZeRO-3's partitioned parameters: load the reference itself
        ref_model = load_policy(model_args, tokenizer=tokenizer, upcast_non_quantized=upcast)
    if recipe.pipeline.shared_base:
        reward_model, value_model = shared_base_scalar_models(recipe, policy)
    else:
        reward_model = None  # reward functions only
        if recipe.reward_model_args is not None:
            reward_args = _resolved(recipe.reward_model_args)
            reward_model = load_scalar_checkpoint(reward_args, trainable=False, tokenizer=tokenizer,
                                                  upcast_non_quantized=upcast)
            reward_model.eval()
            for p in reward_model.parameters():
                p.requires_grad_(False)
        value_model = None  # critic-free advantage_estimator: no value model
        if recipe.value_model_args is not None:
            value_args = _resolved(recipe.value_model_args)
            value_model = load_scalar_checkpoint(value_args, trainable=True, tokenizer=tokenizer,
                                                 reinit_head=recipe.pipeline.value_reinit_score_head,
                                                 upcast_non_quantized=upcast)

    return policy, ref_model, reward_model, value_model


def shared_base_scalar_models(recipe: Recipe, policy):
    """``shared_base: true``: the reward and value models as adapters with their own heads on ``policy``'s base
    (:mod:`trl_ext.models.shared_base`): the reward adapter (frozen) from ``reward_model_path``; the value adapter
    from ``value_model_path`` (default: the reward adapter), or fresh when that names the policy's own base; none
    with a critic-free ``advantage_estimator``."""
    import dataclasses

    from ..models.lora import lora_config_for
    from ..models.shared_base import REWARD_ADAPTER, VALUE_ADAPTER, add_scalar_adapter
    from .loader import SHARED_BASE_VALUE_KEYS, default_value_model_path, shared_value_is_fresh

    args, pipeline = recipe.training_args, recipe.pipeline
    reward_model = None  # reward functions only: no reward adapter
    if args.reward_model_path:
        reward_model = add_scalar_adapter(policy, REWARD_ADAPTER, source=resolve_model_path(args.reward_model_path),
                                          trainable=False)
        reward_model.eval()
    if recipe.value_model_args is None:  # critic-free advantage_estimator: no value adapter
        return reward_model, None
    value_path = default_value_model_path(pipeline, args, recipe.model_args)
    if shared_value_is_fresh(value_path, recipe.model_args.model_name_or_path):
        # the policy's LoRA settings, with the value_lora_* keys the recipe sets
        value_keys = {
            key[len("value_"):]: getattr(recipe.value_model_args, key[len("value_"):])
            for key in recipe.explicit
            if key.startswith("value_") and (key[6:].startswith("lora_") or key[6:] in SHARED_BASE_VALUE_KEYS)
        }
        value_lora = lora_config_for(dataclasses.replace(recipe.model_args, **value_keys), task_type="CAUSAL_LM")
        value_model = add_scalar_adapter(policy, VALUE_ADAPTER, lora_config=value_lora, trainable=True)
    else:
        value_model = add_scalar_adapter(policy, VALUE_ADAPTER, source=resolve_model_path(value_path),
                                         trainable=True, reinit_head=pipeline.value_reinit_score_head)
    return reward_model, value_model


TRAIN_FUNCTIONS = {"sft": train_sft, "reward": train_reward, "dpo": train_dpo, "ppo": train_ppo}


def run(recipe: Recipe):
    """Train what ``recipe`` describes; returns the trainer (its ``state.log_history`` holds the metrics)."""
    from accelerate import PartialState

    from transformers import set_seed

    apply_environment(recipe)
    from ..runtime.cuda_memory import configure_cuda_allocator

    configure_cuda_allocator(recipe.pipeline.cuda_expandable_segments)  # before any model allocates on CUDA
    # Every process has validated the recipe (output_dir included) before any of them writes anything.
    PartialState().wait_for_everyone()
    # Before any model loads: LoRA adapters and new score heads are initialised from torch's RNG, whose start
    # differs from process to process; seeded here, a recipe run is reproducible (as HF's example scripts do).
    set_seed(recipe.training_args.seed)
    return TRAIN_FUNCTIONS[recipe.trainer](recipe)
