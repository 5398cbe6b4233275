"""GPU benchmark of one QLoRA PPO update (issues 18, 31): TRL 1.12's PPOTrainer vs trl-ext's designs, memory and time.

Builds, on the spot, a random-initialised checkpoint of a real shape (no hub, no network): a bf16 safetensors causal
LM, a tokenizer whose vocabulary matches the model's and that follows the architecture's tokenizer path (Llama: a
word-level tokenizer read back as saved; Qwen2: a byte-level BPE, since transformers reads any qwen2 checkpoint's
tokenizer as ``Qwen2Tokenizer``), and a random LoRA reward adapter with its score head on it (the format a reward
recipe with ``use_peft`` writes). ``--workload uneven`` scales the LM head's EOS row so that responses stop at
geometric lengths (:func:`bias_eos`); ``full`` leaves random weights, whose responses run to the limit. Then runs
each variant in its own process:

* ``trl112``: TRL 1.12's own ``trl.experimental.ppo.PPOTrainer``, with separate 4-bit reward and value models (what
  TRL's design needs), configured with the keys the recipe sets (:func:`trl112_config`); runs where TRL 1.12 is the
  installed TRL or ``--trl112-site DIR`` names a site-packages folder holding it (put first on the child's
  ``PYTHONPATH``; e.g. ``pip install --target DIR --no-deps "trl==1.12.*"``);
* ``separate``: trl-ext with separate 4-bit reward and value models;
* ``shared``: trl-ext with ``shared_base`` (one 4-bit base for policy, reference, reward and value);
* ``fast``: ``shared`` plus ``local_rollout_forward_batch_size: auto`` (the largest chunk that fits the memory
  target), ``train_micro_batch_size: auto`` (the largest training pass that fits it; same mini-batches and optimizer
  steps), ``lora_dropout: 0`` and ``upcast_non_quantized: false`` (the bf16 residual);
* ``engine``: ``fast`` plus ``rollout_engine: continuous_batching`` (transformers' continuous batching, its cache sized
  like the auto chunk's; ``docs/rollout-engine.md``);
* ``graphs``: ``fast`` plus ``rollout_cuda_graphs: true`` (a static KV cache, each decoding step replayed as a CUDA
  graph; ``trl_ext.ppo.rollout.decode_graphs``). Before training it decodes 16 greedy tokens for 4 prompts with and
  without the graphs and records the share of equal tokens (``greedy_check``);
* ``VARIANT-before`` (e.g. ``shared-before``): that variant with the trl_ext of ``--before-site DIR`` (a folder
  holding an earlier ``trl_ext`` package, put first on the child's ``PYTHONPATH``): the same run on earlier code.

Models load through :func:`trl_ext.recipe_loader.pipeline.load_ppo_models`, the code ``trl-ext train`` runs, from the
variant's recipe; CUDA children set ``PYTORCH_CUDA_ALLOC_CONF`` as ``trl-ext train`` does. Each result records the
settings the run used, read back from the trainer and the model (chunk, LoRA dropout as loaded, residual dtype,
engine, tokenizer class). For each variant: peak reserved and allocated GPU memory and the whole-process peak
(reserved plus what lies outside the caching allocator, ``total - free - reserved`` at the end: the CUDA context and
library workspaces; assumes the GPU runs nothing else), seconds per update (wall, from a callback) and per phase
(trl-ext's ``time/*`` metrics; TRL 1.12 logs none), rollout tokens per second, the share of responses ending in EOS,
the first update's metrics, and what ``trl_ext.ppo.memory.budget`` predicts. The JSON and the markdown table are
rewritten after each variant.

``--smoke`` runs the same code on CPU with a tiny Llama and a tiny Qwen2 (4-bit through bitsandbytes' CPU path,
bfloat16 weights without autocast): resident memory (peak RSS growth over the loaded models) instead of GPU memory.
``tests/test_gpu_ppo_benchmark.py`` runs every variant on both, so the script cannot rot. ``--budget-only`` prints
memory_budget's 8B table for both residual-stream settings without running anything.

    bash benchmarks/gpu_run.sh run                                                   # the prepared GPU run
    python benchmarks/gpu_ppo.py --shape llama-3-8b --trl112-site /tmp/trl112 --workload uneven
    python benchmarks/gpu_ppo.py --smoke --trl112-site /tmp/trl112                   # CPU, both tiny models

Writes benchmarks/results/gpu_ppo_<shapes>_<workload>.json and .md (git ignores benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, child_result, machine_info, run_child, setup_env  # noqa: E402
from random_checkpoint import (TEMPERATURE, bias_eos, byte_level_tokenizer, model_config,  # noqa: E402
                               prompt_words, word_tokenizer)

VARIANTS = ("trl112", "separate", "shared", "fast", "engine", "graphs")
BEFORE = "-before"  # a variant's suffix: the same run with the trl_ext of --before-site


def base_variant(variant: str) -> str:
    """``shared-before`` -> ``shared``."""
    return variant.removesuffix(BEFORE)
WORKLOADS = ("full", "uneven")
GIB, MIB = 2**30, 2**20
SHAPES = {
    # published config.json sizes; settings as measured on one H100 and one H200 (benchmarks/README.md section 7)
    "llama-3-8b": dict(arch="llama", vocab=128_256, hidden=4096, intermediate=14_336, layers=32, heads=32, kv=8,
                       tie=False, prompt=512, response=64, micro=2, accumulation=32, chunk=8, epochs=1, lora_r=32,
                       updates=2),
    "qwen2.5-0.5b": dict(arch="qwen2", vocab=151_936, hidden=896, intermediate=4864, layers=24, heads=14, kv=2,
                         tie=True, prompt=512, response=64, micro=8, accumulation=8, chunk=64, epochs=4, lora_r=32,
                         updates=2),
    # --smoke: the same code on CPU, one tiny model per architecture and tokenizer path
    "smoke-llama": dict(arch="llama", vocab=512, hidden=64, intermediate=128, layers=2, heads=4, kv=2, tie=False,
                        prompt=12, response=6, micro=2, accumulation=2, chunk=2, epochs=1, lora_r=4, updates=2),
    "smoke-qwen2": dict(arch="qwen2", vocab=512, hidden=64, intermediate=128, layers=2, heads=4, kv=2, tie=True,
                        prompt=12, response=6, micro=2, accumulation=2, chunk=2, epochs=1, lora_r=4, updates=2),
}
SMOKE_OF = {"llama-3-8b": "smoke-llama", "qwen2.5-0.5b": "smoke-qwen2"}


# ------------------------------------------------------------------------------------------------ checkpoints


def build_child(a):
    """Write the random checkpoint (bf16 safetensors + tokenizer; with ``--workload uneven`` the EOS bias) and a
    random LoRA reward adapter on it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    s = shape_settings(a)
    root = Path(a.workdir)
    device = "cpu" if a.smoke else "cuda"
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(s), dtype=torch.bfloat16)
    workload = {"workload": a.workload}
    if a.workload == "uneven":
        workload.update(bias_eos(model, s))
    model.save_pretrained(root / "policy")
    tokenizer = (byte_level_tokenizer if s["arch"] == "qwen2" else word_tokenizer)(s["vocab"])
    tokenizer.save_pretrained(root / "policy")
    del model
    scalar = AutoModelForSequenceClassification.from_pretrained(root / "policy", num_labels=1, dtype=torch.bfloat16,
                                                                device_map=device)
    lora = LoraConfig(r=s["lora_r"], lora_alpha=2 * s["lora_r"], target_modules="all-linear", task_type="SEQ_CLS",
                      init_lora_weights=False)
    scalar = get_peft_model(scalar, lora)
    scalar.save_pretrained(root / "reward")
    return {"build_s": time.perf_counter() - t, "parameters": sum(p.numel() for p in scalar.parameters()),
            **workload}


