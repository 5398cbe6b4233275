"""Memory budget of a PPO run on one device: the bytes each part holds (what stays all run, and the rollout, scoring
and training phases), from the model's shape and the run's settings, and the caching allocator's margin (what a CUDA
run reserves beyond the peak the budget predicts it allocates, a line through two measurements; off CUDA 1.0). What
it counts and assumes: docs/ppo-memory.md, "What the budget counts"; checked by ``benchmarks/ppo_memory.py``,
``tests/ppo/test_memory_budget.py`` and ``tests/ppo/test_allocator_margin.py``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from ...runtime.cuda_memory import ALLOC_CONF_ENV, EXPANDABLE_SEGMENTS

__all__ = [
    "DEVICE_OVERHEAD_BYTES",
    "allocator_margin",
    "expandable_segments_on",
    "planned_reserved_bytes",
    "LINEAR_MODULES",
    "LLAMA_3_8B",
    "LOGIT_COPIES",
    "LOGPROB_SLICE_BYTES",
    "OPTIMIZER_STEP_BYTES",
    "QWEN2_5_0_5B",
    "QWEN2_5_7B",
    "STREAMING_STEP_COPIES",
    "MemoryBudget",
    "ModelLoad",
    "ModelShape",
    "PPOShape",
    "base_weight_bytes",
    "budget_table",
    "held_weight_bytes",
    "kv_cache_bytes",
    "layer_activation_bytes",
    "logprob_slice_rows",
    "lora_parameters",
    "ppo_memory_budget",
    "quantization_of",
    "role_loads",
    "rollout_scores_bytes",
    "streaming_logprob_bytes",
    "trainable_parameters",
]

GIB = 2**30
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linear layers of a Llama-style decoder layer (``all-linear`` in peft)."""
STREAMING_STEP_COPIES = 6
"""``(chunk, vocab)`` float32 buffers alive at once per generation step with streamed log-probs: the step's logits
and their float32 copy, the temperature-scaled scores, the sampling probabilities, the previous step's scores that
:class:`~trl_ext.ppo.rollout.logprobs.SampledTokenLogprobs` holds, and logsumexp's workspace (measured: 5.5-6)."""
LOGIT_COPIES = 3
"""Sequence-length logits tensors alive at once while training on one micro-batch: the logits, their gradient and
one softmax-sized temporary (log-softmax or the entropy statistic)."""
OPTIMIZER_STEP_BYTES = 12
"""Bytes per trainable parameter alive only around an optimizer step: its float32 gradient and the temporaries of
torch's multi-tensor (``foreach``) AdamW (measured here: 12-16 bytes in all with the gradient)."""
LOGPROB_SLICE_BYTES = 2**28
"""Largest float32 ``(rows, positions, vocab)`` slice of reference logits held at once (256 MiB), whatever the chunk
(:func:`trl_ext.ppo.rollout.logprobs.response_logprobs`)."""
DEVICE_OVERHEAD_BYTES = 1 * GIB
"""CUDA context and caching-allocator slack, assumed (not measured here: no GPU)."""
NF4_BLOCK = 64
NESTED_BLOCK = 256


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that its memory depends on."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    name: str = ""

    @classmethod
    def from_config(cls, config, name: str = "") -> "ModelShape":
        """From a transformers config (Llama, Qwen2, Mistral and other models with their field names)."""
        heads = config.num_attention_heads
        model_type = getattr(config, "model_type", "")
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=bool(getattr(config, "attention_bias", False)) or model_type == "qwen2",
            name=name or model_type,
        )

    def linear_shapes(self, modules=None) -> list[tuple[int, int]]:
        """``(in, out)`` of the linear layers of one decoder layer (``modules``, default all of
        :data:`LINEAR_MODULES`): what 4/8-bit quantization and ``all-linear`` LoRA cover."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.num_heads * self.head_dim, \
            self.num_kv_heads * self.head_dim
        shapes = dict(zip(LINEAR_MODULES, [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]))
        return [shapes[m] for m in (modules or LINEAR_MODULES)]

    @property
    def linear_parameters(self) -> int:
        """Weights of all decoder layers' linear layers."""
        return self.num_layers * sum(a * b for a, b in self.linear_shapes())

    def other_parameters(self, lm_head: bool = True) -> int:
        """Parameters outside those linear layers: embeddings, the LM head (if ``lm_head`` and untied), norms
        (two per layer and a final one) and the q/k/v biases (Qwen2)."""
        embeddings = self.vocab_size * self.hidden_size
        head = embeddings if lm_head and not self.tie_word_embeddings else 0
        norms = (2 * self.num_layers + 1) * self.hidden_size
        bias = self.num_layers * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim if self.qkv_bias else 0
        return embeddings + head + norms + bias

    @property
    def parameters(self) -> int:
        return self.linear_parameters + self.other_parameters()


