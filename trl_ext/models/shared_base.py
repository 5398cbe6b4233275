"""One base model for four PPO roles: the reward and value models as LoRA adapters, each with its own score head, on
the policy's own (4-bit, 8-bit or full-precision) base; the reference is that base with adapters disabled. How it
works: docs/internals.md#shared-base."""

from __future__ import annotations

import functools
import json
import os
import re
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..errors import UserInputError

__all__ = [
    "REWARD_ADAPTER",
    "VALUE_ADAPTER",
    "AdapterSwitch",
    "ScalarAdapterSource",
    "SharedBaseScalarModel",
    "adapter_switch",
    "add_scalar_adapter",
    "check_same_base",
    "policy_adapter_names",
    "read_scalar_adapter",
    "same_model_name",
    "saving_policy_adapters_only",
    "scalar_adapter_names",
]

REWARD_ADAPTER = "reward"
"""Name of the reward model's adapter on the policy's base."""
VALUE_ADAPTER = "value"
"""Name of the value model's adapter on the policy's base."""

_SCALAR_ADAPTERS_ATTR = "_trl_ext_scalar_adapters"  # on the policy PeftModel: {adapter name: trainable}
_SWITCH_ATTR = "_trl_ext_adapter_switch"
_PROTECTED_ATTR = "_trl_ext_adapter_aware"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


# --------------------------------------------------------------------------------------------------------------
# Which adapter runs


def _adapter_layers(module: torch.nn.Module) -> list[torch.nn.Module]:
    """peft's LoRA layers and auxiliary wrappers (``modules_to_save``) in ``module``: what an adapter switch sets."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    return [m for m in module.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]


AdapterState = tuple[tuple[str, ...], bool]
"""``(active adapter names, adapters disabled)`` of a set of adapter layers."""


def _read_state(layer) -> AdapterState:
    active = layer.active_adapter
    return (tuple([active] if isinstance(active, str) else active), bool(layer.disable_adapters))


def _write_state(layers, state: AdapterState) -> None:
    from peft.utils.other import AuxiliaryTrainingWrapper

    names, disabled = state
    for layer in layers:
        # the attributes behind peft's read-only properties; peft's own setters would rewrite requires_grad. Plain
        # attributes: written straight into the instance, as nn.Module.__setattr__ ends up doing after checking that
        # the value is no parameter, buffer or module (those checks made a switch 6 ms at 168 LoRA layers)
        attributes = vars(layer)
        attributes["_active_adapter"] = names[0] if isinstance(layer, AuxiliaryTrainingWrapper) else list(names)
        attributes["_disable_adapters"] = disabled


@contextmanager
def _state(layers, state: AdapterState):
    """Give ``layers`` ``state`` inside the block; restore what they had after (no-op if it is already theirs)."""
    if not layers or _read_state(layers[0]) == state:
        yield
        return
    previous = _read_state(layers[0])
    _write_state(layers, state)
    try:
        yield
    finally:
        _write_state(layers, previous)


class AdapterSwitch:
    """Activates one adapter of a ``PeftModel`` (or none: the base model) without changing any ``requires_grad``.

    Get it with :func:`adapter_switch` (one per model). ``with switch.use("value"): ...`` runs the block with the
    value adapter active; ``switch.use(None)`` with every adapter disabled (the reference). The state before the
    block is restored after it.
    """

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.refresh()

    def refresh(self) -> None:
        """Re-collect the adapter layers (after adapters were added to new modules)."""
        self.layers = _adapter_layers(self.model)
        self.version = getattr(self, "version", 0) + 1

    def state(self) -> AdapterState:
        return _read_state(self.layers[0])

    @contextmanager
    def use(self, adapter: str | None):
        """The block runs with only ``adapter`` active (``None``: adapters disabled)."""
        names = self.state()[0] if adapter is None else (adapter,)
        with _state(self.layers, (names, adapter is None)):
            yield

    def protect_checkpointing(self) -> int:
        """Make every activation-checkpointed layer of the model re-run its backward recomputation with the adapter
        that was active during its forward (see the module docstring). Idempotent and cheap; call it before each
        training forward that switches adapters (:class:`SharedBaseScalarModel` does). Returns the number of
        checkpointed layers.

        Raises:
            UserInputError: checkpointing is reentrant (no hook to restore the adapter) or not transformers' own.
        """
        count = 0
        for layer in self._checkpointed_layers():
            func = layer._gradient_checkpointing_func
            count += 1
            if getattr(func, _PROTECTED_ATTR, False):
                continue
            if not isinstance(func, functools.partial):
                raise UserInputError(
                    "shared base: the model's gradient checkpointing function is not transformers' own; enable it "
                    "with gradient_checkpointing_kwargs={'use_reentrant': False}"
                )
            keywords = dict(func.keywords)
            if keywords.get("use_reentrant", True) is not False:
                raise UserInputError(
                    "shared base: reentrant gradient checkpointing recomputes layers with whichever adapter is active "
                    "during the backward pass (wrong gradients); set gradient_checkpointing_kwargs "
                    "{'use_reentrant': false}"
                )
            if "context_fn" in keywords:
                raise UserInputError("shared base: gradient_checkpointing_kwargs may not set a context_fn")
            keywords["context_fn"] = _restoring_context_fn(self, layer)
            protected = functools.partial(func.func, *func.args, **keywords)
            setattr(protected, _PROTECTED_ATTR, True)
            layer._gradient_checkpointing_func = protected
        return count

    def _checkpointed_layers(self):
        if not hasattr(self, "_checkpointable"):
            self._checkpointable = [m for m in self.model.modules() if hasattr(m, "gradient_checkpointing")]
        return [m for m in self._checkpointable
                if m.gradient_checkpointing and getattr(m, "_gradient_checkpointing_func", None) is not None]


def _restoring_context_fn(switch: AdapterSwitch, layer: torch.nn.Module):
    """``context_fn`` for ``torch.utils.checkpoint``: at recomputation, ``layer``'s adapters as during its forward."""
    cache = {"version": None, "layers": []}

    def context_fn():
        if cache["version"] != switch.version:  # adapters were added since: collect the layer's adapter layers again
            cache["version"], cache["layers"] = switch.version, _adapter_layers(layer)
        layers = cache["layers"]
        if not layers:
            return nullcontext(), nullcontext()
        return nullcontext(), _state(layers, _read_state(layers[0]))  # the state is read now, in the forward

    return context_fn