# ------------------------------------------------------------------------------------------------ one variant


def shape_settings(a) -> dict:
    """The shape's settings with the command line's ``--accumulation`` and ``--updates``."""
    s = dict(SHAPES[a.shape])
    s.update({k: v for k, v in (("accumulation", a.accumulation), ("updates", a.updates)) if v})
    return s


def recipe_keys(a, variant: str) -> dict:
    """The recipe of a variant, as `trl-ext train` would read it."""
    s = shape_settings(a)
    out_name = variant
    variant = base_variant(variant)
    root = Path(a.workdir)
    keys = dict(
        trainer="ppo", model_name_or_path=str(root / "policy"), reward_model_path=str(root / "reward"),
        dataset_name=str(root / "prompts.jsonl"), output_dir=str(root / f"out-{out_name}"), overwrite_output_dir=True,
        load_in_4bit=True, bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True, use_peft=True,
        lora_r=s["lora_r"], lora_alpha=2 * s["lora_r"], lora_target_modules="all-linear", lora_dropout=0.05,
        value_use_peft=True, value_load_in_4bit=True, value_use_bnb_nested_quant=True, reward_load_in_4bit=True,
        reward_use_bnb_nested_quant=True, value_lora_r=s["lora_r"], value_lora_target_modules="all-linear",
        per_device_train_batch_size=s["micro"], gradient_accumulation_steps=s["accumulation"], num_mini_batches=1,
        num_ppo_epochs=s["epochs"], local_rollout_forward_batch_size=s["chunk"], response_length=s["response"],
        total_episodes=(s["updates"] + (out_name == a.profile)) * s["micro"] * s["accumulation"], learning_rate=3e-6,
        kl_coef=0.05,
        temperature=TEMPERATURE, stop_token="eos", missing_eos_penalty=1.0, num_sample_generations=0,
        save_strategy="no", logging_steps=1, report_to="none", seed=0, disable_tqdm=True, dtype="bfloat16",
    )
    # smoke: bfloat16 weights without autocast on CPU, so that the residual stream's dtype is measurable there too
    keys.update(dict(use_cpu=True, bf16=False) if a.smoke else dict(bf16=True))
    if variant in ("shared", "fast", "engine", "graphs"):
        for k in [k for k in keys if k.startswith(("reward_", "value_")) and k != "reward_model_path"]:
            keys.pop(k)
        keys["shared_base"] = True
    if variant in ("fast", "engine", "graphs"):
        keys.update(local_rollout_forward_batch_size="auto", lora_dropout=0.0, upcast_non_quantized=False,
                    train_micro_batch_size="auto")
        if a.max_memory_gib:
            keys["max_memory_gib"] = a.max_memory_gib
    keys["rollout_engine"] = "continuous_batching" if variant == "engine" else "generate"
    if variant == "graphs":
        keys["rollout_cuda_graphs"] = True
    return keys