# Published configs (config.json of meta-llama/Meta-Llama-3-8B, Qwen/Qwen2.5-7B-Instruct, Qwen/Qwen2.5-0.5B-Instruct).
LLAMA_3_8B = ModelShape(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_layers=32, num_heads=32,
                        num_kv_heads=8, head_dim=128, name="Llama-3-8B")
QWEN2_5_7B = ModelShape(vocab_size=152_064, hidden_size=3584, intermediate_size=18_944, num_layers=28, num_heads=28,
                        num_kv_heads=4, head_dim=128, qkv_bias=True, name="Qwen2.5-7B")
QWEN2_5_0_5B = ModelShape(vocab_size=151_936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                          num_kv_heads=2, head_dim=64, tie_word_embeddings=True, qkv_bias=True, name="Qwen2.5-0.5B")


def base_weight_bytes(shape: ModelShape, quantization: str | None, *, lm_head: bool = True,
                      dtype_bytes: int = 2, upcast_non_quantized: bool = True) -> int:
    """Bytes of one base model's weights as trl-ext's loaders hold them.

    ``quantization``: ``"nf4"`` (0.5 byte per linear weight + a float32 absmax per 64), ``"nf4-nested"`` (absmax
    as one byte per 64 plus a float32 per 256 blocks), ``"int8"`` (1 byte + a float32 scale per output row), or
    ``None`` (every parameter at ``dtype_bytes``). Quantized, the other parameters are float32 (peft's k-bit
    preparation upcasts them), or ``dtype_bytes`` each with ``upcast_non_quantized=False``. ``lm_head=False`` for
    a sequence-classification model (its 1-output head is counted with the adapters).
    """
    linear = shape.linear_parameters
    other = shape.other_parameters(lm_head)
    if quantization is None:
        return (linear + other) * dtype_bytes
    if quantization == "nf4":
        packed = linear // 2 + (linear // NF4_BLOCK) * 4
    elif quantization == "nf4-nested":
        blocks = linear // NF4_BLOCK
        packed = linear // 2 + blocks + (blocks // NESTED_BLOCK) * 4
    elif quantization == "int8":
        packed = linear + shape.num_layers * sum(out for _, out in shape.linear_shapes()) * 4
    else:
        raise ValueError(f"quantization must be 'nf4', 'nf4-nested', 'int8' or None, got {quantization!r}")
    return packed + other * (4 if upcast_non_quantized else dtype_bytes)


def held_weight_bytes(*models) -> int:
    """Bytes a loaded model's weights hold (what :func:`base_weight_bytes` predicts): its parameters and buffers as
    stored, plus bitsandbytes' 4-bit quantization state (absmax, code); each tensor counted once, so a base shared
    by several models counts once."""
    seen, total = set(), 0
    for model in models:
        for tensor in list(model.parameters()) + list(model.buffers()):
            tensors = [tensor]
            state = getattr(tensor, "quant_state", None)
            if state is not None:
                tensors += [t for t in (state.absmax, state.code) if t is not None]
                if getattr(state, "state2", None) is not None:
                    tensors += [state.state2.absmax, state.state2.code]
            for t in tensors:
                key = (t.untyped_storage().data_ptr(), t.dtype, tuple(t.shape))
                if key not in seen:
                    seen.add(key)
                    total += t.numel() * t.element_size()
    return total


def lora_parameters(shape: ModelShape, r: int, modules=None) -> int:
    """Parameters of one LoRA adapter of rank ``r`` on ``modules`` (default ``all-linear``): ``r * (in + out)`` per
    linear layer."""
    return shape.num_layers * sum(r * (a + b) for a, b in shape.linear_shapes(modules))


def kv_cache_bytes(shape: ModelShape, batch: int, seq_len: int, bytes_per_value: int = 2) -> int:
    """Keys and values of every layer for ``batch`` sequences of ``seq_len`` tokens:
    ``2 * layers * batch * kv_heads * head_dim * seq_len * bytes``."""
    return 2 * shape.num_layers * batch * shape.num_kv_heads * shape.head_dim * seq_len * bytes_per_value


