"""``trl-ext plan RECIPE [--gpu-memory GIB] [--prompt-length N] [--key value ...]``: a PPO recipe's memory budget.
How it works: docs/internals-recipes.md#trl-ext-plan."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

from ..errors import UserInputError
from ..models.paths import looks_local
from ..ppo.memory.budget import (
    GIB,
    LINEAR_MODULES,
    MemoryBudget,
    ModelLoad,
    ModelShape,
    PPOShape,
    ppo_memory_budget,
    quantization_of,
    role_loads,
    trainable_parameters,
)
from ..ppo.memory.chunk import AUTO, largest_fitting_chunk

DEFAULT_PROMPT_LENGTH = 512
PLAN_OPTIONS = {"--gpu-memory": ("gpu_memory", float), "--prompt-length": ("prompt_length", int)}


@dataclass
class Plan:
    """What ``trl-ext plan`` found: the budget as written, whether it fits, and the settings that do."""

    recipe: str
    shape: ModelShape
    run: PPOShape
    shared: bool
    target_bytes: int
    budget: MemoryBudget
    fits: bool
    chunk_as_written: int | str
    fastest: dict | None = None
    """Recipe keys -> values of the fastest settings that fit (None: nothing fits by chunk and micro-batch)."""
    fastest_budget: MemoryBudget | None = None
    fastest_chunk: int | None = None
    """The rollout chunk of ``fastest`` (what ``auto`` chooses at the target)."""
    changes_results: bool = False
    """Whether ``fastest`` changes the micro-batch (an explicit choice: results change)."""
    larger_micro_batches: list = field(default_factory=list)
    """``(micro_batch, accumulation, chunk, peak)`` that also fit with a larger micro-batch (results change)."""
    remedies: list = field(default_factory=list)
    """``(key, value, peak)`` that shrink what stays all run, when nothing fits by chunk and micro-batch."""
    notes: list = field(default_factory=list)
    written: dict = field(default_factory=dict)
    """The recipe's values of the keys the plan may change."""
    num_mini_batches: int = 1
    value_model: bool = True
    reward_model: bool = True

    def roles(self) -> dict:
        """``role -> (ModelLoad, trainable parameters)`` of each model the run holds (0: frozen), as budgeted."""
        loads = role_loads(self.run, shared=self.shared)
        held = ["policy"] + ["reward"] * self.reward_model + ["value"] * self.value_model
        return {role: (loads[role], 0 if role == "reward" else
                       trainable_parameters(self.shape, loads[role], scalar=role == "value")) for role in held}

    def roles_line(self) -> str:
        """The models, role by role: quantization, adapter, what trains (``trl-ext plan``'s second header line)."""
        words = []
        for role, (load, trainable) in self.roles().items():
            weights = load.quantization or f"{8 * self.run.dtype_bytes}-bit"
            how = "trained in full" if load.trained_in_full else (
                f"LoRA r {load.lora_r}" if load.lora_r is not None else "no adapter")
            base = " (shared base)" if self.shared and role != "policy" else ""
            trains = f"{trainable / 1e6:.2f}M trainable" if trainable else "frozen"
            words.append(f"{role} {weights}{base}, {how}, {trains}")
        return "# models: " + "; ".join(words)


def split_plan_options(tokens: list[str]) -> tuple[dict, list[str]]:
    """Take ``--gpu-memory GIB`` and ``--prompt-length N`` out of the override tokens (they may follow the recipe)."""
    options, rest, i = {}, [], 0
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        if name in PLAN_OPTIONS:
            dest, typ = PLAN_OPTIONS[name]
            if not eq:
                i += 1
                value = tokens[i] if i < len(tokens) else ""
            try:
                options[dest] = typ(value)
            except ValueError:
                raise UserInputError(f"plan: {name} takes a number, got {value!r}") from None
            if not options[dest] > 0:
                raise UserInputError(f"plan: {name} must be positive, got {value!r}")
        else:
            rest.append(tokens[i])
        i += 1
    return options, rest