def prompts(a) -> list[str]:
    """Random prompts of exactly the shape's prompt length in tokens (words that are one token each)."""
    import random

    s = shape_settings(a)
    rng = random.Random(0)
    words = prompt_words(s)
    n = s["updates"] * s["micro"] * s["accumulation"]
    return ["".join(rng.choice(words) for _ in range(s["prompt"])) for _ in range(n)]


def trl112_config(recipe):
    """TRL 1.12's own ``PPOConfig`` from the recipe: only the keys the recipe sets that TRL 1.12 has (trl-ext's
    defaults for the keys it shares with TRL, e.g. ``kl_estimator: None``, are not TRL 1.12's values)."""
    import trl
    from trl.experimental.ppo import PPOConfig

    assert trl.__version__.startswith("1.12"), f"the trl112 variant needs TRL 1.12, not {trl.__version__}"
    fields = PPOConfig.__dataclass_fields__
    return PPOConfig(**{k: getattr(recipe.training_args, k) for k in recipe.explicit if k in fields})


def load_variant(a, s: dict):
    """The variant's recipe, tokenizer, prompts and models, loaded by the code `trl-ext train` runs
    (:func:`trl_ext.recipe_loader.pipeline.load_ppo_models`)."""
    import transformers
    import yaml

    from trl_ext.recipe_loader import pipeline
    from trl_ext.recipe_loader.data import tokenize_prompts
    from trl_ext.recipe_loader.loader import resolve_recipe

    keys = recipe_keys(a, a.variant)
    recipe_file = Path(a.workdir) / f"{a.variant}.yaml"
    recipe_file.write_text(yaml.safe_dump(keys))
    recipe = resolve_recipe(recipe_file)
    pipeline.apply_environment(recipe)
    tokenizer = pipeline.load_tokenizer(pipeline._resolved(recipe.model_args))
    tokenizer.padding_side = "left"
    train_ds, _ = pipeline.open_datasets(recipe)
    train_ds = tokenize_prompts(train_ds, tokenizer)
    lengths = sorted({len(x) for x in train_ds["input_ids"]})
    if lengths != [s["prompt"]]:
        raise RuntimeError(f"{type(tokenizer).__name__}: prompts tokenize to {lengths} tokens, not {s['prompt']}")
    transformers.set_seed(recipe.training_args.seed)
    models = pipeline.load_ppo_models(recipe, tokenizer)
    return recipe, tokenizer, train_ds, models


