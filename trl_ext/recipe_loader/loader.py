"""YAML recipes: load, merge command-line overrides, validate, resolve into TRL/trl-ext dataclasses. How it works:
docs/internals-recipes.md#loading-a-recipe."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..errors import UserInputError
from ..models.paths import looks_local
from .recipe_paths import resolve_recipe_paths
from . import validation
from .arguments import (  # re-exported: the loader's public names
    ENTRY_KEYS,
    INHERITED_MODEL_KEYS,
    PATH_KEYS,
    TRAINERS,
    UNSUPPORTED_KEYS,
    PipelineArguments,
    Recipe,
    scalar_model_config,
)
from .argv import RecipeArgumentParser as _RecipeArgumentParser
from .argv import entry_values, plain, portable_value, to_argv
from .grpo_keys import translate_grpo_keys
from .reward_keys import check_no_reward_model, resolve_reward_keys
from .tool_keys import check_reward_source, resolve_tool_keys

RECIPE_FILENAME = "trl_ext_recipe.yaml"
TINY_SCHEME = "tiny://"
TINY_NAMES = ("tokenizer", "policy", "reward")
TINY_DIR_ENV = "TRL_EXT_TINY_DIR"


# ----------------------------------------------------------------------------------------------------------------
# Reading the YAML file and the command-line overrides


def read_recipe_file(path: str | os.PathLike) -> dict:
    """Read a recipe file into a dict (one-line errors for a missing file, bad YAML, or a non-mapping)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserInputError(f"recipe file '{path}' does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserInputError(f"recipe file '{path}': {problem}{where}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserInputError(f"recipe file '{path}' must hold a mapping of `key: value` lines")
    return data


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """Turn ``["--key", "value", "--k2=v", "--flag", "--lst", "a", "b"]`` into a dict of raw values.

    Values stay strings (typed later, as if written on TRL's command line); a key followed by no value means
    ``true``; several values make a list; ``null`` alone means null, as in a recipe (so the same checks apply).
    """
    out: dict[str, Any] = {}
    key = None
    for tok in tokens:
        if tok.startswith("--") and len(tok) > 2:
            name, eq, value = tok[2:].partition("=")
            name = name.replace("-", "_")
            key = name
            out[key] = [value] if eq else []
        elif key is None:
            raise UserInputError(f"unexpected argument '{tok}': overrides are `--key value` pairs")
        else:
            out[key].append(tok)
    return {k: (True if not v else (None if v[0] == "null" else v[0]) if len(v) == 1 else v) for k, v in out.items()}


# ----------------------------------------------------------------------------------------------------------------
# Dataclasses of each trainer


def trainer_config_class(trainer: str):
    """The trl-ext config class of a trainer kind."""
    import trl_ext

    return {"sft": trl_ext.SFTConfig, "reward": trl_ext.RewardConfig, "dpo": trl_ext.DPOConfig,
            "ppo": trl_ext.PPOConfig}[trainer]


@functools.lru_cache(maxsize=None)
def _prefixed_model_class(prefix: str):
    """A dataclass with the fields of TRL's ModelConfig (but the model path) renamed ``<prefix>_<field>``.

    Every field defaults to None: "not set" (the model then uses ModelConfig's default, or the policy's value for
    :data:`INHERITED_MODEL_KEYS`).
    """
    from trl import ModelConfig

    fields = []
    for f in dataclasses.fields(ModelConfig):
        if f.name == "model_name_or_path":
            continue
        typ = f.type if "None" in str(f.type) or "Optional" in str(f.type) else Optional[f.type]
        help_ = f"{prefix.capitalize()} model: " + f.metadata.get("help", f.name)
        meta = {"help": help_, **({"choices": f.metadata["choices"]} if "choices" in f.metadata else {})}
        fields.append((f"{prefix}_{f.name}", typ, field(default=None, metadata=meta)))
    return dataclasses.make_dataclass(f"{prefix.capitalize()}ModelArguments", fields)


@functools.lru_cache(maxsize=None)
def _parser_of(trainer: str):
    """The argument parser of a trainer's recipes (built once: ~50 ms). :func:`resolve_recipe` restores the
    defaults it changes for `null` values."""
    return _RecipeArgumentParser(_dataclass_types(trainer))


def _dataclass_types(trainer: str) -> list:
    from trl import ModelConfig, ScriptArguments

    types = [ScriptArguments, ModelConfig, trainer_config_class(trainer), PipelineArguments]
    if trainer == "ppo":
        types += [_prefixed_model_class("reward"), _prefixed_model_class("value")]
    return types


def valid_keys(trainer: str) -> list[str]:
    """All keys a recipe for ``trainer`` may hold."""
    parser = _RecipeArgumentParser(_dataclass_types(trainer))
    return sorted(a.dest for a in parser._actions if a.dest != "help") + ["env"]


# ----------------------------------------------------------------------------------------------------------------
# Resolution


def _check_path(key: str, value: Optional[str]) -> None:
    if not value:
        return
    if value.startswith(TINY_SCHEME):
        name = value[len(TINY_SCHEME):]
        if name not in TINY_NAMES:
            raise UserInputError(
                f"recipe: key '{key}': unknown tiny model '{value}' (use one of "
                + ", ".join(TINY_SCHEME + n for n in TINY_NAMES) + ")"
            )
        return
    if looks_local(value) and not os.path.exists(os.path.expanduser(value)):
        hint = " (train it first with its reward recipe)" if key in ("reward_model_path", "value_model_path") else ""
        raise UserInputError(f"recipe: key '{key}': local path '{value}' does not exist{hint}")


def resolve_recipe(
    path: str | os.PathLike, overrides: list[str] | dict | None = None, *, for_check: bool = False
) -> Recipe:
    """Load a recipe, apply command-line overrides and validate everything that can be checked without loading.

    Args:
        path: the YAML recipe.
        overrides: ``["--key", "value", ...]`` from the command line (or an already parsed dict).
        for_check: `trl-ext check` mode: a precision this machine cannot run (bf16/fp16 without a GPU) is noted
            instead of refused, so GPU recipes can be checked on a laptop.

    Raises:
        UserInputError: one line naming the culprit key.
    """
    raw = read_recipe_file(path)
    cli = overrides if isinstance(overrides, dict) else parse_overrides(list(overrides or []))
    merged = {**raw, **cli}

    env = merged.pop("env", None) or {}
    if not isinstance(env, dict):
        raise UserInputError("recipe: key 'env' must be a mapping of environment variables")
    if not for_check:  # as TRL's --config: before the configs are built (e.g. CUDA_VISIBLE_DEVICES)
        for k, v in env.items():
            os.environ[str(k)] = str(v)

    trainer = merged.get("trainer")
    if trainer is None:
        raise UserInputError(f"recipe: missing key 'trainer' (one of {', '.join(TRAINERS)})")
    if trainer not in TRAINERS:
        raise UserInputError(f"recipe: key 'trainer': invalid choice '{trainer}' (choose from {', '.join(TRAINERS)})")
    if trainer == "ppo":  # GRPOConfig's names (num_generations, beta, ...) as PPOConfig's
        merged = translate_grpo_keys(merged)

    types = _dataclass_types(trainer)
    parser = _parser_of(trainer)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    defaults = {dest: a.default for dest, a in actions.items()}
    try:
        return _resolve(_Resolution(path=path, merged=merged, cli=cli, env=env, trainer=trainer, types=types,
                                    parser=parser, actions=actions, for_check=for_check))
    finally:  # `null` values are set as parser defaults: put the parser back as it was
        for dest, a in actions.items():
            a.default = defaults[dest]
        parser._defaults.clear()


@dataclass
class _Resolution:
    """What the steps of :func:`_resolve` share: the recipe's raw keys, the parser of its trainer, and what each
    step adds (``specs``, ``argv``, ``parsed``, ``notes``, ``resuming``, the reward and value model configs)."""

    path: Any
    merged: dict
    cli: dict
    env: dict
    trainer: str
    types: list
    parser: Any
    actions: dict
    for_check: bool
    specs: dict = field(default_factory=dict)
    argv: list = field(default_factory=list)
    parsed: tuple = ()
    notes: list = field(default_factory=list)
    resuming: bool = False
    reward_args: Any = None
    value_args: Any = None
    reward_specs: list = field(default_factory=list)
    reward_funcs: list = field(default_factory=list)
    tool_keys: Any = None  # tools and environments (tool_keys.ToolKeys)

    @property
    def has_reward_model(self) -> bool:
        return self.given("reward_model_path") not in (None, "")

    def given(self, key, default=None):
        return self.merged.get(key, default)

    def truthy(self, key) -> bool:
        v = self.merged.get(key)
        return v is True or (isinstance(v, str) and v.lower() in ("true", "yes", "1", "t", "y"))

    @property
    def training_args(self):
        return self.parsed[2]

    @property
    def pipeline(self) -> PipelineArguments:
        return self.parsed[3]


def _resolve(ctx: _Resolution) -> Recipe:
    """Validate and resolve a recipe, one named step after the other (each raises a one-line UserInputError)."""
    _check_known_keys(ctx)
    _check_raw_values(ctx)
    resolve_recipe_paths(ctx.merged, ctx.cli, ctx.path, PATH_KEYS)  # recipe's folder, then cwd (recipe_paths.py)
    _parse(ctx)
    for key, value in entry_values(ctx.merged, ctx.cli).items():  # data, past the parser
        setattr(ctx.pipeline, key, value)
    _check_paths_and_resume(ctx)
    _resolve_ppo_models(ctx)
    _check_model_and_output(ctx)
    script_args, model_args, training_args, pipeline = ctx.parsed[:4]
    env = {str(k): str(v) for k, v in ctx.env.items()}
    return Recipe(
        path=Path(ctx.path), trainer=ctx.trainer, script_args=script_args, model_args=model_args,
        training_args=training_args, pipeline=pipeline, reward_model_args=ctx.reward_args,
        value_model_args=ctx.value_args, reward_funcs=ctx.reward_funcs,
        reward_func_entries=[spec.where for spec in ctx.reward_specs], explicit=_explicit_keys(ctx), notes=ctx.notes,
        env=env, **(ctx.tool_keys.recipe_fields() if ctx.tool_keys else {}),
    )


def _check_known_keys(ctx: _Resolution) -> None:
    """Unknown keys (with the closest valid one) and keys trl-ext does not use."""
    for key in ctx.merged:
        if key in UNSUPPORTED_KEYS:
            raise UserInputError(f"recipe: key '{key}' is not used by trl-ext: {UNSUPPORTED_KEYS[key]}")
        if key not in ctx.actions:
            close = difflib.get_close_matches(key, list(ctx.actions) + ["env"], n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (not a key of a {ctx.trainer} recipe)"
            raise UserInputError(f"recipe: unknown key '{key}'{hint}")


def _check_raw_values(ctx: _Resolution) -> None:
    """Checks on raw values that TRL's own messages would not name clearly: both quantizations, missing keys."""
    given, trainer = ctx.given, ctx.trainer
    for prefix in ("", "reward_", "value_"):
        if ctx.truthy(f"{prefix}load_in_4bit") and ctx.truthy(f"{prefix}load_in_8bit"):
            raise UserInputError(
                f"recipe: keys '{prefix}load_in_4bit' and '{prefix}load_in_8bit' are both true; choose one"
            )
    for key in ("model_name_or_path", "output_dir"):
        if given(key) in (None, ""):
            raise UserInputError(f"recipe: missing key '{key}'")
    if trainer in ("sft", "reward", "dpo") and given("dataset_name") in (None, ""):
        raise UserInputError("recipe: missing key 'dataset_name' (hub name, local file or save_to_disk directory)")
    if trainer == "ppo":
        if given("dataset_name") in (None, ""):
            raise UserInputError("recipe: missing key 'dataset_name' (prompts for PPO)")
        if ctx.truthy("dataset_streaming"):
            raise UserInputError("recipe: key 'dataset_streaming' is not supported by PPO (it needs the prompt count)")
        if not ctx.has_reward_model and given("reward_funcs") in (None, "", []) and not given("environment_factory"):
            raise UserInputError("recipe: missing key 'reward_model_path' (the reward model PPO optimises) or "
                                 "'reward_funcs' (reward functions)")


def _argv_of(ctx: _Resolution, keys) -> list[str]:
    """Command-line tokens of ``keys`` as TRL's CLI would parse them; a `null` value becomes a parser default."""
    argv: list[str] = []
    for key in keys:
        value = ctx.merged[key]
        if key in ENTRY_KEYS:  # data: entry_values
            continue
        if value is None:
            validation.check_null(key, ctx.specs[key])
            ctx.parser.set_defaults(**{key: None})
        elif value is True and key in ctx.cli and ctx.actions[key].nargs == "?":
            argv.append(f"--{key}")
        else:
            argv += to_argv(key, value, ctx.actions[key])
    return argv


def _parse(ctx: _Resolution) -> None:
    """Type checks as TRL's CLI would parse them, with one-line errors; then nullability, choices and ranges
    (trl_ext.field_rules: by the trainer's config itself, by trl_ext.recipe_loader.validation for the other keys), before the libraries' own checks in the dataclasses' __post_init__ (an error
    there names the recipe key at fault). `check` on a machine without a GPU validates a GPU precision as fp32."""
    ctx.specs = validation.key_specs(ctx.types)
    ctx.argv = _argv_of(ctx, ctx.merged)
    # the trainer's config (ctx.types[2]) checks its own fields when built; the other dataclasses' keys here
    not_self_checked = validation.key_specs([t for i, t in enumerate(ctx.types) if i != 2])
    validation.check_namespace(ctx.parser.parse_known_args(ctx.argv)[0],
                               [k for k in ctx.merged if k not in ENTRY_KEYS], not_self_checked)
    try:
        ctx.parsed = tuple(ctx.parser.parse_args_into_dataclasses(args=ctx.argv, look_for_args_file=False))
        return
    except UserInputError as err:
        raise UserInputError(validation.recipe_message(str(err), ctx.actions)) from None
    except ValueError as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else repr(err)
    precision = any(k in msg for k in ("bf16", "fp16", "gpu", "GPU"))
    if precision and not ctx.for_check:
        raise UserInputError(
            f"recipe: key 'bf16'/'fp16': this machine cannot train in that precision ({msg}); TRL's configs "
            "default to bf16: true, so on CPU set use_cpu: true (or bf16: false)"
        ) from None
    if not precision:
        raise _library_error(ctx, msg) from None
    # `check` on a machine without a GPU: validate the rest with fp32 and say so.
    ctx.notes.append(f"this machine cannot run the recipe's precision ({msg}); checked the rest with fp32")
    ctx.argv += ["--bf16", "false", "--fp16", "false"]
    try:
        ctx.parsed = tuple(ctx.parser.parse_args_into_dataclasses(args=ctx.argv, look_for_args_file=False))
    except UserInputError as err2:
        raise UserInputError(validation.recipe_message(str(err2), ctx.actions)) from None
    except ValueError as err2:
        raise _library_error(ctx, str(err2).strip().splitlines()[0]) from None


def _library_error(ctx: _Resolution, msg: str) -> UserInputError:
    """A library's validation error, naming the recipe key at fault (validation.find_culprit)."""

    def builds(keys) -> bool:
        ctx.parser.parse_args_into_dataclasses(
            args=_argv_of(ctx, keys) + (["--bf16", "false", "--fp16", "false"] if ctx.for_check else []),
            look_for_args_file=False)
        return True

    culprit = validation.find_culprit(msg, list(ctx.merged), builds)
    return UserInputError(f"recipe: {f'key {culprit!r}: ' if culprit else ''}{msg}")


def _check_paths_and_resume(ctx: _Resolution) -> None:
    """Local paths must exist (hub names are checked when loaded); `resume_from_checkpoint` must find one."""
    for key in PATH_KEYS:
        owner = next((o for o in ctx.parsed[:4] if key in {f.name for f in dataclasses.fields(o)}), None)
        value = getattr(owner, key, None)
        if isinstance(value, str):
            _check_path(key, value)
    # resume_from_checkpoint: true (latest complete checkpoint-N in output_dir) or a checkpoint folder
    resume = getattr(ctx.training_args, "resume_from_checkpoint", None)
    ctx.resuming = resume is not None and str(resume).strip().lower() not in ("", "false", "no", "none")
    if ctx.resuming:
        from ..runtime.checkpoints import resolve_checkpoint

        resolve_checkpoint(resume, ctx.training_args.output_dir)  # UserInputError naming the key if there is none


def _resolve_ppo_models(ctx: _Resolution) -> None:
    """PPO: the reward and value models' configs and their checks (ptx, batches, shared base, LoRA); other trainers:
    refuse PPO-only keys."""
    training_args, pipeline, model_args = ctx.training_args, ctx.pipeline, ctx.parsed[1]
    if ctx.trainer != "ppo":
        bad = next((k for k, f in _PPO_ONLY.items() if getattr(pipeline, k) not in (None, f.default)), None)
        if bad:
            raise UserInputError(
                f"recipe: key '{bad}' is for PPO recipes only (this recipe has trainer: {ctx.trainer})"
            )
        return
    from ..ppo.combination_rules import check_turn_credit

    ctx.tool_keys = resolve_tool_keys(ctx)  # before the rewards: an environment with get_reward is one
    check_turn_credit(training_args, bool(ctx.tool_keys.tools) or ctx.tool_keys.environment_factory is not None)
    resolve_reward_keys(ctx)
    check_reward_source(ctx)
    has_value_model = getattr(training_args, "has_value_model", True)  # a critic-free advantage_estimator: none
    if ctx.has_reward_model:
        ctx.reward_args = scalar_model_config(ctx.parsed[4], "reward", model_args, training_args.reward_model_path)
    else:  # reward functions only: no reward model (TRL's config default path would be a model nobody asked for)
        check_no_reward_model(ctx.merged, has_value_model, pipeline)
        training_args.reward_model_path = None
    if has_value_model:
        value_path = default_value_model_path(pipeline, training_args, model_args)
        ctx.value_args = scalar_model_config(ctx.parsed[5], "value", model_args, value_path)
    else:
        _check_no_value_keys(ctx.merged, training_args)  # no value model: value_model_args stays None
    _check_ptx(training_args, pipeline)
    if pipeline.shared_base:
        _check_shared_base(ctx.merged, ctx.parsed, model_args, training_args, pipeline)
    else:
        validation.check_lora(ctx.reward_args, prefix="reward_")
        validation.check_lora(ctx.value_args, prefix="value_")
        validation.check_value_trains(ctx.value_args)


def _check_model_and_output(ctx: _Resolution) -> None:
    """The trained model's LoRA and length limits, runs that would train nothing, and a non-empty output_dir
    (never overwritten unless asked, or resuming into it)."""
    model_args, training_args, pipeline = ctx.parsed[1], ctx.training_args, ctx.pipeline
    if ctx.trainer == "reward" and "lora_task_type" not in ctx.merged:
        model_args.lora_task_type = "SEQ_CLS"  # the reward model is a sequence classifier
    validation.check_lora(model_args)
    validation.check_model_limits(ctx.trainer, training_args, _local_model_config(model_args.model_name_or_path))
    out = Path(training_args.output_dir)
    if out.is_dir() and any(out.iterdir()) and not pipeline.overwrite_output_dir and not ctx.resuming:
        raise UserInputError(
            f"recipe: output_dir '{out}' exists and is not empty; set overwrite_output_dir: true or choose another"
        )


def _explicit_keys(ctx: _Resolution) -> dict:
    """The keys the recipe and the command line set, with their resolved values (what `to_yaml` writes)."""
    explicit = {"trainer": ctx.trainer}
    for key in ctx.merged:
        if key == "trainer":
            continue
        if key in ENTRY_KEYS:  # file paths absolute: the copy runs from anywhere
            explicit[key] = portable_value(key, getattr(ctx.pipeline, key), Path(ctx.path).parent)
            continue
        owner = next(o for o in ctx.parsed if key in {f.name for f in dataclasses.fields(o)})
        value = plain(getattr(owner, key))
        # Keep what the user wrote where TRL normalised it to something that would not parse back ([] for
        # `report_to: none`), and where `check` relaxed a GPU-only precision.
        explicit[key] = ctx.merged[key] if value == [] or (ctx.notes and key in ("bf16", "fp16")) else value
    if ctx.env:
        explicit["env"] = {str(k): str(v) for k, v in ctx.env.items()}
    return explicit


_PPO_ONLY = {
    f.name: f for f in dataclasses.fields(PipelineArguments)
    if f.name.startswith(("value_", "ptx_")) or f.name in ("shared_base", *ENTRY_KEYS)
}


def default_value_model_path(pipeline, training_args, model_args) -> str:
    """Where a GAE run's value model starts: `value_model_path`, else the reward model, else (reward functions
    only) the policy's own checkpoint, with a fresh one-output head (as verl starts its critic from the actor)."""
    return pipeline.value_model_path or training_args.reward_model_path or model_args.model_name_or_path


# value_<ModelConfig key>s that still apply with a shared base (a fresh value adapter's LoRA settings)
SHARED_BASE_VALUE_KEYS = ("use_peft", "use_rslora", "use_dora")


def resolve_tiny_name(path: str) -> str:
    """``tiny://NAME`` as the directory it stands for (without building it); other paths unchanged."""
    if not path.startswith(TINY_SCHEME):
        return path
    return str(tiny_models_dir() / path[len(TINY_SCHEME):])


def _local_model_config(path: Optional[str]) -> Optional[dict]:
    """A local checkpoint's ``config.json`` (``tiny://`` once built), or None (hub names are not fetched here)."""
    if not path:
        return None
    config = Path(resolve_tiny_name(path)).expanduser() / "config.json"
    try:
        return json.loads(config.read_text()) if config.is_file() else None
    except (OSError, ValueError):
        return None


def tiny_models_dir() -> Path:
    """Where ``tiny://`` models are built: ``$TRL_EXT_TINY_DIR`` or ``~/.cache/trl_ext/tiny-models``."""
    return Path(os.environ.get(TINY_DIR_ENV) or Path.home() / ".cache" / "trl_ext" / "tiny-models")


def shared_value_is_fresh(value_path: Optional[str], policy_path: str) -> bool:
    """With a shared base, `value_model_path` naming the policy's own base means a fresh value adapter and head."""
    from ..models.shared_base import same_model_name

    return bool(value_path) and same_model_name(resolve_tiny_name(value_path), resolve_tiny_name(policy_path))


def _check_shared_base(merged: dict, parsed, model_args, training_args, pipeline) -> None:
    """`shared_base: true`: refuse what cannot share the policy's base, before any model loads."""
    from ..models.shared_base import read_scalar_adapter

    if not model_args.use_peft:
        raise UserInputError(
            "recipe: key 'shared_base' needs use_peft: true (the reward and value adapters sit beside the policy's "
            "LoRA adapter on its base)"
        )
    for prefix, prefixed in (("reward", parsed[4]), ("value", parsed[5])):
        for f in dataclasses.fields(prefixed):
            key, name = f.name, f.name[len(prefix) + 1:]
            if key not in merged:
                continue
            allowed = prefix == "value" and (name.startswith("lora_") or name in SHARED_BASE_VALUE_KEYS)
            if not allowed:
                raise UserInputError(
                    f"recipe: key '{key}' does not apply with shared_base: true (the {prefix} model runs on the "
                    f"policy's base; set '{name}' for the policy instead)"
                )
            if name == "use_peft" and not getattr(prefixed, key):
                raise UserInputError("recipe: key 'value_use_peft' is false, but with shared_base the value model is a "
                                     "LoRA adapter; drop the key")
    policy_base = resolve_tiny_name(model_args.model_name_or_path)
    sources = [("reward_model_path", training_args.reward_model_path)] if training_args.reward_model_path else []
    value_path = pipeline.value_model_path
    if value_path and not shared_value_is_fresh(value_path, model_args.model_name_or_path):
        sources.append(("value_model_path", value_path))
    for key, path in sources:
        if looks_local(path):  # a Hub adapter is checked when it is loaded
            read_scalar_adapter(path, policy_base=policy_base, key=f"recipe: key '{key}':")


def _check_no_value_keys(merged: dict, training_args) -> None:
    """A critic-free `advantage_estimator` loads no value model: a `value_*` key would be silently ignored."""
    for key in merged:
        if key.startswith("value_"):
            raise UserInputError(
                f"recipe: key '{key}' configures the value model, but advantage_estimator "
                f"'{training_args.advantage_estimator}' uses none; remove the key (or use advantage_estimator: gae)"
            )


def _check_ptx(training_args, pipeline: PipelineArguments) -> None:
    coef = getattr(training_args, "ptx_coef", None)
    if pipeline.ptx_dataset_name and coef is None:
        raise UserInputError(
            "recipe: key 'ptx_dataset_name' needs trl_ext.PPOConfig's ptx_coef (PPO-ptx), which this install lacks"
        )
    if coef and coef > 0 and not pipeline.ptx_dataset_name:
        raise UserInputError("recipe: key 'ptx_coef' > 0 needs 'ptx_dataset_name' (the pretraining-mix text)")
    if pipeline.ptx_dataset_name and not coef:
        raise UserInputError("recipe: key 'ptx_dataset_name' is set but 'ptx_coef' is 0; set ptx_coef > 0")
    if pipeline.ptx_dataset_name:
        _check_path("ptx_dataset_name", pipeline.ptx_dataset_name)