def parse_ppo_recipe(path: str, overrides: list[str]):
    """(ScriptArguments, ModelConfig, PPOConfig, PipelineArguments, reward keys, value keys) of a PPO recipe, typed
    by the recipe loader's parser; no path has to exist and precision is not checked (planning happens anywhere)."""
    from . import loader

    cli = loader.parse_overrides(overrides)
    merged = {**loader.read_recipe_file(path), **cli}
    merged.pop("env", None)
    if merged.get("trainer") != "ppo":
        raise UserInputError(f"plan: '{path}' is a {merged.get('trainer')!r} recipe; the planner plans PPO recipes")
    merged = loader.translate_grpo_keys(merged)
    types = loader._dataclass_types("ppo")
    parser = loader._RecipeArgumentParser(types)
    actions = {a.dest: a for a in parser._actions if a.dest != "help"}
    for key in merged:
        if key not in actions:
            raise UserInputError(f"recipe: unknown key '{key}' (not a key of a ppo recipe)")
    argv: list[str] = []
    for key, value in merged.items():
        if value is not None and key not in loader.ENTRY_KEYS:
            argv += loader.to_argv(key, value, actions[key])
    argv += ["--bf16", "false", "--fp16", "false"]  # construction only: no device is used, any precision plans
    try:
        parsed = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    except UserInputError:
        raise
    except ValueError as err:
        raise UserInputError(f"recipe: {str(err).strip().splitlines()[0]}") from None
    for key, value in loader.entry_values(merged, cli).items():
        setattr(parsed[3], key, value)
    return tuple(parsed[:6])


def merged_reward_model_path(path: str, overrides) -> str | None:
    """The recipe's `reward_model_path` as written (None when it has none: reward functions only; TRL's config
    would fill in a default model)."""
    from . import loader

    merged = {**loader.read_recipe_file(path), **loader.parse_overrides(list(overrides or []))}
    return merged.get("reward_model_path") or None


def read_model_config(path: str, key: str):
    """The transformers config of a checkpoint, from its ``config.json`` only: a local folder (a LoRA adapter
    directory is followed to its base), a ``config.json`` file, or a Hub id (that one file is fetched, when the Hub
    is reachable); one-line errors for the rest."""
    from transformers import AutoConfig

    from .loader import resolve_tiny_name

    local = os.path.expanduser(resolve_tiny_name(path))
    if os.path.isfile(local) and local.endswith(".json"):
        return _config_from_file(local, path, key)
    if not os.path.isdir(local):
        if looks_local(path):
            raise UserInputError(f"plan: key '{key}': '{path}' is not a local directory or config.json; pass one, "
                                 f"e.g. --{key} path/to/config.json")
        return _hub_config(path, key)
    adapter = os.path.join(local, "adapter_config.json")
    if not os.path.isfile(os.path.join(local, "config.json")) and os.path.isfile(adapter):
        with open(adapter) as f:
            base = json.load(f).get("base_model_name_or_path")
        if not base:
            raise UserInputError(f"plan: key '{key}': the adapter '{path}' names no base_model_name_or_path")
        return read_model_config(base, key)
    if not os.path.isfile(os.path.join(local, "config.json")):
        raise UserInputError(f"plan: key '{key}': '{path}' has no config.json")
    return AutoConfig.from_pretrained(local, local_files_only=True)