def lora_dropout_loaded(policy) -> float:
    """The policy's LoRA dropout as loaded: peft makes an ``Identity`` for 0 (no call at all), else a ``Dropout(p)``
    (which TRL's PPOTrainer then sets to p = 0 but still calls). Read before the trainer is built."""
    import torch

    return max((m.p for n, m in policy.named_modules() if "lora_dropout" in n and isinstance(m, torch.nn.Dropout)),
               default=0.0)


def greedy_check(policy, tokenizer, train_ds, rows: int = 4, tokens: int = 16) -> float:
    """The share of equal tokens when ``rows`` prompts decode ``tokens`` greedy tokens without and with
    ``rollout_cuda_graphs`` (:mod:`trl_ext.ppo.rollout.decode_graphs`; no EOS stop, so every step runs)."""
    import torch
    from transformers import GenerationConfig

    from trl_ext.ppo.rollout.decode_graphs import DecodeGraphs
    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    queries = torch.tensor(train_ds["input_ids"][:rows], device=policy.device)
    plan = sampling_plan(policy, GenerationConfig(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                                                  pad_token_id=tokenizer.pad_token_id))
    plain, _ = generate_with_logprobs(policy, queries, rows, tokenizer.pad_token_id, plan)
    graphs = DecodeGraphs()
    start = time.perf_counter()
    graphed, _ = generate_with_logprobs(policy, queries, rows, tokenizer.pad_token_id, plan, decode_graphs=graphs)
    print(f"greedy check with graphs: {time.perf_counter() - start:.2f} s, {graphs.captures} capture(s) in "
          f"{graphs.capture_s:.2f} s, {graphs.replays} replays, failure: {graphs.failure}", file=sys.stderr,
          flush=True)
    return (plain == graphed).float().mean().item()


def settings_in_effect(trainer, policy, dropout: float) -> dict:
    """What the run actually used (read from the trainer and the model, not from the recipe)."""
    import torch

    choice = getattr(trainer, "rollout_engine_choice", None)
    residual = policy.get_input_embeddings().weight.dtype
    return {"rollout_chunk": int(trainer.args.local_rollout_forward_batch_size),
            "lora_dropout": dropout, "residual_dtype": str(residual).removeprefix("torch."),
            "upcast_non_quantized": residual == torch.float32, "engine": choice.engine if choice else "generate",
            "cuda_graphs": getattr(trainer, "decode_graphs", None) is not None,
            "train_micro_batch": (getattr(trainer, "train_micro_batch", None)
                                  or trainer.args.per_device_train_batch_size),
            "tokenizer": type(trainer.processing_class).__name__}


