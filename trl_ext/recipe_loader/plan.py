"""``trl-ext plan RECIPE [--gpu-memory GIB] [--prompt-length N] [--key value ...]``: a PPO recipe's memory budget.
How it works: docs/internals-recipes.md#trl-ext-plan."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

from ..errors import UserInputError
from ..models.paths import looks_local
from ..ppo.memory.budget import GIB, LINEAR_MODULES, MemoryBudget, ModelShape, PPOShape, ppo_memory_budget
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
    """(ScriptArguments, ModelConfig, PPOConfig, PipelineArguments) of a PPO recipe, typed by the
    recipe loader's parser; no path has to exist and precision is not checked (planning happens anywhere)."""
    from . import loader

    cli = loader.parse_overrides(overrides)
    merged = {**loader.read_recipe_file(path), **cli}
    merged.pop("env", None)
    if merged.get("trainer") != "ppo":
        raise UserInputError(f"plan: '{path}' is a {merged.get('trainer')!r} recipe; the planner plans PPO recipes")
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
    return tuple(parsed[:4])


def merged_reward_model_path(path: str, overrides) -> str | None:
    """The recipe's `reward_model_path` as written (None when it has none: reward functions only; TRL's config
    would fill in a default model)."""
    from . import loader

    merged = {**loader.read_recipe_file(path), **loader.parse_overrides(list(overrides or []))}
    return merged.get("reward_model_path") or None


def read_model_config(path: str, key: str):
    """The transformers config of a local checkpoint (``config.json`` only), following a LoRA adapter directory to
    its base; one-line errors for Hub ids and missing files."""
    from transformers import AutoConfig

    from .loader import resolve_tiny_name

    local = resolve_tiny_name(path)
    if not os.path.isdir(os.path.expanduser(local)):
        what = "is not a local directory" if looks_local(path) else \
            "is a Hub id (the planner reads only a local config.json and never downloads)"
        raise UserInputError(f"plan: key '{key}': '{path}' {what}; pass a local path, e.g. --{key} DIR (a folder "
                             "with the checkpoint's config.json)")
    local = os.path.expanduser(local)
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


def _no_reward_model_note(pipeline) -> str:
    """The note of a run without a reward model: its rewards come from reward functions or an environment."""
    if pipeline.environment_factory and not pipeline.reward_funcs:
        return "no reward model (an environment's get_reward): none budgeted"
    return "no reward model (reward_funcs only): none budgeted"


def make_plan(recipe_path: str, overrides: list[str] | None = None, *, gpu_memory: float = 24.0,
              prompt_length: int = DEFAULT_PROMPT_LENGTH) -> Plan:
    """The :class:`Plan` of a PPO recipe (see the module docstring)."""
    _script, model_args, args, pipeline = parse_ppo_recipe(recipe_path, list(overrides or []))
    upcast = pipeline.upcast_non_quantized
    config = read_model_config(model_args.model_name_or_path, "model_name_or_path")
    name = f"{os.path.basename(os.path.normpath(model_args.model_name_or_path))} ({config.model_type})"
    shape = ModelShape.from_config(config, name=name)
    run = replace(PPOShape.from_config(args, model_args, prompt_length, upcast_non_quantized=upcast), rollout_chunk=1,
                  full_finetune=not model_args.use_peft)
    targets = model_args.lora_target_modules
    if targets and targets != "all-linear" and "all-linear" not in targets:  # else all seven (an over-estimate)
        run = replace(run, lora_modules=tuple(m for m in LINEAR_MODULES if m in targets) or None)
    shared = bool(pipeline.shared_base)
    critic = args.has_value_model  # a critic-free advantage_estimator: no value model to budget
    has_reward_model = bool(merged_reward_model_path(recipe_path, overrides))
    notes = [] if has_reward_model else [_no_reward_model_note(pipeline)]
    if not shared:
        notes += _scalar_model_notes(args, pipeline, shape, has_reward_model, critic)
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
