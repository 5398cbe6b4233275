"""PPO memory: (a) rollout log-probs without the (batch, length, vocab) tensor, vs TRL's rollout.

(a) `rollout`: peak memory of the rollout phase (generation and the sampling log-probs) at response lengths 32, 128
    and 512, trl_ext's rollout (`trl_ext.ppo.rollout.logprobs.generate_with_logprobs`, what `PPOTrainer.
    generate_rollouts` runs) vs TRL's (`batch_generation` with `output_scores`, then `selective_log_softmax` per
    chunk, as TRL 1.12's PPO loop does). A random-initialised Llama with Qwen2.5's real vocabulary (151,936 tokens)
    and a few small layers, built in each child; 32-token random prompts, TRL's rollout sampling config
    (temperature 0.7 + 1e-7, top_k 0, top_p 1) and no stop token, so every response has the full length. Each
    (implementation, length) runs in its own child process; the child builds the model, warms generation up, hands
    freed heap back (glibc malloc_trim), resets the kernel's peak RSS (VmHWM) and reads it after the rollout:
    growth = peak - RSS before. Reported with what the formulas of `trl_ext.ppo.memory.budget` predict: TRL's
    stacked scores (`B*T*V*4` bytes, held twice at its peak) and the KV cache, which grows with T in both.

(b) `shared`: a whole PPO run (trainer construction and `--updates` updates, models already loaded), 4-bit nf4 LoRA
    (r 8 on q and v), reward and value models as separate 4-bit models (today's design: what the recipe
    pipeline loads from a LoRA reward adapter directory) vs as adapters on the policy's base (`shared_base`). A
    random-initialised Llama of 227M parameters (hidden 768, 36 layers, the tiny 519-token vocabulary, so the
    weights dominate), saved once as a float32 checkpoint with a LoRA reward adapter (random weights, score head) on
    it. One child per design: load, then train. Measured: the models' weight bytes (packed 4-bit weights and their
    absmax), the working set after loading and at the run's peak (peak anonymous memory, sampled every 5 ms, over the
    RSS after imports, plus model tensors served from the mapped checkpoint file), and seconds per update.
    Loading itself is left out of the peak: on CPU, quantizing an fp32 checkpoint holds it in float32 for a moment
    (see section 3 of benchmarks/README.md), which no GPU load does. Update time: both designs alternate in one
    process on a smaller model (`--timing-hidden`, `--timing-layers`), `--repeats` times; the time spent switching
    adapters is also counted directly.

(c) `budget`: the memory budget of `trl_ext.ppo.memory.budget` for Llama-3-8B and Qwen2.5-7B at the Qwen2.5-0.5B
    recipe's batch and lengths, TRL's design (separate models, its rollout, logits of every position) vs the shared
    base, and its formulas checked against (a) and (b).

Children run with `MALLOC_MMAP_THRESHOLD_=131072` (a fixed glibc threshold: freed large buffers go back to the OS,
so RSS follows live memory; see benchmarks/README.md, section 3).

    python benchmarks/ppo_memory.py                    # all three parts
    python benchmarks/ppo_memory.py rollout            # (a) only: 6 children, 2-4 minutes on 2 busy CPU cores
    python benchmarks/ppo_memory.py shared budget      # (b) and (c)
    python benchmarks/ppo_memory.py --quick            # lengths 32 and 128; (b) with 8 layers; 1 timing repeat

Prints a table and writes benchmarks/results/ppo_memory.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (child_result, peak_rss_mb, print_table, reset_peak_rss, rss_mb, run_child, setup_env, trim_heap,
                     write_result)  # noqa: E402

QWEN_VOCAB = 151_936
MIB = 2**20


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator``, or None where the denominator is not positive (a peak that did not grow: small
    runs reuse heap freed before the measurement)."""
    return numerator / denominator if denominator > 0 else None


def times(value: float | None) -> str:
    return "-" if value is None else f"x{value:.2f}"


# ---------------------------------------------------------------------------------------------------------------- (a)


def rollout_model_config(a):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=QWEN_VOCAB, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                       num_hidden_layers=a.layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=1024, tie_word_embeddings=False, pad_token_id=0, eos_token_id=None,
                       bos_token_id=None)