def variant_child(a):
    """Load the variant's models as the recipe pipeline does, train ``updates`` updates, measure."""
    import torch
    import transformers

    s = shape_settings(a)
    cuda = not a.smoke
    variant = base_variant(a.variant)
    recipe, tokenizer, train_ds, (policy, ref_model, reward, value) = load_variant(a, s)
    args = recipe.training_args
    if variant == "trl112":
        from trl.experimental.ppo import PPOTrainer

        args = trl112_config(recipe)
    else:
        from trl_ext import PPOTrainer

    class Timer(transformers.TrainerCallback):
        def __init__(self):
            self.seconds, self.after = [], None  # after: (update, call) to run once that update has ended

        def on_train_begin(self, *_, **__):
            self.last = time.perf_counter()

        def on_step_end(self, *_, **__):
            now = time.perf_counter()
            self.seconds.append(now - self.last)
            print(f"update {len(self.seconds)}: {now - self.last:.2f} s", file=sys.stderr, flush=True)
            if self.after and len(self.seconds) == self.after[0]:
                self.after[1]()
            self.last = time.perf_counter()

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    from _common import peak_rss_mb, reset_peak_rss, rss_mb, trim_heap

    dropout = lora_dropout_loaded(policy)
    print(f"{a.variant}: models loaded", file=sys.stderr, flush=True)
    greedy = greedy_check(policy, tokenizer, train_ds) if variant == "graphs" else None
    trim_heap()
    rss_before = rss_mb()
    reset_peak_rss()
    timer = Timer()
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=ref_model,
                         reward_model=reward, value_model=value, train_dataset=train_ds, callbacks=[timer])
    profile = None
    if a.profile == a.variant:  # one more update after the timed ones, under the profiler (update_profile.py)
        from update_profile import UpdateProfile

        quarter = max(1, s["response"] // 4)  # 64-token responses: decoding steps 16-19
        profile = UpdateProfile(trainer, policy, cuda=cuda, decode_start=quarter, decode_steps=min(4, quarter),
                                trace_dir=a.trace_dir)
        timer.after = (s["updates"], profile.arm)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "objective/kl" in e][: s["updates"]]
    timer.seconds = timer.seconds[: s["updates"]]
    import trl_ext

    result = {"variant": a.variant, "shape": a.shape, "workload": a.workload, "trl": __import__("trl").__version__,
              "trl_ext_code": str(Path(trl_ext.__file__).parent),
              "seconds_per_update": timer.seconds, "first_update": logs[0] if logs else None,
              "settings": settings_in_effect(trainer, policy, dropout),
              "eos_fraction": [e["val/num_eos_tokens"] / args.local_batch_size for e in logs
                               if "val/num_eos_tokens" in e]}
    result["rollout_chunk"] = result["settings"]["rollout_chunk"]
    phases = [{k: e[k] for k in ("time/rollout", "time/scoring", "time/optimization") if k in e} for e in logs]
    result["phases"] = phases
    result["rollout_tokens_per_s"] = [args.local_batch_size * s["response"] / p["time/rollout"]
                                      for p in phases if p.get("time/rollout")]
    if cuda:
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        outside = total - free - reserved
        result.update(device_name=torch.cuda.get_device_name(), peak_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
                      peak_reserved_gib=torch.cuda.max_memory_reserved() / GIB, outside_allocator_gib=outside / GIB,
                      peak_gib=(torch.cuda.max_memory_reserved() + outside) / GIB,
                      alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))
    else:
        result.update(rss_before_mib=rss_before, peak_rss_growth_mib=peak_rss_mb() - rss_before)
    result["predicted"] = predicted_budget(variant, recipe, policy, trainer, train_ds)
    if trainer.__dict__.get("decode_graphs") is not None:
        g = trainer.decode_graphs
        result["cuda_graphs"] = {"greedy_check": greedy, "captures": g.captures, "capture_s": g.capture_s,
                                 "replays": g.replays, "eager_steps": g.eager_steps, "failure": g.failure}
    if profile is not None:
        steps = profile.decode_counts[: s["updates"]]
        result["profile"] = {"windows": profile.windows, "decoding_steps": profile.decode_counts,
                             "decode_ms_per_step": [1e3 * p["time/rollout"] / n for p, n in zip(phases, steps) if n],
                             "prefills": profile.prefill_counts}
    return result


def predicted_budget(variant, recipe, policy, trainer, train_ds) -> dict:
    """What memory_budget predicts for the variant's run (the loaded policy's shape; the chunk and the training
    micro-batch that ran; TRL 1.12's stacked scores and logits of every position for ``trl112``)."""
    from trl_ext.ppo.memory.budget import DEVICE_OVERHEAD_BYTES, PPOShape, ppo_memory_budget
    from trl_ext.ppo.memory.chunk import run_shape_from_models

    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    peft_policy = getattr(unwrapped, "policy", policy)
    shape, run = run_shape_from_models(peft_policy, trainer.args, max(len(x) for x in train_ds["input_ids"]))
    micro = getattr(trainer, "train_micro_batch", None) or trainer.args.per_device_train_batch_size
    run = replace(run, rollout_chunk=int(trainer.args.local_rollout_forward_batch_size), micro_batch=int(micro),
                  streaming_logprobs=variant != "trl112")
    if variant == "trl112" and "response_logits_only" in PPOShape.__dataclass_fields__:
        run = replace(run, response_logits_only=False)
    budget = ppo_memory_budget(shape, run, shared=bool(recipe.pipeline.shared_base))
    return {"peak_gib": budget.peak / GIB, "persistent_gib": budget.persistent / GIB,
            "peak_without_device_overhead_mib": (budget.peak - DEVICE_OVERHEAD_BYTES) / MIB,
            "phases_gib": {k: v / GIB for k, v in budget.phases.items()}, "micro_batch": int(micro)}