def layer_activation_bytes(shape: ModelShape, batch: int, seq_len: int, bytes_per_value: int) -> int:
    """One decoder layer's activations for ``batch x seq_len`` tokens (fused attention, no ``L x L`` scores):
    normed input, q, k, v, attention output, o-projection and residual (``4 * hidden + 2 * kv_dim + q_dim``
    values per token) and the MLP's gate, up and their product (``3 * intermediate``)."""
    kv = shape.num_kv_heads * shape.head_dim
    per_token = 4 * shape.hidden_size + 2 * kv + shape.num_heads * shape.head_dim + 3 * shape.intermediate_size
    return batch * seq_len * per_token * bytes_per_value


def rollout_scores_bytes(batch: int, response_length: int, vocab_size: int) -> int:
    """TRL's stacked rollout scores, ``(batch, response_length, vocab)`` float32: ``B * T * V * 4``."""
    return batch * response_length * vocab_size * 4


def logprob_slice_rows(positions: int, vocab_size: int) -> int:
    """Rows of ``positions x vocab_size`` float32 logits in one slice of :data:`LOGPROB_SLICE_BYTES`."""
    return max(1, LOGPROB_SLICE_BYTES // max(1, positions * vocab_size * 4))


def streaming_logprob_bytes(chunk: int, vocab_size: int) -> int:
    """trl-ext's rollout log-probs: one generation step's ``(chunk, vocab)`` float32 buffers
    (:data:`STREAMING_STEP_COPIES` of them), whatever the response length."""
    return STREAMING_STEP_COPIES * chunk * vocab_size * 4


def quantization_of(model_args) -> str | None:
    """The budget's name of a ``trl.ModelConfig``'s quantization: ``"nf4"``, ``"nf4-nested"``, ``"int8"`` or None."""
    if model_args.load_in_4bit:
        return "nf4-nested" if model_args.use_bnb_nested_quant else "nf4"
    return "int8" if model_args.load_in_8bit else None


@dataclass(frozen=True)
class ModelLoad:
    """How a separate reward or value model is loaded, as far as its memory goes (what the loader does with its
    ``reward_*``/``value_*`` keys, :func:`trl_ext.recipe_loader.arguments.scalar_model_config`)."""

    quantization: str | None
    """As :attr:`PPOShape.quantization`; None: every parameter at ``dtype_bytes``."""
    lora_r: int | None
    """The rank of its LoRA adapter; None: no adapter."""
    lora_modules: tuple | None = None
    """Its adapter's target modules (None: ``all-linear``)."""
    trained_in_full: bool = False
    """A value model without an adapter: every parameter trains (AdamW moments, gradients)."""


@dataclass(frozen=True)
class PPOShape:
    """The settings of a PPO run that its memory depends on (per device)."""

    batch: int
    """Episodes per update per device: ``per_device_train_batch_size * gradient_accumulation_steps``."""
    micro_batch: int
    """``per_device_train_batch_size``: sequences per forward/backward in training."""
    rollout_chunk: int
    """``local_rollout_forward_batch_size`` (TRL's default 64): sequences per generate/scoring call."""
    prompt_length: int
    response_length: int
    lora_r: int
    quantization: str | None = "nf4"
    lora_modules: tuple | None = None
    """LoRA target modules (default: ``all-linear``, :data:`LINEAR_MODULES`)."""
    dtype_bytes: int = 2
    """Bytes of an unquantized weight (bfloat16: 2)."""
    streaming_logprobs: bool = True
    """trl-ext's rollout log-probs (True) or TRL's stacked scores (False)."""
    response_logits_only: bool = True
    """trl-ext's reference and training forwards: logits of the positions that predict a response token, the
    reference's a slice of rows at a time (True); or TRL's, of every prompt and response position (False)."""
    upcast_non_quantized: bool = True
    """Quantized bases: peft's float32 upcast of embeddings, LM head and norms (True, today's loaders), which makes
    the residual stream, KV cache and activations float32; False keeps them at ``dtype_bytes``."""
    full_finetune: bool = False
    """The policy (and value model) trained in full (``use_peft: false``, unquantized; ``lora_r`` ignored): see
    :func:`full_finetune_parts`."""
    reward_load: ModelLoad | None = None
    """A separate reward model's loading; None: as the policy (its quantization, an adapter of ``lora_r``)."""
    value_load: ModelLoad | None = None
    """A separate value model's loading; None: as the policy (its quantization, an adapter of ``lora_r``)."""

    @classmethod
    def from_config(cls, args, model_args, prompt_length: int, *, upcast_non_quantized: bool = True) -> "PPOShape":
        """From a :class:`trl_ext.PPOConfig` (its batch sizes, ``local_rollout_forward_batch_size``,
        ``response_length``) and the policy's ``trl.ModelConfig`` (quantization, ``lora_r``, ``dtype``), for prompts
        of up to ``prompt_length`` tokens. ``upcast_non_quantized``: the loader option of that name, read from
        ``model_args`` when it has the field (a recipe's flat key), else this argument."""
        quantization = quantization_of(model_args)
        return cls(
            batch=args.per_device_train_batch_size * args.gradient_accumulation_steps
            * getattr(args, "num_mini_batches", 1),
            micro_batch=args.per_device_train_batch_size,
            rollout_chunk=args.local_rollout_forward_batch_size,
            prompt_length=prompt_length,
            response_length=args.response_length,
            lora_r=model_args.lora_r,
            quantization=quantization,
            dtype_bytes=4 if model_args.dtype in (None, "float32") else 2,
            upcast_non_quantized=bool(getattr(model_args, "upcast_non_quantized", upcast_non_quantized)),
        )

    @property
    def seq_len(self) -> int:
        return self.prompt_length + self.response_length

    @property
    def activation_bytes(self) -> int:
        """float32 when quantized with ``upcast_non_quantized`` (peft's k-bit preparation upcasts embeddings and
        norms), else the weights' dtype."""
        return 4 if self.quantization and self.upcast_non_quantized else self.dtype_bytes


@dataclass
class MemoryBudget:
    """Bytes per part (``parts``: name -> bytes, in table order), the phases, and the peak."""

    model: str
    design: str
    parts: dict = field(default_factory=dict)
    persistent: int = 0
    phases: dict = field(default_factory=dict)
    peak: int = 0

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)

    def fits(self, limit_bytes: int) -> bool:
        return self.peak <= limit_bytes