def rollout_child(a):
    """One implementation at one response length: peak RSS growth of the rollout phase."""
    setup_env(a.threads)
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(rollout_model_config(a)).to(getattr(torch, a.dtype)).eval()
    model.generation_config.eos_token_id = None
    queries = torch.randint(1, QWEN_VOCAB, (a.batch, a.prompt_length))
    pad = 0

    def config(length):  # TRL 1.12's PPO rollout config (trainer.generation_config)
        return GenerationConfig(max_new_tokens=length, temperature=0.7 + 1e-7, top_k=0.0, top_p=1.0, do_sample=True,
                                pad_token_id=pad, eos_token_id=None)

    def rollout(length):
        if a.impl == "trl":
            try:  # TRL 1.10-1.12
                from trl.experimental.ppo.ppo_trainer import batch_generation
            except ImportError:  # TRL 1.13+: trl-ext's copy of it (equal to TRL 1.12's: tests/ppo/test_ppo_base.py)
                from trl_ext.ppo.rollout.sequences import batch_generation
            from trl.trainer.utils import selective_log_softmax

            query_responses, logitss = batch_generation(model, queries, a.batch, pad, config(length))
            logprobs = []
            for i in range(0, a.batch, a.batch):  # TRL's loop over local_rollout_forward_batch_size chunks
                response = query_responses[i : i + a.batch, a.prompt_length:]
                logprobs.append(selective_log_softmax(logitss[i : i + a.batch], response))
            del logitss
            return query_responses, torch.cat(logprobs, 0)
        from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

        plan = sampling_plan(model, config(length))
        assert plan is not None
        return generate_with_logprobs(model, queries, a.batch, pad, plan)

    with torch.no_grad():
        rollout(4)  # warm-up: first-call allocations of generate
        trim_heap()
        before = rss_mb()
        reset = reset_peak_rss()
        torch.manual_seed(1)
        query_responses, logprobs = rollout(a.length)
        peak = peak_rss_mb()
    assert logprobs.shape == (a.batch, a.length)
    child_result({"impl": a.impl, "length": a.length, "rss_before_mib": before, "peak_growth_mib": peak - before,
                  "peak_reset": reset, "logprob_sum": float(logprobs.sum())})


def run_rollout(a):
    from trl_ext.ppo.memory.budget import ModelShape, kv_cache_bytes, rollout_scores_bytes

    lengths = a.lengths or ([32, 128] if a.quick else [32, 128, 512])
    cfg = ModelShape.from_config(rollout_model_config(a))
    results = []
    for impl in ("trl", "ext"):
        for length in lengths:
            args = ["--child", "rollout", "--impl", impl, "--length", str(length), "--batch", str(a.batch),
                    "--dtype", a.dtype,
                    "--hidden", str(a.hidden), "--layers", str(a.layers), "--prompt-length", str(a.prompt_length),
                    "--threads", str(a.threads)]
            r = run_child(Path(__file__), args, env=CHILD_ENV)
            r["kv_cache_mib"] = kv_cache_bytes(cfg, a.batch, a.prompt_length + length, DTYPE_BYTES[a.dtype]) / MIB
            r["trl_scores_mib"] = rollout_scores_bytes(a.batch, length, QWEN_VOCAB) / MIB
            results.append(r)
            print(f"rollout {impl} length {length}: +{r['peak_growth_mib']:.0f} MiB", flush=True)
    by = {(r["impl"], r["length"]): r for r in results}
    first, last = lengths[0], lengths[-1]
    growth = {impl: ratio(by[(impl, last)]["peak_growth_mib"], by[(impl, first)]["peak_growth_mib"])
              for impl in ("trl", "ext")}
    net = {length: by[("ext", length)]["peak_growth_mib"] - by[("ext", length)]["kv_cache_mib"] for length in lengths}
    growth["ext_without_kv_cache"] = ratio(net[last], net[first])
    print(f"\n(a) Rollout phase: random Llama, vocab {QWEN_VOCAB}, hidden {a.hidden}, {a.layers} layers, batch "
          f"{a.batch}, prompt {a.prompt_length} tokens; peak RSS growth over the rollout, MiB.")
    print_table(
        ["response length", "TRL peak +MiB", "trl_ext peak +MiB", "trl_ext / TRL", "TRL scores tensor (B*T*V*4)",
         f"KV cache ({a.dtype})", "trl_ext peak - KV cache"],
        [[length, by[("trl", length)]["peak_growth_mib"], by[("ext", length)]["peak_growth_mib"],
          ratio(by[("ext", length)]["peak_growth_mib"], by[("trl", length)]["peak_growth_mib"]),
          by[("trl", length)]["trl_scores_mib"], by[("trl", length)]["kv_cache_mib"], net[length]]
         for length in lengths],
    )
    print(f"growth {first} -> {last} tokens: TRL {times(growth['trl'])}, trl_ext {times(growth['ext'])} "
          f"(target: trl_ext <= 1.2x); trl_ext without the KV cache (which grows alike in both) "
          f"{times(growth['ext_without_kv_cache'])}")
    return {"rows": results, "growth_first_to_last": growth, "lengths": lengths}