# ------------------------------------------------------------------------------------------------ parent


def budget_only() -> str:
    from trl_ext.ppo.memory.budget import LLAMA_3_8B, PPOShape, budget_table, ppo_memory_budget
    from trl_ext.ppo.memory.chunk import largest_fitting_chunk

    s = SHAPES["llama-3-8b"]
    run = PPOShape(batch=s["micro"] * s["accumulation"], micro_batch=s["micro"], rollout_chunk=s["chunk"],
                   prompt_length=s["prompt"], response_length=s["response"], lora_r=s["lora_r"],
                   quantization="nf4-nested")
    budgets, chunks = [], []
    for shared in (False, True):
        for upcast in (True, False):
            r = replace(run, upcast_non_quantized=upcast)
            b = ppo_memory_budget(LLAMA_3_8B, r, shared=shared)
            b.design += ", " + ("float32 residual" if upcast else "bf16 residual")
            budgets.append(b)
            try:
                chunks.append(str(largest_fitting_chunk(LLAMA_3_8B, r, 24 * GIB, shared=shared).chunk))
            except ValueError:
                chunks.append("none fits")
    return budget_table(budgets) + "\n| `auto` chunk at 24 GiB | " + " | ".join(chunks) + " |"


def table(results: list[dict], smoke: bool) -> str:
    mem = "peak RSS growth MiB (CPU)" if smoke else "peak reserved / allocated / whole-process GiB"
    predicted = "predicted MiB (without the assumed 1 GiB CUDA overhead)" if smoke else "predicted peak GiB"
    lines = [f"| shape, workload | variant | {mem} | {predicted} | s per update | rollout / scoring / optimization s | "
             "rollout tokens/s | chunk, training micro-batch, LoRA dropout, residual, engine | "
             "responses ending in EOS | "
             "first update: objective/scores, objective/kl |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        where = f"{r.get('shape', '')}, {r.get('workload', '')}"
        if "error" in r:
            lines.append(f"| {where} | {r['variant']} | {r['error']} | | | | | | | |")
            continue
        m = (f"{r['peak_rss_growth_mib']:.0f}" if smoke else
             f"{r['peak_reserved_gib']:.1f} / {r['peak_allocated_gib']:.1f} / {r['peak_gib']:.1f}")
        last = r["phases"][-1] if r["phases"] else {}
        phases = " / ".join(f"{last[k]:.2f}" for k in ("time/rollout", "time/scoring", "time/optimization")
                            if k in last) or "not logged"
        tps = f"{r['rollout_tokens_per_s'][-1]:.0f}" if r["rollout_tokens_per_s"] else "-"
        first = r["first_update"] or {}
        scores, kl = (first.get(k, float("nan")) for k in ("objective/scores", "objective/kl"))
        pred = r["predicted"]
        pred = f"{pred['peak_without_device_overhead_mib']:.2f}" if smoke else f"{pred['peak_gib']:.2f}"
        st = r["settings"]
        used = (f"{st['rollout_chunk']}, {st['train_micro_batch']}, {st['lora_dropout']:g}, {st['residual_dtype']}, "
                f"{st['engine']}")
        eos = f"{r['eos_fraction'][-1]:.2f}" if r["eos_fraction"] else "-"
        lines.append(f"| {where} | {r['variant']} (TRL {r['trl']}) | {m} | {pred} | "
                     f"{r['seconds_per_update'][-1]:.2f} | {phases} | {tps} | {used} | {eos} | "
                     f"{scores:.4f}, {kl:.4f} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=list(SHAPES), default=None,
                   help="default llama-3-8b; with --smoke both tiny shapes (smoke-llama and smoke-qwen2)")
    p.add_argument("--shapes", default=None, help="comma-separated shapes, run one after the other")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny Llama and Qwen2, RSS instead of GPU memory")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--workload", choices=WORKLOADS, default="full",
                   help="full: random weights, responses run to response_length; uneven: an EOS bias spreads them")
    p.add_argument("--trl112-site", default=None, help="site-packages folder holding TRL 1.12 (for the trl112 run)")
    p.add_argument("--before-site", default=None,
                   help="folder holding an earlier trl_ext package, for the VARIANT-before variants")
    p.add_argument("--child-timeout", type=float, default=3600, help="seconds a variant's process may run")
    p.add_argument("--max-memory-gib", type=float, default=None,
                   help="memory target of the fast variant's auto chunk (default: the GPU's free memory; smoke: 2)")
    p.add_argument("--accumulation", type=int, default=None, help="gradient_accumulation_steps (default: the shape's)")
    p.add_argument("--updates", type=int, default=None, help="PPO updates per variant (default: the shape's, 2)")
    p.add_argument("--workdir", default=None, help="where the checkpoint is built (default: benchmarks/results/)")
    p.add_argument("--out", default=None, help="JSON result path (default: benchmarks/results/gpu_ppo[_smoke].json)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", default=None, choices=[v for v in VARIANTS if v != "trl112"],
                   help="this variant runs one more update, profiled (update_profile.py); its table: *_profile.md")
    p.add_argument("--trace-dir", default=None, help="with --profile: where the gzipped Chrome traces go")
    p.add_argument("--budget-only", action="store_true", help="print memory_budget's 8B table and exit")
    p.add_argument("--child", choices=["build", "variant"], help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    shapes = a.shapes.split(",") if a.shapes else [a.shape or ("smoke-llama,smoke-qwen2" if a.smoke else "llama-3-8b")]
    shapes = [x.strip() for x in ",".join(shapes).split(",") if x.strip()]
    for x in shapes:
        if x not in SHAPES:
            p.error(f"--shapes: unknown shape {x!r} (choose from {', '.join(SHAPES)})")
    a.shapes = [SMOKE_OF.get(x, x) if a.smoke else x for x in shapes]
    a.shape = a.shapes[0]
    if a.smoke:
        a.max_memory_gib = a.max_memory_gib or 2.0
    a.suffix = "_smoke" if a.smoke else "_" + "+".join(a.shapes)
    a.workdir_root = a.workdir or str(RESULTS / "gpu_ppo_models")
    a.workdir = a.workdir or str(Path(a.workdir_root) / f"{a.shape}-{a.workload}")
    return a


def write_prompts(a) -> None:
    with open(Path(a.workdir) / "prompts.jsonl", "w") as f:
        for text in prompts(a):
            f.write(json.dumps({"prompt": text}) + "\n")


def trl112_importable() -> bool:
    """TRL 1.12 is this environment's TRL (CI's TRL 1.12 phase)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl").startswith("1.12")
    except PackageNotFoundError:
        return False


def child_env(a, variant: str) -> dict | None:
    """The child's PYTHONPATH: the repository, then what this process was given (wheels carried to an offline
    machine), with TRL 1.12's site first for ``trl112``."""
    paths = [str(Path(__file__).resolve().parents[1])] + [x for x in os.environ.get("PYTHONPATH", "").split(
        os.pathsep) if x]
    if variant == "trl112" and a.trl112_site:
        paths.insert(0, a.trl112_site)
    if variant.endswith(BEFORE):
        paths.insert(0, a.before_site)
    return {"PYTHONPATH": os.pathsep.join(paths)}