def ppo_memory_budget(shape: ModelShape, run: PPOShape, *, shared: bool, value_model: bool = True,
                      reward_model: bool = True) -> MemoryBudget:
    """The memory budget of one device's PPO run (see the module docstring for what each part is).

    ``shared``: reward and value models as adapters on the policy's base (else separate models of the same shape).
    ``value_model=False``: a run without a critic (no value model, adapter, head or value forward/backward).
    ``reward_model=False``: a run scored by reward functions only (no reward model, adapter or head).
    """
    if run.full_finetune:
        return _full_finetune_budget(shape, run, value_model=value_model, reward_model=reward_model)
    act = run.activation_bytes
    trained = 2 if value_model else 1  # models trained: policy (+ value)
    parts, _trainable, step_bytes = _weight_parts(shape, run, shared=shared, value_model=value_model,
                                                 reward_model=reward_model)
    persistent = sum(parts.values())
    chunk = min(run.rollout_chunk, run.batch)
    kv = kv_cache_bytes(shape, chunk, run.seq_len, act)
    logprobs = (streaming_logprob_bytes(chunk, shape.vocab_size) if run.streaming_logprobs
                else 2 * rollout_scores_bytes(run.batch, run.response_length, shape.vocab_size))
    rollout = {"rollout: KV cache (one chunk)": kv, "rollout: log-probs": logprobs}
    L, h = run.seq_len, shape.hidden_size
    positions = run.response_length + 1 if run.response_logits_only else L  # positions whose logits are taken
    reference_rows = (min(chunk, logprob_slice_rows(run.response_length, shape.vocab_size))
                      if run.response_logits_only else chunk)
    scoring = {"scoring: reference logits held at once": reference_rows * positions * shape.vocab_size * act,
               "scoring: one layer's activations (one chunk)": layer_activation_bytes(shape, chunk, L, act)}
    m = run.micro_batch
    training = {"training: gradients + AdamW step temporaries": step_bytes,
                "training: checkpointed layer inputs (policy + value)": trained * shape.num_layers * m * L * h * act,
                "training: one layer recomputed, with gradients": trained * layer_activation_bytes(shape, m, L, act),
                "training: policy logits (one micro-batch)": LOGIT_COPIES * m * positions * shape.vocab_size * act}
    parts.update(rollout)
    parts.update(scoring)
    parts.update(training)
    phases = {"rollout": sum(rollout.values()), "scoring": sum(scoring.values()), "training": sum(training.values())}
    parts["device overhead (assumed)"] = DEVICE_OVERHEAD_BYTES
    peak = persistent + max(phases.values()) + DEVICE_OVERHEAD_BYTES
    design = (("shared base" if shared else "separate models") + ("" if value_model else ", no critic")
              + ("" if reward_model else ", no reward model"))
    return MemoryBudget(model=shape.name, design=design, parts=parts,
                        persistent=persistent, phases=phases, peak=peak)


