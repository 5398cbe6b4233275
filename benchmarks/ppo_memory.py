"""PPO memory (issue 11): (a) rollout log-probs without the (batch, length, vocab) tensor, vs TRL's rollout.

(a) `rollout`: peak memory of the rollout phase (generation and the sampling log-probs) at response lengths 32, 128
    and 512, trl_ext's rollout (`trl_ext.ppo.rollout_logprobs.generate_with_logprobs`, what `PPOTrainer.
    generate_rollouts` runs) vs TRL's (`batch_generation` with `output_scores`, then `selective_log_softmax` per
    chunk, as TRL 1.12's PPO loop does). A random-initialised Llama with Qwen2.5's real vocabulary (151,936 tokens)
    and a few small layers, built in each child; 32-token random prompts, TRL's rollout sampling config
    (temperature 0.7 + 1e-7, top_k 0, top_p 1) and no stop token, so every response has the full length. Each
    (implementation, length) runs in its own child process; the child builds the model, warms generation up, hands
    freed heap back (glibc malloc_trim), resets the kernel's peak RSS (VmHWM) and reads it after the rollout:
    growth = peak - RSS before. Reported with what the formulas of `trl_ext.ppo.memory_budget` predict: TRL's
    stacked scores (`B*T*V*4` bytes, held twice at its peak) and the KV cache, which grows with T in both.

Children run with `MALLOC_MMAP_THRESHOLD_=131072` (a fixed glibc threshold: freed large buffers go back to the OS,
so RSS follows live memory; see benchmarks/README.md, section 3).

    python benchmarks/ppo_memory.py rollout            # about 1-2 minutes on 2 busy CPU cores (6 children)
    python benchmarks/ppo_memory.py rollout --quick    # lengths 32 and 128 only

Prints a table and writes benchmarks/results/ppo_memory.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    child_result,
    peak_rss_mb,
    print_table,
    reset_peak_rss,
    rss_mb,
    run_child,
    setup_env,
    trim_heap,
    write_result,
)

QWEN_VOCAB = 151_936
MIB = 2**20


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
            from trl.experimental.ppo.ppo_trainer import batch_generation
            from trl.trainer.utils import selective_log_softmax

            query_responses, logitss = batch_generation(model, queries, a.batch, pad, config(length))
            logprobs = []
            for i in range(0, a.batch, a.batch):  # TRL's loop over local_rollout_forward_batch_size chunks
                response = query_responses[i : i + a.batch, a.prompt_length:]
                logprobs.append(selective_log_softmax(logitss[i : i + a.batch], response))
            del logitss
            return query_responses, torch.cat(logprobs, 0)
        from trl_ext.ppo.rollout_logprobs import generate_with_logprobs, sampling_plan

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
    from trl_ext.ppo.memory_budget import ModelShape, kv_cache_bytes, rollout_scores_bytes

    lengths = [32, 128] if a.quick else [32, 128, 512]
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
    growth = {impl: by[(impl, last)]["peak_growth_mib"] / by[(impl, first)]["peak_growth_mib"]
              for impl in ("trl", "ext")}
    net = {length: by[("ext", length)]["peak_growth_mib"] - by[("ext", length)]["kv_cache_mib"] for length in lengths}
    growth["ext_without_kv_cache"] = net[last] / net[first]
    print(f"\n(a) Rollout phase: random Llama, vocab {QWEN_VOCAB}, hidden {a.hidden}, {a.layers} layers, batch "
          f"{a.batch}, prompt {a.prompt_length} tokens; peak RSS growth over the rollout, MiB.")
    print_table(
        ["response length", "TRL peak +MiB", "trl_ext peak +MiB", "trl_ext / TRL", "TRL scores tensor (B*T*V*4)",
         f"KV cache ({a.dtype})", "trl_ext peak - KV cache"],
        [[length, by[("trl", length)]["peak_growth_mib"], by[("ext", length)]["peak_growth_mib"],
          by[("ext", length)]["peak_growth_mib"] / by[("trl", length)]["peak_growth_mib"],
          by[("trl", length)]["trl_scores_mib"], by[("trl", length)]["kv_cache_mib"], net[length]]
         for length in lengths],
    )
    print(f"growth {first} -> {last} tokens: TRL x{growth['trl']:.2f}, trl_ext x{growth['ext']:.2f} "
          f"(target: trl_ext <= 1.2x); trl_ext without the KV cache (which grows alike in both) "
          f"x{growth['ext_without_kv_cache']:.2f}")
    return {"rows": results, "growth_first_to_last": growth, "lengths": lengths}


# ---------------------------------------------------------------------------------------------------------------- main

CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
PARTS = ("rollout",)
DTYPE_BYTES = {"bfloat16": 2, "float32": 4}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("parts", nargs="*", metavar="PART", help=f"which measurements: {', '.join(PARTS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="fewer lengths / a smaller model")
    p.add_argument("--batch", type=int, default=4, help="(a) rollout batch (one generation chunk)")
    p.add_argument("--hidden", type=int, default=256, help="(a) hidden size")
    p.add_argument("--layers", type=int, default=2, help="(a) decoder layers")
    p.add_argument("--prompt-length", type=int, default=32)
    p.add_argument("--dtype", choices=list(DTYPE_BYTES), default="bfloat16",
                   help="(a) model weights and KV cache (scores are float32 in both implementations)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    p.add_argument("--child", choices=["rollout"], help=argparse.SUPPRESS)
    p.add_argument("--impl", choices=["trl", "ext"], help=argparse.SUPPRESS)
    p.add_argument("--length", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    unknown = set(a.parts) - set(PARTS)
    if unknown:
        p.error(f"unknown part(s) {sorted(unknown)}; choose from {', '.join(PARTS)}")
    a.parts = a.parts or list(PARTS)
    if a.child == "rollout":
        return rollout_child(a)
    setup_env(a.threads)
    results = {}
    if "rollout" in a.parts:
        results["rollout"] = run_rollout(a)
    write_result("ppo_memory", vars(a), results, out=a.out)


if __name__ == "__main__":
    main()