# ---------------------------------------------------------------------------------------------------------------- (b)

LORA_MODULES = ("q_proj", "v_proj")
LORA = dict(use_peft=True, lora_r=8, lora_alpha=16, lora_target_modules=list(LORA_MODULES))
"""(b)'s adapters: r 8 on q and v (the LoRA paper's setting), so that the weights dominate. With r 16-32 on every
linear layer the adapters' AdamW state outweighs a 4-bit base of this width (see the budget, part c)."""
NF4 = dict(dtype="float32", load_in_4bit=True, bnb_4bit_quant_type="nf4")


def build_shared_models(root: Path, hidden: int, layers: int) -> int:
    """A random Llama (float32 checkpoint) and a LoRA reward adapter on it; returns the parameter count."""
    from trl_ext.testing import build_causal_lm, build_tokenizer, save_scalar_adapter

    tokenizer = build_tokenizer()
    policy = build_causal_lm(tokenizer, hidden_size=hidden, num_layers=layers, intermediate_size=hidden * 8 // 3,
                             num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 192))
    policy.save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    parameters = sum(p.numel() for p in policy.parameters())
    del policy
    save_scalar_adapter(root / "policy", root / "reward_adapter", r=LORA["lora_r"], target_modules=LORA_MODULES)
    return parameters


def load_design(root: Path, design: str, tokenizer):
    """(policy, reward model, value model) as the recipe pipeline loads them, 4-bit nf4 + LoRA."""
    from trl import ModelConfig

    from trl_ext.models import load_policy
    from trl_ext.models.shared_base import add_scalar_adapter
    from trl_ext.recipe_loader.pipeline import load_scalar_checkpoint

    adapter = root / "reward_adapter"
    policy = load_policy(ModelConfig(model_name_or_path=str(root / "policy"), **LORA, **NF4), tokenizer=tokenizer)
    if design == "shared":
        return (policy, add_scalar_adapter(policy, "reward", source=adapter, trainable=False),
                add_scalar_adapter(policy, "value", source=adapter, trainable=True))
    reward = load_scalar_checkpoint(ModelConfig(model_name_or_path=str(adapter), **NF4), trainable=False,
                                    tokenizer=tokenizer).eval()
    for p in reward.parameters():
        p.requires_grad_(False)
    value = load_scalar_checkpoint(ModelConfig(model_name_or_path=str(adapter), use_peft=True, **NF4), trainable=True,
                                   tokenizer=tokenizer)
    return policy, reward, value


def ppo_config(batch, response_length, updates, **extra):
    from _ppo_setup import config_kwargs

    return config_kwargs(batch=batch, response_length=response_length, updates=updates, micro_batch=2,
                         mini_batches=1, ppo_epochs=1, **extra)