def adapter_switch(model: torch.nn.Module) -> AdapterSwitch:
    """The :class:`AdapterSwitch` of a ``PeftModel`` (created once, kept on the model)."""
    switch = model.__dict__.get(_SWITCH_ATTR)
    if switch is None:
        switch = AdapterSwitch(model)
        model.__dict__[_SWITCH_ATTR] = switch
    return switch


def scalar_adapter_names(model) -> dict[str, bool]:
    """``{adapter name: trainable}`` of the reward/value adapters added to ``model`` by :func:`add_scalar_adapter`."""
    return dict(getattr(model, "__dict__", {}).get(_SCALAR_ADAPTERS_ATTR, {}))


def policy_adapter_names(model) -> list[str]:
    """The adapters of a ``PeftModel`` that belong to the policy (all but the reward/value adapters)."""
    scalar = scalar_adapter_names(model)
    return [name for name in model.peft_config if name not in scalar]


# --------------------------------------------------------------------------------------------------------------
# Reading a reward/value adapter directory


@dataclass
class ScalarAdapterSource:
    """A LoRA reward/value adapter directory, checked (see :func:`read_scalar_adapter`)."""

    path: str
    config: dict
    """Its ``adapter_config.json``."""
    head_name: str
    """The score head's module name (``score`` for Llama, Qwen2, Mistral, ...)."""


def same_model_name(a: str, b: str) -> bool:
    """Whether two model names are the same model: the same directory (resolved) or the same Hub id."""
    if os.path.isdir(os.path.expanduser(a)) and os.path.isdir(os.path.expanduser(b)):
        return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))
    return a.rstrip("/") == b.rstrip("/")