def role_loads(run: PPOShape, *, shared: bool) -> dict:
    """``{"policy", "reward", "value"}`` -> the :class:`ModelLoad` of each (a shared base: the policy's for all)."""
    policy = ModelLoad(run.quantization, None if run.full_finetune else run.lora_r, run.lora_modules,
                       trained_in_full=run.full_finetune)
    if shared:
        return {"policy": policy, "reward": policy, "value": policy}
    return {"policy": policy, "reward": run.reward_load or policy, "value": run.value_load or policy}


def trainable_parameters(shape: ModelShape, load: ModelLoad, *, scalar: bool) -> int:
    """Parameters a trained model of ``load`` trains: its adapter (with a scalar model's one-output head), or every
    parameter when trained in full."""
    head = shape.hidden_size if scalar else 0
    if load.trained_in_full:
        return shape.linear_parameters + shape.other_parameters(lm_head=not scalar) + head
    return lora_parameters(shape, load.lora_r or 0, load.lora_modules) + head


def _weight_parts(shape: ModelShape, run: PPOShape, *, shared: bool, value_model: bool, reward_model: bool):
    """What stays all run, role by role (:func:`role_loads`): ``(parts, trainable, step_bytes)``: the three weight
    parts, the parameters the optimizer holds, and the bytes of their gradients and AdamW step temporaries. LoRA
    weights and adapter-trained heads are float32 (moments 8 bytes, step :data:`OPTIMIZER_STEP_BYTES`); a value model
    trained in full stays at ``dtype_bytes``, its head too (moments ``2 * dtype_bytes``, step ``3 * dtype_bytes``:
    a gradient and two temporaries, as :func:`_full_finetune_budget`)."""
    loads = role_loads(run, shared=shared)
    scalars = (["reward"] if reward_model else []) + (["value"] if value_model else [])
    kw = dict(dtype_bytes=run.dtype_bytes, upcast_non_quantized=run.upcast_non_quantized)
    weights = base_weight_bytes(shape, run.quantization, lm_head=True, **kw)
    if not shared:
        weights += sum(base_weight_bytes(shape, loads[r].quantization, lm_head=False, **kw) for r in scalars)
    adapters = sum(lora_parameters(shape, loads[r].lora_r, loads[r].lora_modules) * 4
                   for r in ["policy"] + scalars if loads[r].lora_r is not None)
    heads = sum(shape.hidden_size * (run.dtype_bytes if loads[r].trained_in_full else 4) for r in scalars)
    full = lora = 0
    for role in ["policy"] + (["value"] if value_model else []):  # the trained models
        count = trainable_parameters(shape, loads[role], scalar=role == "value")
        if loads[role].trained_in_full:
            full += count
        else:
            lora += count
    parts = {
        "base weights": weights,
        "LoRA adapters + score heads (policy, reward, value)": adapters + heads,
        "AdamW moments (policy and value adapters, value head)": lora * 8 + full * 2 * run.dtype_bytes,
    }
    return parts, lora + full, lora * OPTIMIZER_STEP_BYTES + full * 3 * run.dtype_bytes


