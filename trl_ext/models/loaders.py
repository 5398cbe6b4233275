"""Load the tokenizer, the policy and the scalar-headed (reward/value) model from a ``trl.ModelConfig``. How it
works: docs/internals.md#model-loaders."""

from __future__ import annotations

import contextlib
import copy
import os
from typing import TYPE_CHECKING, Any

from ..errors import UserInputError
from .dtypes import cast_inputs_to_weight_dtype, float32_trainable_parameters
from .lora import check_lora_targets, lora_config_for
from .paths import looks_local
from .quantization import (
    check_quantization_request,
    disable_bnb_cpu_weight_repacking,
    kbit_device_map,
    prepare_quantized_model,
    quantization_config_for,
)

if TYPE_CHECKING:  # pragma: no cover
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["load_tokenizer", "load_policy", "load_scalar_model", "set_pad_token"]

_DTYPES = ("auto", "bfloat16", "float16", "float32")


# --------------------------------------------------------------------------------------------------------------
# Paths and configs


def _resolve_model_path(name_or_path: str | os.PathLike | None) -> str:
    """The checkpoint location to load from; refuses a local path that does not exist, naming it."""
    if name_or_path is None or str(name_or_path).strip() == "":
        raise UserInputError("model_name_or_path is not set: give a checkpoint directory or a Hub model id")
    raw = os.fspath(name_or_path)
    path = os.path.expanduser(raw)
    if os.path.isdir(path):
        return path
    if os.path.exists(path):
        raise UserInputError(f"model_name_or_path {raw!r} is a file; it must be a checkpoint directory")
    if looks_local(raw):
        raise UserInputError(f"model_name_or_path {raw!r}: no such directory (resolved to {os.path.abspath(path)})")
    return raw  # a Hub id; loading its config tells whether it exists


def _load_checkpoint_config(path: str, *, revision: str | None, trust_remote_code: bool, **config_kwargs):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            path, revision=revision, trust_remote_code=trust_remote_code, **config_kwargs
        )
    except (OSError, ValueError) as exc:
        first_line = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        if os.path.isdir(path):
            problem = f"cannot read the config.json of this local directory: {first_line}"
        else:
            problem = f"no such local directory, and loading it as a Hub model id failed: {first_line}"
        raise UserInputError(f"model_name_or_path {path!r}: {problem}") from exc


def _torch_dtype(dtype):
    import torch

    if dtype is None or dtype == "auto" or isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise UserInputError(f"dtype {dtype!r} is not supported: use one of {', '.join(_DTYPES)}")
    return getattr(torch, dtype)


class _Plan:
    """What a loader will do, worked out from ``model_args``, the kwargs and the checkpoint config."""

    def __init__(self, model_args, kwargs: dict[str, Any]):
        self.kwargs = dict(kwargs)
        self.path = _resolve_model_path(model_args.model_name_or_path)
        self.revision = self.kwargs.pop("revision", model_args.model_revision)
        self.trust_remote_code = self.kwargs.pop(
            "trust_remote_code", getattr(model_args, "trust_remote_code", False)
        )
        self.dtype = _torch_dtype(model_args.dtype)
        check_quantization_request(model_args)
        self.config = _load_checkpoint_config(
            self.path, revision=self.revision, trust_remote_code=self.trust_remote_code
        )
        self.quantization_config = quantization_config_for(model_args, self.config)

    def init_kwargs(self, model_args, **extra) -> dict[str, Any]:
        """``from_pretrained`` kwargs; the caller's kwargs win."""
        init: dict[str, Any] = dict(revision=self.revision, trust_remote_code=self.trust_remote_code, **extra)
        if self.dtype is not None:
            init["dtype"] = self.dtype
        if model_args.attn_implementation is not None:
            init["attn_implementation"] = model_args.attn_implementation
        if self.quantization_config is not None:
            init["quantization_config"] = self.quantization_config
            device_map = kbit_device_map()
            if device_map is not None:
                init["device_map"] = device_map
        init.update(self.kwargs)
        return init


def _empty_skeleton(auto_class, config, trust_remote_code: bool):
    """The model built on the meta device (no memory, no weights), to check module names; ``None`` if it fails."""
    try:
        from accelerate import init_empty_weights

        with init_empty_weights():
            return auto_class.from_config(config, trust_remote_code=trust_remote_code)
    except Exception:  # exotic remote code; the check then runs on the loaded model
        return None


# --------------------------------------------------------------------------------------------------------------
# Tokenizer and pad token