def check_same_base(adapter_base: str | None, policy_base: str, *, key: str, path: str) -> None:
    """Refuse an adapter whose ``base_model_name_or_path`` is not the policy's base (local paths compared resolved)."""
    if not adapter_base:
        raise UserInputError(f"{key} '{path}': adapter_config.json names no base_model_name_or_path")
    if not same_model_name(adapter_base, policy_base):
        raise UserInputError(
            f"{key} '{path}' is a LoRA adapter trained on base '{adapter_base}', but the policy's base is "
            f"'{policy_base}': with a shared base the reward and value adapters must be trained on the policy's own "
            "base (train the reward recipe with model_name_or_path set to the policy, or drop shared_base)"
        )


def read_scalar_adapter(path: str, *, policy_base: str | None = None, key: str = "reward_model_path"
                        ) -> ScalarAdapterSource:
    """Check a reward/value adapter directory without loading any weights (only the safetensors header is read).

    It must hold ``adapter_config.json`` (LoRA) and ``adapter_model.safetensors`` and no ``config.json`` (that
    would be a full model), its weights must be LoRA weights plus one one-output score head (nothing else trained,
    e.g. no embeddings), and (when ``policy_base`` is given) it must name the policy's base as
    ``base_model_name_or_path``.

    Raises:
        UserInputError: one line naming ``key`` and the problem.
    """
    from safetensors import safe_open

    path = os.fspath(path)
    config_file = os.path.join(path, ADAPTER_CONFIG)
    if os.path.isfile(os.path.join(path, "config.json")) or not os.path.isfile(config_file):
        raise UserInputError(
            f"{key} '{path}' is not a LoRA adapter directory (a reward recipe with use_peft: true writes one): a "
            "shared base needs the reward and value models as LoRA adapters on the policy's base, not full models"
        )
    try:
        with open(config_file) as f:
            config = json.load(f)
    except (OSError, ValueError) as err:
        raise UserInputError(f"{key} '{path}': cannot read {ADAPTER_CONFIG}: {err}") from None
    if config.get("peft_type") != "LORA":
        raise UserInputError(f"{key} '{path}': a {config.get('peft_type')} adapter; a shared base needs LoRA adapters")
    weights_file = os.path.join(path, ADAPTER_WEIGHTS)
    if not os.path.isfile(weights_file):
        raise UserInputError(f"{key} '{path}': no {ADAPTER_WEIGHTS} in the adapter directory")
    if policy_base is not None:
        check_same_base(config.get("base_model_name_or_path"), policy_base, key=key, path=path)
    with safe_open(weights_file, framework="pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    head_name = _head_name({k: v for k, v in shapes.items() if not _is_lora_key(k)}, key, path)
    return ScalarAdapterSource(path=path, config=config, head_name=head_name)


def _is_lora_key(name: str) -> bool:
    return ".lora_" in name


def _head_name(head_shapes: dict, key: str, path: str) -> str:
    """The module name of the one score head among a saved adapter's non-LoRA tensors (``base_model.model.NAME.*``)."""
    modules = {name.rsplit(".", 1)[0] for name in head_shapes}
    weight = next((shape for name, shape in head_shapes.items() if name.endswith(".weight")), None)
    if len(modules) != 1 or weight is None or len(weight) != 2:
        raise UserInputError(
            f"{key} '{path}': expected LoRA weights and one score head in {ADAPTER_WEIGHTS}, besides LoRA found "
            f"{sorted(head_shapes) or 'nothing'} (a shared base holds only LoRA weights and a score head per adapter)"
        )
    if weight[0] != 1:
        raise UserInputError(f"{key} '{path}': its score head has {weight[0]} outputs; a reward/value model needs 1")
    return modules.pop().removeprefix("base_model.model.")


def _split_adapter_weights(weights: dict, key: str, path: str):
    """``(LoRA weights, {"weight": ..., ["bias": ...]} of the score head)`` of a saved SEQ_CLS adapter."""
    lora = {name: tensor for name, tensor in weights.items() if _is_lora_key(name)}
    head = {name: tensor for name, tensor in weights.items() if not _is_lora_key(name)}
    _head_name({name: tuple(t.shape) for name, t in head.items()}, key, path)
    return lora, {name.rsplit(".", 1)[1]: tensor for name, tensor in head.items()}


# --------------------------------------------------------------------------------------------------------------
# The reward/value model on the policy's base


class SharedBaseScalarModel(torch.nn.Module):
    """A reward or value model: a LoRA adapter on a policy's base plus its own ``Linear(hidden, 1)`` score head.

    Build it with :func:`add_scalar_adapter`. It quacks like a ``*ForSequenceClassification`` model for PPO:
    ``base_model_prefix`` is ``"backbone"``, ``model.backbone(**inputs)`` runs the policy's decoder with this
    adapter active, and ``model.score`` is the head. Calling the model returns the
    head's output at each sequence's last non-pad token (``.logits``, shape ``(batch, 1)``), as HF's sequence
    classifiers do. Only the head is a registered submodule; the base and the adapter belong to the policy (so
    ``.to()``, ``.eval()`` or ``.parameters()`` here see only the head).
    """

    base_model_prefix = "backbone"

    def __init__(self, policy, adapter_name: str, score: torch.nn.Linear, *, head_name: str = "score"):
        super().__init__()
        self.__dict__["policy"] = policy  # not a submodule: the base and the adapter are the policy's
        self.adapter_name = adapter_name
        self.head_name = head_name
        self.score = score

    @property
    def config(self):
        return self.policy.config

    @property
    def trainable(self) -> bool:
        return scalar_adapter_names(self.policy)[self.adapter_name]

    def decoder(self) -> torch.nn.Module:
        """The policy's decoder stack (e.g. ``LlamaModel``): the base without its LM head."""
        lm = self.policy.get_base_model()
        return getattr(lm, lm.base_model_prefix)

    def backbone(self, **kwargs):
        """The policy's decoder, run with this model's adapter active."""
        switch = adapter_switch(self.policy)
        if torch.is_grad_enabled():
            switch.protect_checkpointing()
        with switch.use(self.adapter_name):
            return self.decoder()(**kwargs)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        """Score of each sequence (head output at its last non-pad token), like ``*ForSequenceClassification``."""
        from transformers.modeling_outputs import SequenceClassifierOutputWithPast

        output = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        logits = self.score(output.last_hidden_state)
        pad = self.config.pad_token_id
        if pad is None:
            last = torch.full((input_ids.shape[0],), input_ids.shape[1] - 1, device=input_ids.device)
        else:
            not_pad = (input_ids != pad).int()
            last = (torch.arange(input_ids.shape[1], device=input_ids.device) * not_pad).argmax(-1)
        return SequenceClassifierOutputWithPast(logits=logits[torch.arange(logits.shape[0]), last])

    # ---------------------------------------------------------------- saving and loading

    def save_pretrained(self, save_directory: str, is_main_process: bool = True, **kwargs) -> None:
        """Write the adapter as a LoRA reward recipe does (SEQ_CLS ``adapter_config.json``, LoRA weights and the
        score head in ``adapter_model.safetensors``); loadable by :func:`add_scalar_adapter` and by
        ``PeftModel.from_pretrained`` on a sequence-classification model of the same base."""
        import safetensors.torch
        from peft.utils import get_peft_model_state_dict

        if not is_main_process:
            return
        os.makedirs(save_directory, exist_ok=True)
        config = self.policy.peft_config[self.adapter_name].to_dict()
        config.update(task_type="SEQ_CLS", modules_to_save=[self.head_name], inference_mode=True)
        config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in config.items()}
        weights = get_peft_model_state_dict(self.policy, adapter_name=self.adapter_name)
        weights = {k: v for k, v in weights.items() if ".lora_" in k}
        for name, tensor in self.score.state_dict().items():
            weights[f"base_model.model.{self.head_name}.{name}"] = tensor
        weights = {k: v.detach().contiguous().cpu() for k, v in weights.items()}
        safetensors.torch.save_file(weights, os.path.join(save_directory, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        with open(os.path.join(save_directory, ADAPTER_CONFIG), "w") as f:
            json.dump(config, f, indent=2, sort_keys=True)

    def load_weights(self, directory: str) -> None:
        """Copy the adapter and head saved by :meth:`save_pretrained` into this model's tensors, in place (an
        optimizer over them stays valid)."""
        from peft.utils import load_peft_weights

        lora, head = _split_adapter_weights(load_peft_weights(directory, device="cpu"), "value_model", directory)
        _set_adapter_weights(self.policy, lora, self.adapter_name, directory)
        with torch.no_grad():
            for name, tensor in head.items():
                getattr(self.score, name).copy_(tensor)


def _local_adapter_dir(source: str, key: str) -> str:
    """``source`` itself if it is a directory, else the local snapshot of the Hub repository it names."""
    from .paths import looks_local

    if os.path.isdir(os.path.expanduser(source)) or looks_local(source):
        return os.path.expanduser(source)
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(source, allow_patterns=[ADAPTER_CONFIG, ADAPTER_WEIGHTS, "config.json"])
    except Exception as err:  # noqa: BLE001 - offline, unknown repository, no access: one line naming it
        first_line = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise UserInputError(f"{key} '{source}': no such local directory, and fetching it from the Hub failed: "
                             f"{first_line}") from None


def _set_adapter_weights(policy, lora: dict, adapter_name: str, path: str) -> None:
    from peft.utils import set_peft_model_state_dict

    result = set_peft_model_state_dict(policy, lora, adapter_name=adapter_name)
    missing = [k for k in result.missing_keys if f".{adapter_name}." in k and ".lora_" in k]
    unexpected = list(result.unexpected_keys)
    if missing or unexpected:
        raise UserInputError(
            f"adapter '{path}' does not fit the policy's base: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )


def _policy_base_name(policy) -> str:
    names = policy_adapter_names(policy)
    base = policy.peft_config[names[0]].base_model_name_or_path if names else None
    return base or policy.get_base_model().name_or_path


def _register_scalar_adapter(policy, adapter_name: str, trainable: bool, grads: dict) -> None:
    """Record the new adapter on the policy and put back every parameter's ``requires_grad`` (``grads``: as before
    peft's ``add_adapter``), the scalar adapters' LoRA weights following their own ``trainable``."""
    registry = policy.__dict__.setdefault(_SCALAR_ADAPTERS_ATTR, {})
    registry[adapter_name] = trainable
    for name, param in policy.named_parameters():
        owner = next((a for a in registry if re.search(rf"\.lora_[A-Za-z_]+\.{re.escape(a)}(\.|$)", name)), None)
        param.requires_grad_(registry[owner] if owner is not None else grads.get(name, False))
    adapter_switch(policy).refresh()


def _new_score_head(policy, head_weights: dict | None, trainable: bool) -> torch.nn.Linear:
    """A one-output score head on the policy's hidden size: ``head_weights`` (a saved head) or a new one,
    ``normal(0, initializer_range)`` from torch's RNG."""
    lm_head = policy.get_base_model().get_output_embeddings()
    hidden = policy.get_base_model().config.get_text_config().hidden_size
    reference = lm_head.weight if lm_head is not None else next(policy.get_base_model().parameters())
    # a trained head is float32 (as LoRA weights: bfloat16 would lose AdamW's small updates); a frozen one has the
    # residual stream's dtype; either casts what it reads to its own dtype (trl_ext.models.dtypes)
    dtype = reference.dtype if reference.dtype.is_floating_point and not trainable else torch.float32
    bias = head_weights is not None and "bias" in head_weights
    score = torch.nn.Linear(hidden, 1, bias=bias, device=reference.device, dtype=dtype)
    with torch.no_grad():
        if head_weights is not None:
            for name, tensor in head_weights.items():
                getattr(score, name).copy_(tensor)
        else:
            std = getattr(policy.get_base_model().config, "initializer_range", 0.02)
            score.weight.normal_(mean=0.0, std=std)
    score.requires_grad_(trainable)
    return score


def add_scalar_adapter(
    policy,
    adapter_name: str,
    *,
    source: str | os.PathLike | None = None,
    lora_config=None,
    trainable: bool,
    reinit_head: bool = False,
) -> SharedBaseScalarModel:
    """Add a reward or value model to ``policy`` (a ``peft.PeftModel`` for causal LM): a LoRA adapter named
    ``adapter_name`` on the policy's base, plus a score head.

    Args:
        policy: the PPO policy, a LoRA ``PeftModel`` (quantized or not), before it is handed to the trainer.
        adapter_name: ``"reward"`` (:data:`REWARD_ADAPTER`), ``"value"`` (:data:`VALUE_ADAPTER`) or another name.
        source: a LoRA reward/value adapter directory or Hub repository (what a reward recipe with ``use_peft``
            writes, or a PPO checkpoint's ``value_model/``): its LoRA weights and score head. It must have been trained on the
            policy's base. ``None``: a fresh adapter from ``lora_config`` and a new head (``normal(0,
            initializer_range)``, from torch's RNG).
        lora_config: a ``peft.LoraConfig`` for a fresh adapter (its task type is replaced by the policy's).
        trainable: ``True`` for the value model (adapter and head get gradients and go into the optimizer);
            ``False`` for the reward model (frozen: no gradients, not in the optimizer).
        reinit_head: start from a new head even when ``source`` has one.

    Returns:
        The :class:`SharedBaseScalarModel`, to pass to :class:`trl_ext.PPOTrainer` as ``reward_model`` or
        ``value_model``.

    Raises:
        UserInputError: ``policy`` is not a LoRA ``PeftModel``, the name is taken, ``source`` is not a LoRA
            reward/value adapter of the policy's base, or neither ``source`` nor ``lora_config`` is given.
    """
    import copy

    from peft import LoraConfig, PeftModel
    from peft.utils import load_peft_weights

    from .dtypes import cast_inputs_to_weight_dtype, float32_trainable_parameters
    from .quantization import disable_bnb_cpu_weight_repacking

    if not isinstance(policy, PeftModel) or policy.peft_type != "LORA":
        raise UserInputError("shared base: the policy must be a LoRA peft model (use_peft: true) to carry the "
                             "reward and value adapters")
    if adapter_name in policy.peft_config:
        raise UserInputError(f"shared base: the policy already has an adapter named {adapter_name!r}")
    key = "reward_model_path" if not trainable else "value_model_path"
    head_name, head_weights = "score", None
    if source is not None:
        found = read_scalar_adapter(_local_adapter_dir(os.fspath(source), key), policy_base=_policy_base_name(policy),
                                    key=key)
        head_name = found.head_name
        config = LoraConfig.from_pretrained(found.path)
        config.init_lora_weights = True  # the saved weights replace it; PiSSA-like inits would rewrite the base
        lora_weights, head_weights = _split_adapter_weights(load_peft_weights(found.path, device="cpu"), key,
                                                            found.path)
    elif lora_config is not None:
        config = copy.deepcopy(lora_config)
        if config.init_lora_weights not in (True, False, "gaussian"):
            raise UserInputError(
                f"shared base: init_lora_weights={config.init_lora_weights!r} changes the base weights it is applied "
                "to, which the policy shares; use the default initialisation"
            )
    else:
        raise UserInputError(f"shared base: adapter {adapter_name!r} needs a source directory or a lora_config")
    config.task_type = policy.peft_config[policy_adapter_names(policy)[0]].task_type
    config.modules_to_save = None
    config.inference_mode = not trainable
    config.base_model_name_or_path = _policy_base_name(policy)

    # peft's add_adapter re-runs set_adapter on every layer, which rewrites requires_grad: keep everyone's as it was
    grads = {name: p.requires_grad for name, p in policy.named_parameters()}
    policy.add_adapter(adapter_name, config)
    if source is not None:
        _set_adapter_weights(policy, lora_weights, adapter_name, found.path)
    disable_bnb_cpu_weight_repacking(policy)
    _register_scalar_adapter(policy, adapter_name, trainable, grads)
    score = _new_score_head(policy, None if reinit_head else head_weights, trainable)
    cast_inputs_to_weight_dtype(score)
    float32_trainable_parameters(policy)  # the new adapter's LoRA weights (peft casts only its own adapters)
    return SharedBaseScalarModel(policy, adapter_name, score, head_name=head_name)


# --------------------------------------------------------------------------------------------------------------
# What the PPO trainer needs


@contextmanager
def saving_policy_adapters_only(policy):
    """Inside the block, ``policy.save_pretrained`` writes the policy's adapters only (not the reward/value adapters,
    which their own models save). A no-op for models without such adapters."""
    scalar = scalar_adapter_names(policy)
    if not scalar or not hasattr(policy, "peft_config"):
        yield
        return
    policy.save_pretrained = functools.partial(
        type(policy).save_pretrained, policy, selected_adapters=policy_adapter_names(policy)
    )
    try:
        yield
    finally:
        del policy.save_pretrained
