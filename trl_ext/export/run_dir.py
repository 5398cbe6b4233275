"""What a trl-ext output directory holds, and loading each of its models as a plain ``transformers`` model. How it
works: docs/internals-recipes.md#run-directories."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserInputError

RECIPE_FILENAME = "trl_ext_recipe.yaml"
EXPORT_FILENAME = "trl_ext_export.json"
VALUE_MODEL_DIR = "value_model"  # trl_ext.ppo.trainer.VALUE_MODEL_DIR (not imported: that pulls in TRL's trainer)
ROLES = ("policy", "reward", "value")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class ModelSource:
    """Where one role's weights are.

    Attributes:
        role: ``policy``, ``reward`` or ``value``.
        path: a full model directory (``config.json``) or a LoRA adapter directory (``adapter_config.json``).
        scalar: a reward/value model (``*ForSequenceClassification``, one output) rather than a causal LM.
        base: for an adapter, the base model it goes on (a directory or a Hub id); ``None`` for a full model.
    """

    role: str
    path: Path
    scalar: bool
    base: str | None = None

    @property
    def adapter(self) -> bool:
        return self.base is not None


@dataclass
class Run:
    """A trl-ext run, checkpoint or export, opened by :func:`open_run`."""

    path: Path
    trainer: str
    """``sft``, ``reward``, ``dpo``, ``ppo``, or ``model`` for an exported or plain model directory."""
    roles: dict[str, ModelSource]
    recipe: dict = field(default_factory=dict)
    """The resolved recipe the run was trained with (empty when it has none)."""
    tokenizer_dir: Path | None = None

    @property
    def dtype(self) -> str:
        """The dtype to load in by default: the recipe's ``dtype`` (TRL's ``ModelConfig`` default, ``float32``, when
        the recipe does not set it); for an export or a model directory, the saved weights' own (``auto``)."""
        if self.trainer == "model":
            return "auto"
        return str(self.recipe.get("dtype") or "float32")

    @property
    def quantized(self) -> str | None:
        """``"4-bit"`` or ``"8-bit"`` when the run's trained model was loaded quantized."""
        return "4-bit" if self.recipe.get("load_in_4bit") else "8-bit" if self.recipe.get("load_in_8bit") else None

    def source(self, role: str) -> ModelSource:
        if role not in self.roles:
            have = ", ".join(self.roles) or "none"
            raise UserInputError(f"{self.path}: this {self.trainer} run has no {role} model (it has: {have})")
        return self.roles[role]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: cannot read it: {err}") from None


def _read_recipe(path: Path) -> dict:
    import yaml

    try:
        recipe = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise UserInputError(f"{path}: cannot read the run's recipe: {str(err).splitlines()[0]}") from None
    if not isinstance(recipe, dict) or recipe.get("trainer") not in ("sft", "reward", "dpo", "ppo"):
        raise UserInputError(f"{path}: not a trl-ext recipe (no trainer key)")
    return recipe


def _resolve_name(name: str) -> str:
    """``tiny://...`` to its directory; other names unchanged."""
    from ..recipe_loader.pipeline import resolve_model_path

    return resolve_model_path(name)


def _existing_base(recorded: str | None, fallbacks: list[str | None], adapter_dir: Path, base: str | None) -> str:
    """``base`` (``--base``) if given, else the first of the adapter's recorded base and ``fallbacks`` that exists
    (local) or is a Hub id; refuses a base that is nowhere."""
    from ..models.paths import looks_local

    if base:
        resolved = os.path.expanduser(_resolve_name(base))
        if looks_local(resolved) and not os.path.isdir(resolved):
            raise UserInputError(f"--base {base}: no such directory")
        return resolved
    names = [c for c in [recorded, *fallbacks] if c]
    if not names:
        raise UserInputError(f"{adapter_dir}: adapter_config.json names no base_model_name_or_path")
    for name in names:
        resolved = _resolve_name(name)
        if not looks_local(resolved) or os.path.isdir(os.path.expanduser(resolved)):
            return resolved
    raise UserInputError(
        f"{adapter_dir}: its base model '{names[0]}' (base_model_name_or_path in adapter_config.json) does not exist; "
        "put the base model back there, or give it with --base"
    )