def set_pad_token(tokenizer=None, model=None) -> None:
    """Give ``tokenizer`` and ``model`` a pad token: the tokenizer's pad (else eos) token, else the model's eos.

    The tokenizer's pad token, when missing, becomes its eos token. The model config's (and generation
    config's) ``pad_token_id`` becomes the tokenizer's pad id, or without a tokenizer, when missing, the
    config's first eos id. Sequence-classification models need it to find each sequence's last token.
    """
    pad_id = None
    if tokenizer is not None:
        if tokenizer.pad_token is None:
            if tokenizer.eos_token is None:
                raise UserInputError(
                    "the tokenizer has neither a pad token nor an eos token: add a pad token to the tokenizer"
                )
            tokenizer.pad_token = tokenizer.eos_token
        pad_id = tokenizer.pad_token_id
    if model is None:
        return
    config = model.config
    if pad_id is None:
        pad_id = config.pad_token_id
    if pad_id is None:
        eos = config.eos_token_id
        pad_id = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
    if pad_id is None:
        return
    config.pad_token_id = pad_id
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and generation_config.pad_token_id is None:
        generation_config.pad_token_id = pad_id


def load_tokenizer(model_args, **kwargs) -> PreTrainedTokenizerBase:
    """``AutoTokenizer`` for ``model_args.model_name_or_path`` (at ``model_revision``), with a pad token.

    A missing pad token is set to the eos token. ``kwargs`` go to ``AutoTokenizer.from_pretrained`` and win
    over the values taken from ``model_args`` (``revision``, ``trust_remote_code``).
    """
    from transformers import AutoTokenizer

    path = _resolve_model_path(model_args.model_name_or_path)
    kwargs.setdefault("revision", model_args.model_revision)
    kwargs.setdefault("trust_remote_code", getattr(model_args, "trust_remote_code", False))
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
    except OSError as exc:
        first_line = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise UserInputError(f"model_name_or_path {path!r}: cannot load a tokenizer: {first_line}") from exc
    set_pad_token(tokenizer)
    return tokenizer


# --------------------------------------------------------------------------------------------------------------
# Models


def _is_quantized(model) -> bool:
    """Loaded quantized: from the ModelConfig flags, a ``quantization_config`` kwarg, or a pre-quantized checkpoint."""
    return bool(
        getattr(model, "is_quantized", False)
        or getattr(model, "is_loaded_in_4bit", False)
        or getattr(model, "is_loaded_in_8bit", False)
    )


def _finish(model, model_args, lora_config, *, gradient_checkpointing, gradient_checkpointing_kwargs,
            upcast_non_quantized=True):
    """Quantized: peft's k-bit preparation (with or without its float32 upcast) + the CPU gradient fix; then the LoRA
    adapter (trainable parameters in float32, see :mod:`trl_ext.models.dtypes`), or full fine-tuning."""
    if gradient_checkpointing_kwargs is None:
        gradient_checkpointing_kwargs = {"use_reentrant": False}  # torch's recommendation; no input-grad hack needed
    if _is_quantized(model):
        if gradient_checkpointing is None:
            gradient_checkpointing = bool(model_args.use_peft)  # QLoRA practice, peft's default
        model = prepare_quantized_model(
            model,
            gradient_checkpointing=gradient_checkpointing,
            gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
            upcast_non_quantized=upcast_non_quantized,
        )
    elif gradient_checkpointing:
        # transformers 5.23 renamed gradient_checkpointing_enable (deprecated) to activation_checkpointing_enable
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=gradient_checkpointing_kwargs)
        else:  # pragma: no cover - transformers < 5.23
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)
        if lora_config is not None:
            model.enable_input_require_grads()
    if lora_config is None:
        return model
    check_lora_targets(model, lora_config)
    from peft import get_peft_model

    model = get_peft_model(model, lora_config)
    disable_bnb_cpu_weight_repacking(model)  # idempotent; covers layers wrapped by peft
    float32_trainable_parameters(model)  # peft makes LoRA weights float32, not the heads it copies from the base
    return model