def run_shape(a, out: Path, report: dict) -> None:
    """Build the shape's checkpoint, then run each variant in a child; the JSON and table are rewritten after each
    variant, so that a time limit loses only the variant in flight."""
    common = ["--workdir", a.workdir, "--threads", str(a.threads), "--shape", a.shape, "--workload", a.workload]
    common += (["--smoke"] if a.smoke else []) + (["--max-memory-gib", str(a.max_memory_gib)] if a.max_memory_gib
                                                 else [])
    common += [x for k in ("accumulation", "updates") if getattr(a, k) for x in (f"--{k}", str(getattr(a, k)))]
    common += [x for k in ("profile", "trace_dir") if getattr(a, k)
               for x in (f"--{k.replace('_', '-')}", getattr(a, k))]
    script = Path(__file__).resolve()
    Path(a.workdir).mkdir(parents=True, exist_ok=True)
    print(f"building the {a.shape} checkpoint ({a.workload} workload) in {a.workdir}", flush=True)
    run = {"shape": a.shape, "settings": shape_settings(a), "build": run_child(script, common + ["--child", "build"],
                                                                                env=child_env(a, "build"))}
    report["runs"].append(run)
    write_prompts(a)
    for variant in [v.strip() for v in a.variants.split(",") if v.strip()]:
        if variant == "trl112" and not (a.trl112_site or trl112_importable()):
            print("trl112: skipped (TRL 1.12 not importable; give --trl112-site)", flush=True)
            result = {"variant": "trl112", "shape": a.shape, "workload": a.workload,
                      "error": "skipped: TRL 1.12 not importable (no --trl112-site)"}
        else:
            print(f"running {a.shape} {variant}", flush=True)
            t = time.perf_counter()
            try:
                result = run_child(script, common + ["--child", "variant", "--variant", variant],
                                   env=child_env(a, variant), timeout=a.child_timeout,
                                   stderr_log=out.with_suffix(".log"))
            except (RuntimeError, subprocess.TimeoutExpired) as err:  # one broken variant does not lose the others
                result = {"variant": variant, "shape": a.shape, "workload": a.workload,
                          "error": str(err).strip().splitlines()[-1][:300]}
            result["process_s"] = time.perf_counter() - t
        report["results"].append(result)
        out.write_text(json.dumps(report, indent=1, default=str))
        out.with_suffix(".md").write_text(table(report["results"], a.smoke) + "\n")
        if result.get("profile"):
            from update_profile import profile_table

            per_step = result["profile"]["decode_ms_per_step"]
            table_md = profile_table(result["profile"], per_step[-1] if per_step else None)
            Path(f"{out.with_suffix('')}_profile.md").write_text(f"{a.shape} {variant}\n\n{table_md}\n")