def _config_from_file(file: str, path: str, key: str):
    """A config from a ``config.json`` file (its ``model_type`` names the class)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(file, local_files_only=True)
    except (OSError, ValueError, KeyError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise UserInputError(f"plan: key '{key}': '{path}' is not a transformers config.json: {first}") from None


def _hub_config(model_id: str, key: str):
    """A Hub model's config, fetching its ``config.json`` alone; offline or unreachable, one line saying what to
    pass instead."""
    import logging

    from transformers import AutoConfig

    hub_log = logging.getLogger("huggingface_hub")  # its retry warnings would make the error several lines
    level = hub_log.level
    hub_log.setLevel(logging.ERROR)
    try:
        return AutoConfig.from_pretrained(model_id)
    except Exception as err:  # noqa: BLE001 - offline, unknown id, gated model: all say the same thing to do
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise UserInputError(
            f"plan: key '{key}': '{model_id}' is a Hub id whose config.json could not be fetched ({first[:160]}); "
            f"offline, pass the model's config.json: --{key} path/to/config.json (or a folder holding it)") from None
    finally:
        hub_log.setLevel(level)


def _scalar_model_notes(args, pipeline, shape: ModelShape, has_reward_model: bool, critic: bool) -> list[str]:
    """Separate reward/value models are budgeted with the policy's shape: say so where theirs differs or is not
    readable here."""
    notes = []
    paths = [("reward_model_path", args.reward_model_path)] if has_reward_model else []
    if critic:
        paths.append(("value_model_path", pipeline.value_model_path))
    for key, path in paths:
        try:
            other = ModelShape.from_config(read_model_config(path, key), name=shape.name) if path else None
        except UserInputError:
            other = None
            notes.append(f"{key} '{path}' is not readable locally: budgeted with the policy's shape")
        if other is not None and other != shape:
            notes.append(f"{key} '{path}' has another shape than the policy; the budget uses the policy's")
    return notes


def lora_modules(targets, model_type: str) -> tuple | None:
    """The budget's ``lora_modules`` of ``lora_target_modules`` as peft reads it: None for ``all-linear`` (all seven
    linear layers), peft's default for the model type when unset, the known names of a list; None (all seven, an
    over-estimate) for names the budget does not know."""
    if not targets:
        from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING

        targets = TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING.get(model_type) or "all-linear"
    targets = [targets] if isinstance(targets, str) else list(targets)
    if "all-linear" in targets:
        return None
    modules = tuple(m for m in LINEAR_MODULES if m in targets)
    return None if not modules or len(modules) == len(LINEAR_MODULES) else modules


def local_adapter_config(path: str | None) -> dict | None:
    """The ``adapter_config.json`` of a local LoRA adapter directory (a reward recipe's output with ``use_peft``);
    None for anything else."""
    from .loader import resolve_tiny_name

    local = os.path.expanduser(resolve_tiny_name(path or ""))
    adapter = os.path.join(local, "adapter_config.json")
    if not path or not os.path.isfile(adapter) or os.path.isfile(os.path.join(local, "config.json")):
        return None
    with open(adapter) as f:
        return json.load(f)


def with_role_loads(run: PPOShape, model_args, prefixed, reward_path: str | None, pipeline, model_type: str,
                    notes: list) -> PPOShape:
    """``run`` with the separate reward and value models loaded as the loader loads them: their ModelConfigs from
    the recipe's keys by the loader's own rule (``scalar_model_config``, the QLoRA-safe defaults included), the LoRA
    rank and targets of a local adapter directory they start from; a note where it had to assume."""
    from .arguments import scalar_model_config
    from .loader import resolve_tiny_name

    value_path = pipeline.value_model_path or reward_path or model_args.model_name_or_path
    loads = {}
    for role, keys, path in (("reward", prefixed[0], reward_path), ("value", prefixed[1], value_path)):
        margs = scalar_model_config(keys, role, model_args, path)
        adapter = local_adapter_config(path)
        r, targets = (margs.lora_r, margs.lora_target_modules) if margs.use_peft else (None, None)
        if adapter is not None and (role == "reward" or margs.use_peft):
            r, targets = adapter.get("r"), adapter.get("target_modules")
        elif role == "reward" and path and model_args.use_peft and not margs.use_peft \
                and not os.path.isdir(os.path.expanduser(resolve_tiny_name(path))):
            r, targets = model_args.lora_r, model_args.lora_target_modules
            notes[:] = [note + (f", as a LoRA adapter of the policy's rank ({r}) (what a reward recipe with the "
                                "policy's LoRA keys writes)" if note.startswith(f"reward_model_path '{path}'") else "")
                        for note in notes]
        loads[role] = ModelLoad(quantization_of(margs), r, lora_modules(targets, model_type),
                                trained_in_full=role == "value" and not margs.use_peft)
    return replace(run, reward_load=loads["reward"], value_load=loads["value"])


def full_value_model_note(recipe, recipe_path: str, overrides: list[str]) -> str | None:
    """``trl-ext check``'s note on a value model trained in full beside a quantized policy (a recipe that asks for it
    with ``value_use_peft: false``), with the plan's figures when the policy's config.json is readable here."""
    policy, value = recipe.model_args, recipe.value_model_args
    bits = 4 if policy.load_in_4bit else 8 if policy.load_in_8bit else None
    if recipe.trainer != "ppo" or recipe.pipeline.shared_base or value is None or bits is None or value.use_peft:
        return None
    line = (f"the value model trains in full (value_use_peft: false) beside a {bits}-bit policy: every parameter "
            "of it trains, with AdamW moments and gradients of its size")
    try:
        plan = make_plan(recipe_path, overrides)
        lean = make_plan(recipe_path, list(overrides) + ["--value_use_peft", "true", "--value_load_in_4bit",
                                                         str(bits == 4), "--value_load_in_8bit", str(bits == 8)])
    except UserInputError:
        return line + " (trl-ext plan RECIPE --model_name_or_path path/to/config.json gives its memory)"
    load, trainable = plan.roles()["value"]
    held = trainable * plan.run.dtype_bytes * 3  # weights and two AdamW moments, all run
    return (f"{line}: {trainable / 1e6:,.1f}M parameters, {held / GIB:.2f} GiB of weights and moments all run; "
            f"trl-ext plan: peak {plan.budget.peak / GIB:.2f} GiB as written, {lean.budget.peak / GIB:.2f} GiB with a "
            f"{bits}-bit LoRA value model (drop value_use_peft and value_load_in_*)")


def _no_reward_model_note(pipeline) -> str:
    """The note of a run without a reward model: its rewards come from reward functions or an environment."""
    if pipeline.environment_factory and not pipeline.reward_funcs:
        return "no reward model (an environment's get_reward): none budgeted"
    return "no reward model (reward_funcs only): none budgeted"


def _planned_run(recipe_path: str, overrides: list[str], prompt_length: int):
    """``(args, shape, run, shared, critic, has_reward_model, notes)`` of a PPO recipe: its PPOConfig, the policy's
    shape, the run's settings with each model loaded as the loader loads it, and the notes so far."""
    _script, model_args, args, pipeline, *prefixed = parse_ppo_recipe(recipe_path, overrides)
    upcast = pipeline.upcast_non_quantized
    config = read_model_config(model_args.model_name_or_path, "model_name_or_path")
    name = os.path.normpath(model_args.model_name_or_path)
    name = f"{os.path.basename(os.path.dirname(name) if name.endswith('.json') else name)} ({config.model_type})"
    shape = ModelShape.from_config(config, name=name)
    run = replace(PPOShape.from_config(args, model_args, prompt_length, upcast_non_quantized=upcast), rollout_chunk=1,
                  full_finetune=not model_args.use_peft)
    run = replace(run, lora_modules=lora_modules(model_args.lora_target_modules, config.model_type))
    shared = bool(pipeline.shared_base)
    critic = args.has_value_model  # a critic-free advantage_estimator: no value model to budget
    reward_path = merged_reward_model_path(recipe_path, overrides)
    notes = [] if reward_path else [_no_reward_model_note(pipeline)]
    if not shared:
        notes += _scalar_model_notes(args, pipeline, shape, bool(reward_path), critic)
        run = with_role_loads(run, model_args, prefixed, reward_path, pipeline, config.model_type, notes)
    return args, shape, run, shared, critic, bool(reward_path), notes