def load_policy(
    model_args,
    *,
    tokenizer=None,
    gradient_checkpointing: bool | None = None,
    gradient_checkpointing_kwargs: dict | None = None,
    upcast_non_quantized: bool = True,
    **kwargs,
) -> PreTrainedModel:
    """The policy: ``AutoModelForCausalLM`` from a ``trl.ModelConfig``, optionally quantized, optionally with LoRA.

    ``model_args`` fields used: ``model_name_or_path``, ``model_revision``, ``dtype``, ``attn_implementation``;
    ``load_in_4bit``/``load_in_8bit``, ``bnb_4bit_quant_type``, ``use_bnb_nested_quant``,
    ``bnb_4bit_quant_storage`` (bitsandbytes config from TRL's ``get_quantization_config``; the 4-bit compute
    dtype is ``dtype``, or the checkpoint's dtype for ``"auto"``); ``use_peft`` and the ``lora_*`` fields
    (TRL's ``get_peft_config``, task type ``CAUSAL_LM``).

    Args:
        model_args: a ``trl.ModelConfig``.
        tokenizer: if given, its pad token (set to eos when missing) becomes the model's ``pad_token_id``.
        gradient_checkpointing: quantized models: passed to peft's ``prepare_model_for_kbit_training``
            (default: on when ``use_peft``); others: ``True`` enables it, ``None``/``False`` leave it to the
            trainer's ``gradient_checkpointing`` argument.
        gradient_checkpointing_kwargs: passed with it; default ``{"use_reentrant": False}``.
        upcast_non_quantized: quantized models: ``True`` (default) makes the weights that are not quantized
            (embeddings, LM head, norms) float32, as peft's ``prepare_model_for_kbit_training`` does; ``False`` keeps
            them in ``dtype`` (the 4-bit compute dtype): a bfloat16/float16 residual stream, less memory, faster
            (recipe key ``upcast_non_quantized``; see ``docs/dtypes.md``). LoRA weights are float32 either way.
        **kwargs: passed to ``from_pretrained``, overriding what the loader derived (``dtype``, ``device_map``,
            ``quantization_config``, ``revision``, ``trust_remote_code``, ...).

    Returns:
        A ``transformers`` model, or a ``peft.PeftModel`` when ``use_peft``. Quantized 4-bit layers have
        :func:`~trl_ext.models.quantization.disable_bnb_cpu_weight_repacking` applied.

    Raises:
        UserInputError: missing path, both 4- and 8-bit, bitsandbytes unusable, unknown LoRA targets.
    """
    from transformers import AutoModelForCausalLM

    plan = _Plan(model_args, kwargs)
    lora_config = lora_config_for(model_args, task_type="CAUSAL_LM")
    if lora_config is not None:
        skeleton = _empty_skeleton(AutoModelForCausalLM, plan.config, plan.trust_remote_code)
        if skeleton is not None:
            check_lora_targets(skeleton, lora_config)
    model = AutoModelForCausalLM.from_pretrained(plan.path, **plan.init_kwargs(model_args))
    set_pad_token(tokenizer, model)
    return _finish(model, model_args, lora_config, gradient_checkpointing=gradient_checkpointing,
                   gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
                   upcast_non_quantized=upcast_non_quantized)


def _is_classifier_checkpoint(config) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or []))


def score_head_name(model) -> str:
    """Name of the classification head of a ``*ForSequenceClassification`` model (``"score"`` for decoder LMs)."""
    for name in ("score", "classifier"):
        if hasattr(model, name):
            return name
    raise UserInputError(
        f"{type(model).__name__} has no 'score' or 'classifier' head: trl-ext cannot use it as a scalar model"
    )


def _new_scalar_head(model) -> None:
    """Replace the classification head by a freshly initialised 1-output linear layer; set ``num_labels=1``."""
    import torch

    name = score_head_name(model)
    old = getattr(model, name)
    if type(old) is not torch.nn.Linear:
        raise UserInputError(
            f"reinit_head: the head {name!r} is a {type(old).__name__}, not a plain Linear layer; cannot replace it"
        )
    new = torch.nn.Linear(
        old.in_features, 1, bias=old.bias is not None, dtype=old.weight.dtype, device=old.weight.device
    )
    std = getattr(model.config, "initializer_range", 0.02)
    with torch.no_grad():
        new.weight.normal_(mean=0.0, std=std)
        if new.bias is not None:
            new.bias.zero_()
    setattr(model, name, new)
    model.config.num_labels = 1  # also resets id2label/label2id to one label
    if hasattr(model, "num_labels"):
        model.num_labels = 1


@contextlib.contextmanager
def _quiet_causal_to_seqcls_load():
    """TRL's scoped silencing of the expected 'score missing / lm_head unexpected' load report."""
    try:
        from ..trl_internals import suppress_seqcls_warning
    except ImportError:  # pragma: no cover - older/newer TRL
        yield
        return
    with suppress_seqcls_warning():
        yield


def _is_centred_checkpoint(config) -> bool:
    """Whether the checkpoint was saved by reward centering (see :mod:`trl_ext.models.biased_score_model`)."""
    from .biased_score_model import AUTO_MAP

    auto_map = getattr(config, "auto_map", None) or {}
    return auto_map.get("AutoModelForSequenceClassification") == AUTO_MAP["AutoModelForSequenceClassification"]


def _check_scalar_lora_targets(config, lora_config, trust_remote_code: bool) -> None:
    """LoRA targets against a one-output sequence classifier of ``config`` built without weights."""
    from transformers import AutoModelForSequenceClassification

    skeleton_config = copy.deepcopy(config)
    skeleton_config.num_labels = 1
    skeleton = _empty_skeleton(AutoModelForSequenceClassification, skeleton_config, trust_remote_code)
    if skeleton is not None:
        check_lora_targets(skeleton, lora_config)