def _full_finetune_budget(shape: ModelShape, run: PPOShape, *, value_model: bool, reward_model: bool) -> MemoryBudget:
    """The budget of a policy trained in full (TRL's design without LoRA): the policy, its frozen reference copy,
    separate reward and value models, all at ``dtype_bytes``; every parameter of the policy and the value model
    trains: two AdamW moments at the parameters' dtype all run, and while training a gradient and the step's
    temporaries (``3 * dtype_bytes`` per parameter, :data:`OPTIMIZER_STEP_BYTES` at float32). The phases as for
    LoRA (activation checkpointing assumed), with trainable = all those parameters. An estimate: not yet checked
    against measurements as the LoRA budget is."""
    b = run.dtype_bytes
    policy = base_weight_bytes(shape, None, lm_head=True, dtype_bytes=b) // b
    scalar = base_weight_bytes(shape, None, lm_head=False, dtype_bytes=b) // b + shape.hidden_size
    trainable = policy + (scalar if value_model else 0)
    parts = {
        "base weights": (2 * policy + (int(value_model) + int(reward_model)) * scalar) * b,
        "LoRA adapters + score heads (policy, reward, value)": 0,
        "AdamW moments (policy and value adapters, value head)": trainable * 2 * b,
    }
    lora_run = replace(run, full_finetune=False, quantization=None, lora_r=0)
    lora_budget = ppo_memory_budget(shape, lora_run, shared=False, value_model=value_model, reward_model=reward_model)
    phases = dict(lora_budget.phases)
    grads = "training: gradients + AdamW step temporaries"
    phases["training"] += trainable * 3 * b - lora_budget.parts[grads]
    for name, value in lora_budget.parts.items():
        if name.startswith(("rollout:", "scoring:", "training:")):
            parts[name] = trainable * 3 * b if name == grads else value
    persistent = sum(parts.values()) - sum(v for k, v in parts.items() if k.startswith(("rollout:", "scoring:",
                                                                                       "training:")))
    parts["device overhead (assumed)"] = DEVICE_OVERHEAD_BYTES
    design = "policy trained in full" + ("" if value_model else ", no critic") + ("" if reward_model else
                                                                                 ", no reward model")
    return MemoryBudget(model=shape.name, design=design, parts=parts, persistent=persistent, phases=phases,
                        peak=persistent + max(phases.values()) + DEVICE_OVERHEAD_BYTES)


def budget_table(budgets: list[MemoryBudget], limit_gib: float = 24.0) -> str:
    """A markdown table: one column per budget, one row per part, then the phases, the peak and whether it fits."""
    header = "| part | " + " | ".join(f"{b.model}, {b.design}" for b in budgets) + " |"
    lines = [header, "|" + "---|" * (len(budgets) + 1)]
    for name in budgets[0].parts:
        lines.append(f"| {name} | " + " | ".join(f"{b.parts[name] / GIB:.2f}" for b in budgets) + " |")
    lines.append("| **all run** (weights, adapters, optimizer) | "
                 + " | ".join(f"**{b.persistent / GIB:.2f}**" for b in budgets) + " |")
    for phase in ("rollout", "scoring", "training"):
        lines.append(f"| phase: {phase} | " + " | ".join(f"{b.phases[phase] / GIB:.2f}" for b in budgets) + " |")
    lines.append("| **peak** = all run + largest phase + overhead | "
                 + " | ".join(f"**{b.peak / GIB:.1f}** ({b.peak_phase})" for b in budgets) + " |")
    lines.append(f"| fits {limit_gib:g} GiB? | "
                 + " | ".join("yes" if b.fits(limit_gib * GIB) else "no" for b in budgets) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the caching allocator's margin

MARGIN_INTERCEPT = 1.077
MARGIN_PER_CHUNK = 0.0079
ENGINE_EXTRA = 0.34
EXPANDABLE_MARGIN = 1.05


def expandable_segments_on(environ=os.environ) -> bool:
    """``PYTORCH_CUDA_ALLOC_CONF`` turns expandable segments on."""
    return EXPANDABLE_SEGMENTS.lower() in environ.get(ALLOC_CONF_ENV, "").replace(" ", "").lower()


def allocator_margin(chunk: int, *, device_type: str, expandable_segments: bool,
                     continuous_batching: bool = False) -> float:
    """Reserved / allocated peak planned for a run on ``device_type`` at rollout ``chunk`` (module docstring)."""
    if device_type != "cuda":
        return 1.0
    if expandable_segments:
        return EXPANDABLE_MARGIN
    return MARGIN_INTERCEPT + MARGIN_PER_CHUNK * chunk + (ENGINE_EXTRA if continuous_batching else 0.0)


def planned_reserved_bytes(budget: MemoryBudget, margin: float) -> int:
    """The whole-process peak planned: the allocator's part of ``budget.peak`` times ``margin``, plus the overhead."""
    return int(DEVICE_OVERHEAD_BYTES + (budget.peak - DEVICE_OVERHEAD_BYTES) * margin)