def shared_inputs(a):
    """(model folder, its tokenizer padding on the left, the prompts): what every part-(b) child starts from."""
    from transformers import AutoTokenizer

    from _ppo_setup import prompts

    root = Path(a.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(root / "policy")
    tokenizer.padding_side = "left"
    return root, tokenizer, prompts(tokenizer, n=4 * a.shared_batch)


def shared_child(a):
    """One design: load, then a PPO run; weight bytes, working set after loading and at the run's peak."""
    setup_env(a.threads)
    import bitsandbytes  # noqa: F401 - imported before the baseline, as every design does
    import peft  # noqa: F401
    import torch  # noqa: F401

    from _ppo_setup import UpdateTimer, seed_all
    from _common import AnonPeakSampler, rss_parts_mb
    from quantization_memory import mapped_checkpoint_bytes
    from trl_ext import PPOConfig, PPOTrainer

    root, tokenizer, data = shared_inputs(a)
    trim_heap()
    base = rss_parts_mb()
    seed_all(0)
    policy, reward, value = load_design(root, a.design, tokenizer)
    trim_heap()
    loaded = rss_parts_mb()
    from trl_ext.ppo.memory.budget import held_weight_bytes

    weights = held_weight_bytes(policy, reward, value)
    timer = UpdateTimer()
    trainer = PPOTrainer(args=PPOConfig(**ppo_config(a.shared_batch, a.shared_response_length, a.updates)),
                         processing_class=tokenizer, model=policy, ref_model=None, reward_model=reward,
                         value_model=value, train_dataset=data, callbacks=[timer])
    trim_heap()
    reset_peak_rss()
    with AnonPeakSampler() as run:
        trainer.train()
    mapped = mapped_checkpoint_bytes([policy, reward, value]) / MIB
    child_result({
        "design": a.design, "weights_mib": weights / MIB, "mapped_weights_mib": mapped,
        "loaded_working_set_mib": loaded["anon"] - base["anon"] + mapped,
        "run_peak_working_set_mib": run.peak_mb - base["anon"] + mapped,
        "run_peak_rss_growth_mib": peak_rss_mb() - (base["anon"] + base["file"]),
        "s_per_update": sum(timer.seconds) / len(timer.seconds),
        "prompt_length": max(len(ids) for ids in data["input_ids"]),
    })


def timing_child(a):
    """Both designs in this process, alternating: seconds per update, and the share spent switching adapters."""
    setup_env(a.threads)
    import time

    import trl_ext.models.shared_base as shared_base
    from _common import alternate, freeze_gc, median, ratios
    from _ppo_setup import UpdateTimer, seed_all
    from trl_ext import PPOConfig, PPOTrainer

    root, tokenizer, data = shared_inputs(a)
    seed_all(0)
    models = {design: load_design(root, design, tokenizer) for design in ("separate", "shared")}
    freeze_gc()
    switching = {"seconds": 0.0}
    write_state = shared_base._write_state

    def timed_write_state(*args, **kwargs):
        t = time.perf_counter()
        try:
            return write_state(*args, **kwargs)
        finally:
            switching["seconds"] += time.perf_counter() - t

    shared_base._write_state = timed_write_state

    def run(design):
        def once():
            policy, reward, value = models[design]
            timer = UpdateTimer()
            trainer = PPOTrainer(args=PPOConfig(**ppo_config(a.shared_batch, a.shared_response_length,
                                                             a.timing_updates)),
                                 processing_class=tokenizer, model=policy, ref_model=None, reward_model=reward,
                                 value_model=value, train_dataset=data, callbacks=[timer])
            before = switching["seconds"]
            trainer.train()
            if design == "shared":
                switching.setdefault("shares", []).append(
                    (switching["seconds"] - before) / sum(timer.seconds))
            return sum(timer.seconds[1:]) / (len(timer.seconds) - 1)

        return once

    times = alternate({design: run(design) for design in ("separate", "shared")}, a.repeats)
    r = ratios(times["shared"], times["separate"])
    child_result({"s_per_update": {d: median(v) for d, v in times.items()}, "ratio_median": median(r),
                  "ratios": r, "switching_share_median": median(switching["shares"]),
                  "switching_shares": switching["shares"]})


def run_shared(a):
    import tempfile

    results = {}
    with tempfile.TemporaryDirectory(prefix="ppo-memory-") as tmp:
        parameters = build_shared_models(Path(tmp) / "big", a.shared_hidden, a.shared_layers)
        from transformers import AutoConfig

        from trl_ext.ppo.memory.budget import ModelShape

        shape = vars(ModelShape.from_config(AutoConfig.from_pretrained(Path(tmp) / "big" / "policy")))
        common = ["--model-dir", str(Path(tmp) / "big"), "--threads", str(a.threads), "--updates", str(a.updates),
                  "--shared-batch", str(a.shared_batch), "--shared-response-length", str(a.shared_response_length)]
        for design in ("separate", "shared"):
            results[design] = run_child(Path(__file__), ["--child", "shared", "--design", design, *common],
                                        env=CHILD_ENV)
            print(f"(b) {design}: done", flush=True)
        timing_parameters = build_shared_models(Path(tmp) / "small", a.timing_hidden, a.timing_layers)
        timing = run_child(Path(__file__), ["--child", "timing", "--model-dir", str(Path(tmp) / "small"),
                                            "--threads", str(a.threads), "--repeats", str(a.repeats),
                                            "--timing-updates", str(a.timing_updates), "--shared-batch",
                                            str(a.shared_batch), "--shared-response-length",
                                            str(a.shared_response_length)], env=CHILD_ENV)
    sep, sh = results["separate"], results["shared"]
    peak_ratio = sh["run_peak_working_set_mib"] / sep["run_peak_working_set_mib"]
    print(f"\n(b) Whole PPO run, 4-bit nf4 LoRA r {LORA['lora_r']} on {'/'.join(LORA_MODULES)}: random Llama, "
          f"{parameters / 1e6:.1f}M parameters (hidden {a.shared_hidden}, {a.shared_layers} layers); batch "
          f"{a.shared_batch}, response {a.shared_response_length}, {a.updates} update(s). MiB over the RSS after "
          "imports.")
    print_table(
        ["design", "weights (packed + absmax)", "working set after loading", "run peak working set", "x separate",
         "peak RSS growth (VmHWM, incl. checkpoint page cache)", "s/update"],
        [[r["design"], r["weights_mib"], r["loaded_working_set_mib"], r["run_peak_working_set_mib"],
          r["run_peak_working_set_mib"] / sep["run_peak_working_set_mib"], r["run_peak_rss_growth_mib"],
          r["s_per_update"]] for r in (sep, sh)],
    )
    print(f"run peak, shared / separate: {peak_ratio:.2f} (target <= 0.45)")
    print(f"update time ({timing_parameters / 1e6:.1f}M-parameter model, {a.repeats} alternating repeats x "
          f"{a.timing_updates - 1} timed updates): shared / separate {timing['ratio_median']:.3f} (per-repeat "
          f"{min(timing['ratios']):.2f}-{max(timing['ratios']):.2f}); adapter switching "
          f"{100 * timing['switching_share_median']:.2f} % of the shared update (target < 5 %)")
    return {"parameters": parameters, "separate": sep, "shared": sh, "peak_ratio": peak_ratio, "timing": timing,
            "timing_parameters": timing_parameters, "shape": shape, "prompt_length": sh["prompt_length"]}


# ---------------------------------------------------------------------------------------------------------------- (c)

RECIPE = dict(batch=8 * 8, micro_batch=8, rollout_chunk=64, prompt_length=512, response_length=64, lora_r=32,
              quantization="nf4")
"""recipes/qwen2.5-0.5b/ppo.yaml: per_device_train_batch_size 8 x gradient_accumulation_steps 8, TRL's default
local_rollout_forward_batch_size 64, response_length 64, lora_r 32, nf4; prompts of up to 512 tokens (TL;DR posts)."""
FITTING = dict(RECIPE, micro_batch=2, rollout_chunk=8)
"""The same 64 episodes per update with per_device_train_batch_size 2 x gradient_accumulation_steps 32 and
local_rollout_forward_batch_size 8."""


def run_budget(a, results):
    from dataclasses import replace

    from trl_ext.ppo.memory.budget import (
        LLAMA_3_8B,
        QWEN2_5_7B,
        STREAMING_STEP_COPIES,
        ModelShape,
        PPOShape,
        base_weight_bytes,
        budget_table,
        kv_cache_bytes,
        lora_parameters,
        ppo_memory_budget,
        rollout_scores_bytes,
    )

    out = {"checks": {}}
    if "rollout" in results:  # rollout formulas vs (a)
        shape = ModelShape.from_config(rollout_model_config(a))
        rows = []
        for r in results["rollout"]["rows"]:
            kv = kv_cache_bytes(shape, a.batch, a.prompt_length + r["length"], DTYPE_BYTES[a.dtype])
            predicted = (2 * rollout_scores_bytes(a.batch, r["length"], QWEN_VOCAB) if r["impl"] == "trl"
                         else STREAMING_STEP_COPIES * a.batch * QWEN_VOCAB * 4) + kv
            rows.append([r["impl"], r["length"], predicted / MIB, r["peak_growth_mib"],
                         r["peak_growth_mib"] / (predicted / MIB)])
        print("\n(c) check against (a): rollout peak growth, formula vs measured (MiB)")
        print_table(["rollout", "length", "formula", "measured", "measured / formula"], rows)
        out["checks"]["rollout"] = rows
    if "shared" in results:  # weight and run-peak formulas vs (b)
        b = results["shared"]
        shape = ModelShape(**b["shape"])
        run = PPOShape(batch=a.shared_batch, micro_batch=2, rollout_chunk=a.shared_batch,
                       prompt_length=b["prompt_length"], response_length=a.shared_response_length,
                       lora_r=LORA["lora_r"], lora_modules=LORA_MODULES, quantization="nf4", dtype_bytes=4)
        lora = lora_parameters(shape, LORA["lora_r"], LORA_MODULES) * 4
        weights = {"separate": base_weight_bytes(shape, "nf4") + 2 * base_weight_bytes(shape, "nf4", lm_head=False)
                   + 3 * lora, "shared": base_weight_bytes(shape, "nf4") + 3 * lora}
        rows = []
        for design in ("separate", "shared"):
            budget = ppo_memory_budget(shape, run, shared=design == "shared")
            predicted_peak = budget.persistent + max(budget.phases.values())
            rows.append([design, weights[design] / MIB, b[design]["weights_mib"], b[design]["weights_mib"] * MIB /
                         weights[design], predicted_peak / MIB, b[design]["run_peak_working_set_mib"],
                         b[design]["run_peak_working_set_mib"] * MIB / predicted_peak])
        print("\n(c) check against (b): weights and run peak, formula vs measured (MiB)")
        print_table(["design", "weights formula", "weights measured", "ratio", "peak formula", "peak measured",
                     "ratio"], rows)
        print(f"shared / separate run peak: formula {rows[1][4] / rows[0][4]:.2f}, measured {b['peak_ratio']:.2f}")
        out["checks"]["shared"] = rows
    tables = {}
    for name, settings in (("recipe settings", RECIPE), ("fitting settings", FITTING),
                           ("fitting settings, 512 new tokens", dict(FITTING, response_length=512))):
        budgets = []
        for model in (LLAMA_3_8B, QWEN2_5_7B):
            for shared, streaming in ((False, False), (True, True)):
                run = replace(PPOShape(**settings), streaming_logprobs=streaming, response_logits_only=streaming)
                budget = ppo_memory_budget(model, run, shared=shared)
                budget.design = ("TRL's design: separate models, TRL rollout" if not shared
                                 else "shared base, streamed log-probs")
                budgets.append(budget)
        tables[name] = budget_table(budgets)
        print(f"\n(c) PPO memory budget (GiB), 4-bit nf4 LoRA r 32, {name}: {settings}")
        print(tables[name])
    out["tables"] = tables
    return out


# ---------------------------------------------------------------------------------------------------------------- main

CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
PARTS = ("rollout", "shared", "budget")
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="*", metavar="PART", help=f"which measurements: {', '.join(PARTS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="fewer lengths / a smaller model")
    p.add_argument("--batch", type=int, default=4, help="(a) rollout batch (one generation chunk)")
    p.add_argument("--hidden", type=int, default=256, help="(a) hidden size")
    p.add_argument("--layers", type=int, default=2, help="(a) decoder layers")
    p.add_argument("--prompt-length", type=int, default=32)
    p.add_argument("--lengths", type=int, nargs="+", default=None,
                   help="(a) response lengths (default 32 128 512; --quick: 32 128)")
    p.add_argument("--dtype", choices=list(DTYPE_BYTES), default="bfloat16",
                   help="(a) model weights and KV cache (scores are float32 in both implementations)")
    p.add_argument("--shared-hidden", type=int, default=768, help="(b) hidden size (a multiple of 64)")
    p.add_argument("--shared-layers", type=int, default=36, help="(b) decoder layers")
    p.add_argument("--shared-batch", type=int, default=2, help="(b) episodes per update")
    p.add_argument("--shared-response-length", type=int, default=8)
    p.add_argument("--updates", type=int, default=1,
                   help="(b) PPO updates in the memory runs (the first already holds everything: AdamW state is "
                        "allocated at its first step)")
    p.add_argument("--timing-hidden", type=int, default=256, help="(b) hidden size of the timing model")
    p.add_argument("--timing-layers", type=int, default=4)
    p.add_argument("--timing-updates", type=int, default=3, help="(b) updates per timed run (the first is not timed)")
    p.add_argument("--repeats", type=int, default=5, help="(b) alternating timing repeats")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--child", choices=["rollout", "shared", "timing"], help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=["trl", "ext"], help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    p.add_argument("--design", choices=["separate", "shared"], help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = set(a.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")
    a.parts = a.parts or list(PARTS)
    if a.quick and not a.child:
        a.shared_layers, a.repeats = 8, 1
    if a.child:
        return {"rollout": rollout_child, "shared": shared_child, "timing": timing_child}[a.child](a)
    setup_env(a.threads)
    results = {}
    if "rollout" in a.parts:
        results["rollout"] = run_rollout(a)
    if "shared" in a.parts:
        results["shared"] = run_shared(a)
    if "budget" in a.parts:
        results["budget"] = run_budget(a, results)
    write_result("ppo_memory", vars(a), results, out=a.out)


if __name__ == "__main__":
    main()