def _scalar_model_class(config, init: dict):
    """The class that loads a scalar checkpoint (``init``, its ``from_pretrained`` keywords, adjusted in place).

    A checkpoint saved by reward centering has a biased score head; its loader is our own module, so it is loaded
    from the package rather than asking the user for trust_remote_code (which would run the checkpoint's copy)."""
    from transformers import AutoModelForSequenceClassification

    if not _is_centred_checkpoint(config):
        return AutoModelForSequenceClassification
    from .biased_score_model import BiasedScoreForSequenceClassification

    init.pop("num_labels", None)
    init.pop("trust_remote_code", None)
    init["config"] = config
    return BiasedScoreForSequenceClassification


def load_scalar_model(
    model_args,
    *,
    reinit_head: bool = False,
    tokenizer=None,
    gradient_checkpointing: bool | None = None,
    gradient_checkpointing_kwargs: dict | None = None,
    upcast_non_quantized: bool = True,
    **kwargs,
) -> PreTrainedModel:
    """A reward or value model: ``AutoModelForSequenceClassification`` with exactly one output (``num_labels=1``).

    Loads from a reward checkpoint (its 1-output head is kept) or from a plain causal-LM checkpoint (its
    ``lm_head`` is dropped and a new 1-output ``score`` head is initialised from torch's global RNG: call
    ``transformers.set_seed`` first for reproducibility). Uses the same ``model_args`` fields as
    :func:`load_policy`. With ``use_peft`` the LoRA task type is ``SEQ_CLS`` and the score head is in
    ``modules_to_save``: it is trained in full and saved with the adapter (TRL #1379). Quantized without
    LoRA, the model is frozen (inference only, e.g. a reward model scoring PPO rollouts).

    Args:
        model_args: a ``trl.ModelConfig``.
        reinit_head: drop the checkpoint's classification head and start a new 1-output head. Required for a
            checkpoint whose head has several outputs (``num_labels > 1``, e.g. a 2-class classifier), which is
            otherwise refused; recipes expose it as ``reinit_score_head``.
        tokenizer: if given, its pad token (set to eos when missing) becomes the model's ``pad_token_id``;
            otherwise a missing ``pad_token_id`` is set from the config's eos id.
        gradient_checkpointing, gradient_checkpointing_kwargs, upcast_non_quantized: as in :func:`load_policy`.
        **kwargs: passed to ``from_pretrained``, overriding what the loader derived. ``num_labels`` other than 1
            is refused.

    Raises:
        UserInputError: as :func:`load_policy`, and for a multi-output head without ``reinit_head``.
    """
    if kwargs.get("num_labels", 1) != 1:
        raise UserInputError(
            f"num_labels={kwargs['num_labels']}: a scalar (reward/value) model has exactly one output; drop num_labels"
        )
    kwargs.pop("num_labels", None)
    plan = _Plan(model_args, kwargs)
    config = plan.config
    from_classifier = _is_classifier_checkpoint(config)
    if from_classifier and config.num_labels != 1 and not reinit_head:
        raise UserInputError(
            f"model_name_or_path {plan.path!r} has a classification head with {config.num_labels} outputs, but a "
            "reward/value model needs exactly 1: pass reinit_head=True (recipe key reinit_score_head: true) "
            "to replace it with a new 1-output head"
        )
    # A multi-output checkpoint keeps its head shape while loading (no size mismatch); it is replaced right after.
    keep_shape = from_classifier and config.num_labels != 1
    labels = {} if keep_shape else {"num_labels": 1}

    lora_config = lora_config_for(model_args, task_type="SEQ_CLS")
    if lora_config is not None:  # before any weight is read
        _check_scalar_lora_targets(config, lora_config, plan.trust_remote_code)
    init = plan.init_kwargs(model_args, **labels)
    model_class = _scalar_model_class(config, init)
    with contextlib.nullcontext() if from_classifier else _quiet_causal_to_seqcls_load():
        model = model_class.from_pretrained(plan.path, **init)
    if reinit_head and from_classifier:
        _new_scalar_head(model)
    head = score_head_name(model)
    cast_inputs_to_weight_dtype(getattr(model, head))  # a float32 head reads a bfloat16 residual stream
    if getattr(model, head).out_features != 1 or model.config.num_labels != 1:  # pragma: no cover - safety net
        raise UserInputError(f"model_name_or_path {plan.path!r}: loaded head {head!r} does not have exactly 1 output")
    set_pad_token(tokenizer, model)
    if lora_config is not None and head not in ("score", "classifier"):  # peft's SEQ_CLS saves those two itself
        lora_config = lora_config_for(model_args, task_type="SEQ_CLS", modules_to_save=[head])
    return _finish(model, model_args, lora_config, gradient_checkpointing=gradient_checkpointing,
                   gradient_checkpointing_kwargs=gradient_checkpointing_kwargs,
                   upcast_non_quantized=upcast_non_quantized)
