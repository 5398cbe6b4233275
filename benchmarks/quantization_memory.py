"""Policy weight memory and peak RSS of a short PPO run: fp32 vs bf16 vs 8-bit vs 4-bit nf4 LoRA, and a LoRA policy
whose reference is its own base (adapters disabled) vs a full copy as reference.

A random-initialised Llama policy (default hidden 768, 10 layers: ~64M parameters, so its weights dominate) is
built locally and saved once; value and reward models are tiny (hidden 64) so that the policy is what differs.
Each variant runs in its own child process: load the policy with `trl_ext.models.load_policy` from a
`trl.ModelConfig` (LoRA r 16 on all linear layers), then a tiny trl_ext PPO run (`--updates` updates of batch 2,
response 8, 4 PPO epochs). Measured per variant:

  weights MiB         bytes of the policy's parameters and buffers as stored (packed 4/8-bit; LoRA included),
  load peak +MiB      peak RSS growth while loading the policy over the RSS after imports (anonymous part in
                      brackets); the 8/4-bit and bf16 variants read the fp32 checkpoint to convert it,
  PPO peak anon +MiB  peak anonymous memory (heap, tensors) from after the imports to the end of training, sampled
                      every 5 ms: models, trainer, optimizer states, gradients, activations, dequantized buffers,
  weights in mapped file MiB  model tensors that transformers serves straight from the memory-mapped safetensors
                      checkpoint (zero-copy fp32 loading): resident file pages, not anonymous memory,
  working set +MiB    PPO peak anon + weights in mapped file: what the run needs on top of the libraries,
  PPO peak RSS +MiB   the kernel's peak RSS growth (VmHWM) during training over the post-import RSS; it also counts
                      the pages of the fp32 checkpoint that loading touched and that stay mapped (clean page cache:
                      the 8/4-bit variants keep the mapping alive through their unquantized embedding/head tensors),
  peak RSS MiB        the child's whole peak, libraries included (~600 MiB of them),
  s/update            wall time per PPO update (CPU bitsandbytes kernels are not what a GPU runs: only indicative).

Peak RSS: `getrusage` maxima only grow, so the child resets VmHWM (/proc/self/clear_refs) at each stage, after
handing freed heap memory back to the OS (glibc malloc_trim), so that RSS reads live memory.

Anonymous memory also holds freed heap that glibc keeps: its mmap threshold rises after large frees, so the
per-matmul dequantization buffers of CPU bitsandbytes end up reused heap rather than returned mappings. Run with
`MALLOC_MMAP_THRESHOLD_=131072` (a fixed threshold; children inherit it) to see live memory instead.

    python benchmarks/quantization_memory.py              # 1-2 minutes on 2 busy CPU cores (6 children)
    python benchmarks/quantization_memory.py --quick      # hidden 512, 6 layers, 1 update (~1 min: imports dominate)

Prints a table and writes benchmarks/results/quantization_memory.json.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (AnonPeakSampler, child_result, peak_rss_mb, print_table, reset_peak_rss, rss_mb, rss_parts_mb,
                     run_child, setup_env, trim_heap, write_result)  # noqa: E402

# name -> (ModelConfig fields, reference)
VARIANTS = {
    "fp32 LoRA": ({"dtype": "float32", "use_peft": True}, "adapters off"),
    "bf16 LoRA": ({"dtype": "bfloat16", "use_peft": True}, "adapters off"),
    "8-bit LoRA": ({"dtype": "float32", "use_peft": True, "load_in_8bit": True}, "adapters off"),
    "4-bit nf4 LoRA": ({"dtype": "float32", "use_peft": True, "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
                       "adapters off"),
    "fp32 LoRA, full ref copy": ({"dtype": "float32", "use_peft": True}, "full copy"),  # as create_reference_model
    "fp32 full fine-tuning": ({"dtype": "float32"}, "full copy"),
}


def build_models(root: Path, hidden: int, layers: int) -> int:
    """Save the tokenizer, the policy (random init, fp32) and a tiny scalar model under `root`; return parameters."""
    from trl_ext.testing import build_causal_lm, build_scalar_model, build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(root / "policy")
    policy = build_causal_lm(tokenizer, hidden_size=hidden, num_layers=layers, intermediate_size=hidden * 8 // 3,
                             num_attention_heads=hidden // 64, num_key_value_heads=max(1, hidden // 192))
    policy.save_pretrained(root / "policy")
    build_scalar_model(tokenizer).save_pretrained(root / "scalar")
    tokenizer.save_pretrained(root / "scalar")
    return sum(p.numel() for p in policy.parameters())


def weight_bytes(model) -> int:
    """Bytes held by a model's parameters and buffers as stored (4-bit: packed uint8; 8-bit: int8)."""
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def child(a):
    setup_env(a.threads)
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl import ModelConfig

    from _ppo_setup import config_kwargs, prompts, seed_all
    from trl_ext import PPOConfig, PPOTrainer
    from trl_ext.models import load_policy

    fields, reference = VARIANTS[a.child]
    root = Path(a.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(root / "policy")
    tokenizer.padding_side = "left"
    data = prompts(tokenizer, n=8)
    import bitsandbytes  # noqa: F401 - imported by every variant before the baseline, so no import is measured
    import peft  # noqa: F401

    trim_heap()
    base_rss, base_parts = rss_mb(), rss_parts_mb()
    reset_peak_rss()
    seed_all(0)
    model_args = ModelConfig(model_name_or_path=str(root / "policy"), lora_target_modules=["all-linear"], **fields)
    with AnonPeakSampler() as load_sampler:
        policy = load_policy(model_args, tokenizer=tokenizer)
    load_peak = peak_rss_mb()
    weights = weight_bytes(policy) / 2**20
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    ref = None
    if reference == "full copy" and fields.get("use_peft"):
        # A copy in its own memory, as TRL's create_reference_model makes (a second zero-copy load of the same
        # checkpoint would share the policy's page cache on CPU, which no GPU setup does).
        ref = copy.deepcopy(AutoModelForCausalLM.from_pretrained(root / "policy", dtype=torch.float32))
    value = AutoModelForSequenceClassification.from_pretrained(root / "scalar")
    reward = AutoModelForSequenceClassification.from_pretrained(root / "scalar")
    config = config_kwargs(batch=2, response_length=8, updates=a.updates, micro_batch=2, mini_batches=1)
    trainer = PPOTrainer(args=PPOConfig(**config), processing_class=tokenizer, model=policy, ref_model=ref,
                         reward_model=reward, value_model=value, train_dataset=data)
    setup_peak = peak_rss_mb()
    trim_heap()
    before_train, before_parts = rss_mb(), rss_parts_mb()
    reset_peak_rss()
    t = time.perf_counter()
    with AnonPeakSampler() as train_sampler:
        trainer.train()
    seconds = (time.perf_counter() - t) / a.updates
    train_peak = peak_rss_mb()
    mapped = mapped_checkpoint_bytes([trainer.model, trainer.ref_model, reward]) / 2**20
    end_parts = rss_parts_mb()
    child_result({
        "variant": a.child, "reference": reference, "weights_mib": weights, "trainable_parameters": trainable,
        "rss_after_imports_mib": base_rss,
        "load_peak_growth_mib": load_peak - base_rss,
        "load_peak_anon_growth_mib": load_sampler.peak_mb - base_parts["anon"],
        "resident_before_train_growth_mib": before_train - base_rss,
        "resident_before_train_anon_growth_mib": before_parts["anon"] - base_parts["anon"],
        "resident_before_train_file_growth_mib": before_parts["file"] - base_parts["file"],
        "run_peak_anon_growth_mib": train_sampler.peak_mb - base_parts["anon"],
        "run_peak_growth_mib": train_peak - base_rss,
        "file_growth_at_end_mib": end_parts["file"] - base_parts["file"],
        "weights_served_from_checkpoint_mapping_mib": mapped,
        "working_set_mib": train_sampler.peak_mb - base_parts["anon"] + mapped,
        "peak_rss_mib": max(load_peak, setup_peak, train_peak),
        "s_per_update": seconds,
    })


def mapped_checkpoint_bytes(models) -> int:
    """Bytes of the models' frozen tensors that live in a mapped *.safetensors file (zero-copy loading) rather than
    in anonymous memory. Each file page range is counted once (two models mapping the same checkpoint share its page
    cache); trainable tensors are left out (the optimizer's writes copy their pages into anonymous memory)."""
    maps = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[-1].endswith(".safetensors"):
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                maps.append((lo, hi, int(fields[2], 16), fields[-1]))
    seen, total = set(), 0
    for model in models:
        if model is None:
            continue
        for tensor in list(model.parameters()) + list(model.buffers()):
            if tensor.requires_grad:
                continue
            storage = tensor.untyped_storage()
            ptr = storage.data_ptr()
            for lo, hi, offset, path in maps:
                if lo <= ptr < hi:
                    key = (path, ptr - lo + offset)
                    if key not in seen:
                        seen.add(key)
                        total += storage.nbytes()
                    break
    return total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="hidden 512, 6 layers, 1 update")
    p.add_argument("--hidden", type=int, default=768, help="multiple of 64 (bitsandbytes CPU kernels)")
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--updates", type=int, default=2)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), metavar="VARIANT")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.hidden, a.layers, a.updates = 512, 6, 1
    if a.child:
        return child(a)
    setup_env(a.threads)
    with tempfile.TemporaryDirectory(prefix="quant-bench-") as tmp:
        parameters = build_models(Path(tmp), a.hidden, a.layers)
        results = []
        for name in a.variants:
            results.append(run_child(Path(__file__), ["--child", name, "--model-dir", tmp, "--updates",
                                                      str(a.updates), "--threads", str(a.threads)]))
            print(f"{name}: done", flush=True)
    fp32 = next((r for r in results if r["variant"] == "fp32 LoRA"), results[0])
    print(f"\nPolicy: random Llama, {parameters / 1e6:.1f}M parameters (hidden {a.hidden}, {a.layers} layers); PPO "
          f"{a.updates} update(s), batch 2, response 8; tiny value/reward models. MiB; ratios vs fp32 LoRA.")
    print_table(
        ["variant", "reference", "weights MiB", "x fp32", "load peak +MiB (anon)", "PPO peak anon +MiB",
         "weights in mapped file MiB", "working set +MiB", "x fp32", "PPO peak RSS +MiB", "peak RSS MiB", "s/update"],
        [[r["variant"], r["reference"], r["weights_mib"], r["weights_mib"] / fp32["weights_mib"],
          f"{r['load_peak_growth_mib']:.0f} ({r['load_peak_anon_growth_mib']:.0f})", r["run_peak_anon_growth_mib"],
          r["weights_served_from_checkpoint_mapping_mib"], r["working_set_mib"],
          r["working_set_mib"] / fp32["working_set_mib"], r["run_peak_growth_mib"], r["peak_rss_mib"],
          r["s_per_update"]] for r in results],
    )
    write_result("quantization_memory", vars(a), results, out=a.out, policy_parameters=parameters)


if __name__ == "__main__":
    main()