def make_plan(recipe_path: str, overrides: list[str] | None = None, *, gpu_memory: float = 24.0,
              prompt_length: int = DEFAULT_PROMPT_LENGTH) -> Plan:
    """The :class:`Plan` of a PPO recipe (see the module docstring)."""
    args, shape, run, shared, critic, has_reward_model, notes = _planned_run(recipe_path, list(overrides or []),
                                                                            prompt_length)
    target = int(gpu_memory * GIB)
    chunk = args.local_rollout_forward_batch_size
    mini = run.batch // max(getattr(args, "num_mini_batches", 1), 1)  # episodes per optimizer step per device
    micro_batches = [m for m in range(mini, 0, -1) if mini % m == 0]

    def fit_at(micro: int, base_run: PPOShape = run, is_shared: bool = shared):
        try:
            return largest_fitting_chunk(shape, replace(base_run, micro_batch=micro), target, shared=is_shared,
                                         value_model=critic, reward_model=has_reward_model)
        except UserInputError:
            return None

    as_written = fit_at(run.micro_batch)
    if chunk == AUTO:  # what the trainer would choose at this target (a chunk of 1 if none fits)
        written = replace(run, rollout_chunk=as_written.chunk if as_written else 1)
        notes.append(f"local_rollout_forward_batch_size is auto: planned at the chunk it would choose for "
                     f"max_memory_gib {gpu_memory:g} ({written.rollout_chunk})")
    else:
        written = replace(run, rollout_chunk=chunk)
    if getattr(args, "max_memory_gib", None) and args.max_memory_gib != gpu_memory:
        notes.append(f"the recipe's max_memory_gib is {args.max_memory_gib:g}, the plan's target {gpu_memory:g} GiB")
    budget = ppo_memory_budget(shape, written, shared=shared, value_model=critic, reward_model=has_reward_model)
    plan = Plan(recipe=recipe_path, shape=shape, run=written, shared=shared, target_bytes=target, budget=budget,
                fits=budget.fits(target), chunk_as_written=chunk, notes=notes,
                num_mini_batches=max(getattr(args, "num_mini_batches", 1), 1), value_model=critic,
                reward_model=has_reward_model,
                written={"per_device_train_batch_size": args.per_device_train_batch_size,
                         "gradient_accumulation_steps": args.gradient_accumulation_steps,
                         "local_rollout_forward_batch_size": chunk})
    if as_written is not None:
        plan.fastest = {"local_rollout_forward_batch_size": AUTO if chunk == AUTO else as_written.chunk}
        plan.fastest_budget, plan.fastest_chunk = as_written.budget, as_written.chunk
    else:
        for m in (m for m in micro_batches if m < run.micro_batch):
            choice = fit_at(m)
            if choice is not None:
                plan.fastest = {"per_device_train_batch_size": m, "gradient_accumulation_steps": mini // m,
                                "local_rollout_forward_batch_size": AUTO if chunk == AUTO else choice.chunk}
                plan.fastest_budget, plan.fastest_chunk, plan.changes_results = choice.budget, choice.chunk, True
                break
    for m in (m for m in micro_batches if m > run.micro_batch):
        choice = fit_at(m)
        if choice is not None:
            plan.larger_micro_batches.append((m, mini // m, choice.chunk, choice.budget.peak))
    if plan.fastest is None:
        candidates = []
        if run.full_finetune:  # LoRA first: the frozen reference copy and the full AdamW state go
            candidates.append(("use_peft", True, replace(run, full_finetune=False), shared))
        elif not shared:
            candidates.append(("shared_base", True, run, True))
        if run.quantization and run.upcast_non_quantized:
            candidates.append(("upcast_non_quantized", False, replace(run, upcast_non_quantized=False), shared))
        if run.quantization is None:
            candidates.append(("load_in_4bit", True, replace(run, quantization="nf4"), shared))
        if run.value_load and run.value_load.trained_in_full and run.quantization and not shared:
            lean = ModelLoad(run.quantization, run.lora_r, run.lora_modules)  # the QLoRA-safe default
            candidates.append(("value_use_peft", True, replace(run, value_load=lean), shared))
        for key, value, other_run, is_shared in candidates:
            choice = fit_at(1, other_run, is_shared)
            peak = choice.budget.peak if choice else ppo_memory_budget(
                shape, replace(other_run, micro_batch=1, rollout_chunk=1), shared=is_shared, value_model=critic,
                reward_model=has_reward_model).peak
            plan.remedies.append((key, value, peak))
    return plan


def format_plan(plan: Plan) -> str:
    """The planner's printout: the budget per component (GiB), the verdict, the settings that fit."""
    run, b, gib = plan.run, plan.budget, plan.target_bytes / GIB
    quant = run.quantization or f"unquantized ({8 * run.dtype_bytes}-bit)"
    residual = "float32" if run.activation_bytes == 4 else f"{8 * run.activation_bytes}-bit"
    lines = [
        f"# {plan.recipe}: {plan.shape.name} ({plan.shape.parameters / 1e9:.2f}B parameters), "
        f"{'shared base' if plan.shared else 'separate policy, reward and value models'}, {quant}, "
        f"{'trained in full' if run.full_finetune else f'LoRA r {run.lora_r}'}, {residual} residual stream",
        f"# {run.batch} episodes per update per device, micro-batch {run.micro_batch}, rollout chunk "
        f"{plan.chunk_as_written}, prompts {run.prompt_length} tokens (--prompt-length), responses "
        f"{run.response_length}; target {gib:g} GiB (--gpu-memory)",
        plan.roles_line(),
        "",
        "| part | GiB |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value / GIB:.2f} |" for name, value in b.parts.items()]
    lines.append(f"| **all run** (weights, adapters, optimizer) | {b.persistent / GIB:.2f} |")
    lines += [f"| phase: {name} | {value / GIB:.2f} |" for name, value in b.phases.items()]
    lines.append(f"| **peak** = all run + largest phase + overhead | **{b.peak / GIB:.2f}** ({b.peak_phase}) |")
    lines.append("")
    verdict = "fits" if plan.fits else "does NOT fit"
    lines.append(f"As written the run {verdict} in {gib:g} GiB (peak {b.peak / GIB:.2f} GiB, {b.peak_phase} phase "
                 "largest).")
    if plan.fastest is not None:
        keys = ", ".join(f"{k}: {v}" for k, v in plan.fastest.items())
        lines.append(f"Fastest settings that fit {gib:g} GiB (peak {plan.fastest_budget.peak / GIB:.2f} GiB): {keys}")
        chunk = plan.fastest["local_rollout_forward_batch_size"]
        if chunk == AUTO:
            chunk = f"auto (chooses {plan.fastest_chunk} at max_memory_gib: {gib:g})"
        else:
            chunk = f"{chunk} (or `auto` with max_memory_gib: {gib:g})"
        lines.append(f"  local_rollout_forward_batch_size: {chunk}: {chunk_reason(plan)}; the chunk changes which "
                     "random numbers go to which sequence, not the distribution of the samples.")
        if plan.changes_results:
            lines.append("  per_device_train_batch_size / gradient_accumulation_steps: the same episodes per update "
                         "in smaller micro-batches. This CHANGES the results: TRL's PPO loss is a masked mean per "
                         "micro-batch, averaged over micro-batches. An explicit choice (train_micro_batch_size "
                         "shrinks the passes without changing the update under global_token_mean or a "
                         "sequence-level loss_aggregation).")
        changed = [f"{k} ({plan.written[k]} -> {v})" for k, v in plan.fastest.items() if plan.written[k] != v]
        if changed:
            lines.append("Keys to change: " + ", ".join(changed))
        else:
            lines.append("Nothing to change.")
    else:
        lines.append(f"No rollout chunk or micro-batch fits {gib:g} GiB (a micro-batch of 1 and a chunk of 1 still "
                     "need more). Keys that shrink what stays all run:")
        for key, value, peak in plan.remedies:
            ok = "fits" if peak <= plan.target_bytes else "still does not fit"
            lines.append(f"  {key}: {str(value).lower()} -> peak {peak / GIB:.2f} GiB at micro-batch 1 ({ok})")
        if not plan.remedies:
            lines.append("  none left: lower lora_r, response_length or the prompt length, or use a larger GPU")
    for m, acc, chunk, peak in plan.larger_micro_batches:
        lines.append(f"Also fits, as an explicit choice that changes results: per_device_train_batch_size: {m}, "
                     f"gradient_accumulation_steps: {acc}, local_rollout_forward_batch_size: {chunk} "
                     f"(peak {peak / GIB:.2f} GiB; fewer, larger training calls)")
    lines += cuda_lines(plan)
    lines += [f"# note: {note}" for note in plan.notes]
    return "\n".join(lines)


def chunk_reason(plan: Plan) -> str:
    """Why the plan's chunk differs from the recipe's (or not): larger chunks are faster, so a smaller one is only
    taken to fit the target, or because the per-device batch is smaller than the chunk written."""
    written, best, batch = plan.chunk_as_written, plan.fastest_chunk, plan.run.batch
    if written == AUTO or best is None:
        return f"the largest chunk that fits {plan.target_bytes / GIB:g} GiB (larger chunks are faster)"
    if best < written and best == batch:
        return f"{written} is more than the {batch} episodes per device: the same single call per phase"
    if best < written:
        return (f"larger chunks are faster, but {written} does not fit {plan.target_bytes / GIB:g} GiB: {best} is the "
                "largest that does")
    if best > written:
        return f"larger chunks are faster and {best} still fits {plan.target_bytes / GIB:g} GiB"
    return f"as written, and the largest that fits {plan.target_bytes / GIB:g} GiB"


def cuda_lines(plan: Plan) -> list[str]:
    """On CUDA: the caching allocator's margin over the predicted (allocated) peak, the reserved peak it plans, and the
    micro-batch ``train_micro_batch_size: auto`` would take (``trl_ext.ppo.memory.budget``, ``micro_batches``)."""
    from ..ppo.memory.budget import allocator_margin, planned_reserved_bytes
    from ..ppo.memory.micro_batch import largest_fitting_micro_batch

    run, gib = plan.run, plan.target_bytes / GIB
    chunk = min(run.rollout_chunk, run.batch)
    default = allocator_margin(chunk, device_type="cuda", expandable_segments=False)
    expandable = allocator_margin(chunk, device_type="cuda", expandable_segments=True)
    reserved = [planned_reserved_bytes(plan.budget, m) / GIB for m in (default, expandable)]
    lines = [f"On CUDA the caching allocator reserves more than the peak above: margin x{default:.2f} at chunk "
             f"{chunk} with the default allocator (reserved {reserved[0]:.2f} GiB), x{expandable:.2f} with "
             f"expandable_segments, which trl-ext sets for CUDA runs ({reserved[1]:.2f} GiB); the auto keys plan "
             "with it."]
    mini = replace(run, batch=run.batch // max(plan.num_mini_batches, 1))
    try:
        micro = largest_fitting_micro_batch(plan.shape, mini, plan.target_bytes, shared=plan.shared,
                                            value_model=plan.value_model, reward_model=plan.reward_model,
                                            margin=expandable)
        lines.append(f"train_micro_batch_size: auto would take {micro} at {gib:g} GiB (the largest training "
                     "micro-batch beside the persistent memory; mini-batches and optimizer steps unchanged).")
    except UserInputError:
        lines.append(f"train_micro_batch_size: auto: not even 1 sequence per pass fits beside the persistent memory "
                     f"in {gib:g} GiB.")
    return lines


def run_plan(recipe: str, tokens: list[str], *, gpu_memory: float | None = None,
             prompt_length: int | None = None) -> int:
    """The ``plan`` command: print the plan; exit code 0 if the recipe fits as written, 1 if not."""
    options, overrides = split_plan_options(tokens)
    plan = make_plan(recipe, overrides, gpu_memory=options.get("gpu_memory", gpu_memory or 24.0),
                     prompt_length=options.get("prompt_length", prompt_length or DEFAULT_PROMPT_LENGTH))
    print(format_plan(plan))
    return 0 if plan.fits else 1