def model_source(role: str, path: Path, *, fallback_bases: tuple = (), base: str | None = None) -> ModelSource:
    """The :class:`ModelSource` of a model directory, from its files (no weights read). For an adapter, its base is
    ``base`` if given, else the base its ``adapter_config.json`` records, else the first of ``fallback_bases`` that
    exists."""
    path = Path(os.path.expanduser(str(path)))
    config_file, adapter_file = path / "config.json", path / "adapter_config.json"
    if config_file.is_file():
        config = _read_json(config_file)
        scalar = any(a.endswith("ForSequenceClassification") for a in config.get("architectures") or [])
        if scalar:
            labels = config.get("num_labels", len(config.get("id2label") or {}) or 2)
            if labels != 1:
                raise UserInputError(
                    f"{path}: its score head has {labels} outputs; a reward/value model has exactly 1 (train it "
                    "with a reward recipe, or with reinit_score_head: true)"
                )
        if not any((path / n).exists() for n in ("model.safetensors", "model.safetensors.index.json",
                                                 "pytorch_model.bin", "pytorch_model.bin.index.json")):
            raise UserInputError(f"{path}: config.json but no model weights")
        return ModelSource(role, path, scalar)
    if adapter_file.is_file():
        config = _read_json(adapter_file)
        scalar = config.get("task_type") == "SEQ_CLS"
        if scalar:
            _check_adapter_head(path)
        found = _existing_base(config.get("base_model_name_or_path"), list(fallback_bases), path, base)
        return ModelSource(role, path, scalar, base=found)
    raise UserInputError(f"{path}: no model here (neither config.json nor adapter_config.json)")


def _check_adapter_head(path: Path) -> None:
    """Refuse a reward/value adapter whose saved score head has several outputs (read from the file header)."""
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        raise UserInputError(f"{path}: no adapter_model.safetensors in the adapter directory")
    from safetensors import safe_open

    with safe_open(str(weights), framework="pt") as f:
        for name in f.keys():
            if ".lora_" not in name and name.rsplit(".", 2)[-2:] in (["score", "weight"], ["classifier", "weight"]):
                outputs = f.get_slice(name).get_shape()[0]
                if outputs != 1:
                    raise UserInputError(
                        f"{path}: its score head has {outputs} outputs; a reward/value model has exactly 1"
                    )


def _kind_from_files(path: Path) -> str:
    """The trainer of a run without a recipe, from its files."""
    if (path / VALUE_MODEL_DIR).is_dir() or any(p.name.startswith("trl_ext_ppo_state") for p in path.iterdir()):
        return "ppo"
    if (path / "config.json").is_file():
        archs = _read_json(path / "config.json").get("architectures") or []
        return "reward" if any(a.endswith("ForSequenceClassification") for a in archs) else "sft"
    if (path / "adapter_config.json").is_file():
        return "reward" if _read_json(path / "adapter_config.json").get("task_type") == "SEQ_CLS" else "sft"
    raise UserInputError(f"{path}: a checkpoint folder without a model (no config.json or adapter_config.json)")


def open_run(path: str | os.PathLike, *, models_too: bool = False, base: str | None = None) -> Run:
    """Open a trl-ext run or checkpoint (and, with ``models_too``, an export or a plain model directory).

    ``base`` replaces the recorded base of the adapters trained on the policy's base (the policy's; the reward and
    value adapters of a shared-base PPO run, or of a reward run): for a run whose base model has moved.

    Raises:
        UserInputError: ``path`` is not a directory, not a trl-ext run (no ``trl_ext_recipe.yaml``, not a
            checkpoint), a model it names is missing, or a score head has several outputs.
    """
    raw = str(path)
    path = Path(os.path.expanduser(raw))
    if not path.is_dir():
        raise UserInputError(f"{raw}: no such directory")
    recipe_file = next((p / RECIPE_FILENAME for p in (path, path.parent) if (p / RECIPE_FILENAME).is_file()), None)
    is_checkpoint = (path / "trainer_state.json").is_file()
    if recipe_file is not None and (recipe_file.parent == path or is_checkpoint):
        recipe = _read_recipe(recipe_file)
        trainer = recipe["trainer"]
    elif is_checkpoint:
        recipe, trainer = {}, _kind_from_files(path)
    elif models_too:
        return _open_models(path, raw)
    else:
        raise UserInputError(
            f"{raw}: not a trl-ext run (no {RECIPE_FILENAME}) or checkpoint (no trainer_state.json): give the "
            "output_dir of `trl-ext train` or one of its checkpoint-N folders"
        )
    own = (recipe.get("model_name_or_path"),)  # the trained model's base, as the recipe names it
    roles: dict[str, ModelSource] = {}
    if trainer == "reward":
        roles["reward"] = model_source("reward", path, fallback_bases=own, base=base)
    else:
        roles["policy"] = model_source("policy", path, fallback_bases=own, base=base)
    if trainer == "ppo":
        shared = bool(recipe.get("shared_base"))
        reward_path = recipe.get("reward_model_path")
        if (path / VALUE_MODEL_DIR).is_dir():
            # a separate LoRA value model sits on the value/reward checkpoint, a shared-base one on the policy's base
            value_base = own if shared else (recipe.get("value_model_path") or reward_path,)
            roles["value"] = model_source("value", path / VALUE_MODEL_DIR, fallback_bases=value_base,
                                          base=base if shared else None)
        if reward_path and os.path.isdir(os.path.expanduser(_resolve_name(reward_path))):
            roles["reward"] = model_source("reward", Path(_resolve_name(reward_path)),
                                           fallback_bases=own if shared else (), base=base if shared else None)
    tokenizer_dir = path if (path / "tokenizer_config.json").is_file() else None
    if tokenizer_dir is None and recipe_file is not None and (recipe_file.parent / "tokenizer_config.json").is_file():
        tokenizer_dir = recipe_file.parent
    return Run(path=path, trainer=trainer, roles=roles, recipe=recipe, tokenizer_dir=tokenizer_dir)