def main(argv=None):
    a = parse_args(argv)
    if a.budget_only:
        setup_env(a.threads)
        print(budget_only())
        return 0
    if a.child:  # in a child process: measure, print the result as the last line
        setup_env(a.threads)
        if a.child == "variant" and not a.smoke:
            from trl_ext.runtime.cuda_memory import configure_cuda_allocator

            configure_cuda_allocator(None)  # what `trl-ext train` does before CUDA starts
        child_result(build_child(a) if a.child == "build" else variant_child(a))
        return 0
    for variant in [v.strip() for v in a.variants.split(",") if v.strip()]:
        if base_variant(variant) not in VARIANTS or variant == "trl112" + BEFORE:
            raise SystemExit(f"--variants: unknown variant {variant!r} (choose from {', '.join(VARIANTS)}, each but "
                             f"trl112 also as VARIANT{BEFORE})")
        if variant.endswith(BEFORE) and not a.before_site:
            raise SystemExit(f"--variants: {variant} needs --before-site DIR (a folder holding an earlier trl_ext)")
    out = Path(a.out) if a.out else RESULTS / f"gpu_ppo{a.suffix}_{a.workload}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine_info(), "workload": a.workload, "temperature": TEMPERATURE,
              "workload_note": WORKLOAD_NOTES[a.workload], "runs": [], "results": []}
    for shape in a.shapes:
        a.shape, a.workdir = shape, str(Path(a.workdir_root) / f"{shape}-{a.workload}")
        run_shape(a, out, report)
    print(table(report["results"], a.smoke))
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


WORKLOAD_NOTES = {
    "full": "random weights, no EOS bias: responses run to response_length (rarely an EOS)",
    "uneven": "the random checkpoint's LM-head EOS row is scaled so that the mean per-step EOS probability at the "
              "sampling temperature is 2 / response_length (build.eos_row_scale): response lengths spread "
              "geometrically, as sampled ones do, instead of all running to the limit",
}


if __name__ == "__main__":
    sys.exit(main())