def _open_models(path: Path, raw: str) -> Run:
    """An export of ``trl-ext export`` (its role folders) or one plain model directory."""
    export_file = path / EXPORT_FILENAME
    if export_file.is_file():
        info = _read_json(export_file)
        roles = {role: model_source(role, path / role) for role in info.get("roles", {}) if (path / role).is_dir()}
        return Run(path=path, trainer="model", roles=roles, recipe=info.get("recipe") or {})
    if not ((path / "config.json").is_file() or (path / "adapter_config.json").is_file()):
        raise UserInputError(
            f"{raw}: not a trl-ext run, checkpoint or export, nor a model directory (no {RECIPE_FILENAME}, "
            "trainer_state.json, trl_ext_export.json, config.json or adapter_config.json)"
        )
    probe = model_source("model", path)
    role = "reward" if probe.scalar else "policy"
    recipe = {}
    parent_info = path.parent / EXPORT_FILENAME
    if parent_info.is_file():  # one role folder of an export: keep the run's recipe (sampling settings)
        recipe = _read_json(parent_info).get("recipe") or {}
    tokenizer_dir = path if (path / "tokenizer_config.json").is_file() else None
    return Run(path=path, trainer="model", roles={role: model_source(role, path)}, recipe=recipe,
               tokenizer_dir=tokenizer_dir)


# --------------------------------------------------------------------------------------------------------------
# Loading


def load_run_tokenizer(run: Run, source: ModelSource | None = None):
    """The run's tokenizer (saved in the run), else the model's or its base's."""
    from trl import ModelConfig

    from ..models.loaders import load_tokenizer

    from ..models.paths import looks_local

    candidates = [source.path if source else None, run.tokenizer_dir, source.base if source else None]
    for candidate in candidates:
        if candidate is None:
            continue
        if (Path(candidate) / "tokenizer_config.json").is_file() or not looks_local(str(candidate)):
            return load_tokenizer(ModelConfig(model_name_or_path=str(candidate)))
    raise UserInputError(f"{run.path}: no tokenizer in the run or beside its model")


def _torch_dtype(name: str):
    import torch

    if name not in DTYPES + ("auto",):
        raise UserInputError(f"--dtype {name!r}: use one of {', '.join(DTYPES)} or auto")
    return getattr(torch, name) if name != "auto" else None


def load_merged(source: ModelSource, *, dtype: str, tokenizer=None):
    """One role as a plain ``transformers`` model: ``*ForCausalLM`` or a one-output ``*ForSequenceClassification``,
    in ``dtype``, with a LoRA adapter merged (in float32) into its unquantized base. ``dtype="auto"``: the
    checkpoint's (for an adapter, its base's) own dtype. Frozen and in eval mode."""
    import torch
    from trl import ModelConfig

    from ..models.loaders import load_policy, load_scalar_model

    target = _torch_dtype(dtype)
    loader = load_scalar_model if source.scalar else load_policy
    if not source.adapter:
        model = loader(ModelConfig(model_name_or_path=str(source.path), dtype=dtype), tokenizer=tokenizer)
    else:
        from peft import PeftModel

        model = loader(ModelConfig(model_name_or_path=source.base, dtype="float32"), tokenizer=tokenizer)
        if target is None:  # auto: the base checkpoint's own dtype
            from transformers import AutoConfig

            saved = getattr(AutoConfig.from_pretrained(source.base), "dtype", None) or torch.float32
            target = getattr(torch, saved) if isinstance(saved, str) else saved
        model = PeftModel.from_pretrained(model, str(source.path)).merge_and_unload()
        model = model.to(target)
    model.requires_grad_(False)
    return model.eval()


def quiet_libraries() -> None:
    """Keep the commands' console output to their results: no load reports, progress bars or deprecation notes."""
    import warnings

    import datasets
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="peft")
