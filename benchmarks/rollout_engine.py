"""Rollout engines: `generate` (whole batch, chunks) vs continuous batching, tokens/s and peak memory; and the
tolerance between the engine's log-probs and the trainer's teacher-forced ones (`--tolerance`).

Model: a random Llama (hidden 256, 4 layers, vocabulary 2048, built in memory) whose EOS probability is set by hand
(:func:`build_model`): an embedding dimension held at a constant carries through the residual stream, and only the EOS
row of the LM head reads it, so every step stops a response with probability ~1/50 (mean length ~50 tokens,
geometric spread) while the other tokens stay near-uniform. Two workloads, 32 prompts of 8-64 random tokens, sampling
at temperature 1: **uneven** (EOS stops responses, up to 192 new tokens) and **fixed** (no stop token: every response
runs to 96 tokens, what TRL's PPO does without `stop_token`). Variants: `generate` on the whole batch (chunk 32),
`generate` in chunks of 8, continuous batching with the cache of one chunk of 32 and of 8
(:func:`trl_ext.ppo.rollout.engine.engine_cache_plan`), each with and without a LoRA adapter (r 16 on q/k/v/o).

- **tokens/s**: response tokens up to and including the stop token (what the trainer keeps) per second of rollout,
  in one process, variants alternating (A B C D, B C D A, ...; `_common.alternate`) after one warm-up call each;
  the ratio to `generate` (whole batch) is the median of the per-repeat ratios.
- **peak memory**: one fresh child process per variant (`_common.run_child`); the peak RSS growth over two
  rollouts from the RSS before the first (which builds the engine's cache; kept for the run, so it counts).

`--threshold`: the auto rule's response-length threshold (continuous batching vs `generate` as `response_length`
grows, uneven lengths). `--memory-only`: only the children.

Sizes: `--hidden`, `--layers`, `--vocab` (the model above), `--prompts` (32), `--max-new-tokens` (caps every
response length of the workloads and of `--tolerance`; default: none), `--threshold-lengths` (16 32 64 128). The
defaults are the measured settings; small ones make a smoke run of seconds.

`--tolerance`: max |engine log-prob - teacher-forced log-prob| over the positions the trainer keeps, CPU float32,
temperatures 0.7/1.0/1.3 with a stop token, tiny and this model, with and without LoRA; the same for `generate`'s
streamed log-probs; and top-k/top-p, where the engine's log-probs are those of the truncated distribution (the
trainer recomputes them).

`--verifiable`: whole PPO updates of the verifiable task (``benchmarks/verifiable.py``'s setup: its SFT warm start,
``make_rl_trainer`` with the exact-match reward function, GRPO k=4 with the recipe's settings) with ``rollout_engine:
generate`` against ``continuous_batching``: seconds per update and per phase (``time/rollout``, ``time/scoring``,
``time/optimization``), runs of each engine alternating in this process; at the recipe's ``response_length`` (5) and at
64 (the same stop token; lengths are what the SFT model samples: `--sft-steps` trains a weaker warm start, which has
not yet learnt to stop after the answer, so that its lengths are uneven).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (alternate, child_result, load_average, median, peak_rss_mb, print_table, ratios, reset_peak_rss,
                     rss_mb, run_child, setup_env, trim_heap, write_result)  # noqa: E402

PAD, EOS = 0, 1
WORKLOADS = {"uneven": dict(response_length=192, stop=True), "fixed": dict(response_length=96, stop=False)}
VARIANTS = {"generate (whole batch)": ("generate", 32), "generate (chunks of 8)": ("generate", 8),
            "continuous batching (cache of 32)": ("cb", 32), "continuous batching (cache of 8)": ("cb", 8)}
EOS_LOGIT = 3.73  # exp(3.73) / (exp(3.73) + 2047) ~ 1/50


def build_model(hidden=256, layers=4, vocab=2048, lora=False, seed=0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=int(hidden * 2.6875),
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=1024, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        k = hidden - 1  # the constant dimension: ~sqrt(hidden) after the final RMSNorm
        model.model.embed_tokens.weight[:, k] = 1.0
        model.lm_head.weight[:, k] = 0.0
        model.lm_head.weight[EOS] = 0.0
        probe = torch.randint(3, vocab, (4, 32), generator=torch.Generator().manual_seed(seed))
        normed = model.model.norm(model.model(input_ids=probe).last_hidden_state)[..., k]
        model.lm_head.weight[EOS, k] = EOS_LOGIT / float(normed.mean())  # EOS logit ~EOS_LOGIT at every step
    model.generation_config.eos_token_id = None  # as TRL's PPO sets it without a stop token; the workloads pass EOS
    model.generation_config.pad_token_id = PAD
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj",
                                                                                        "o_proj"]))
    return model


def prompts(n=32, low=8, high=64, vocab=2048, seed=1):
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (n,), generator=g)
    width = int(lengths.max())
    out = torch.full((n, width), PAD, dtype=torch.long)
    for i, n_tokens in enumerate(lengths.tolist()):
        out[i, width - n_tokens:] = torch.randint(3, vocab, (n_tokens,), generator=g)
    return out


def generation_config(response_length, stop, temperature=1.0, **extra):
    from transformers import GenerationConfig

    return GenerationConfig(**{"max_new_tokens": response_length, "do_sample": True, "temperature": temperature + 1e-7,
                               "top_k": 0, "top_p": 1.0, "eos_token_id": EOS if stop else None, "pad_token_id": PAD,
                               **extra})


def kept_tokens(query_responses, context_length, stop=True):
    """Response tokens the trainer keeps: before the first pad, after truncating at the first EOS if `stop` (with no
    stop token TRL's PPO keeps every token)."""
    from trl_ext.ppo.rollout.sequences import first_true_indices, truncate_response

    responses = query_responses[:, context_length:]
    if stop:
        responses = truncate_response(EOS, PAD, responses)
    return int((first_true_indices(responses == PAD)).sum())


def rollout_fn(model, queries, engine, chunk, config):
    """A zero-argument rollout of `queries` with `engine` ('generate' or 'cb'): (query_responses, logprobs)."""
    from trl_ext.ppo.rollout.engine import ContinuousBatchingRollout, engine_cache_plan
    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    if engine == "generate":
        plan = sampling_plan(model, config)
        return lambda: generate_with_logprobs(model, queries, chunk, PAD, plan)
    cb = ContinuousBatchingRollout(engine_cache_plan(chunk, queries.shape[1], config.max_new_tokens))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return lambda: cb.sample(base, queries, PAD, config)[:2]


def timed(fn, context_length, stop=True):
    start = time.perf_counter()
    query_responses, _ = fn()
    seconds = time.perf_counter() - start
    tokens = kept_tokens(query_responses, context_length, stop)
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "mean_length": tokens / query_responses.shape[0]}


def model_shape(args) -> dict:
    """The benchmark model's size (``build_model``'s keywords) from the command line."""
    return dict(hidden=args.hidden, layers=args.layers, vocab=args.vocab)


def capped(length: int, args) -> int:
    """``length`` new tokens, at most ``--max-new-tokens``."""
    return length if args.max_new_tokens is None else min(length, args.max_new_tokens)


def selected_workloads(args, names=None) -> dict:
    """The workloads ``names`` (default ``--workloads``) with their response lengths capped by ``--max-new-tokens``."""
    names = names or args.workloads.split(",")
    return {name: dict(WORKLOADS[name], response_length=capped(WORKLOADS[name]["response_length"], args))
            for name in names}


def size_args(args) -> list[str]:
    """The size options again, for a child process."""
    out = ["--hidden", str(args.hidden), "--layers", str(args.layers), "--vocab", str(args.vocab), "--prompts",
           str(args.prompts)]
    return out + ([] if args.max_new_tokens is None else ["--max-new-tokens", str(args.max_new_tokens)])


def child(args) -> None:
    """One variant, fresh process: peak RSS growth over two rollouts, from the RSS before the first (which builds
    the engine's cache, kept for the second: a continuous-batching run holds it all run, so it counts)."""
    import torch

    engine, chunk = VARIANTS[args.variant]
    model = build_model(lora=args.lora, **model_shape(args))
    queries = prompts(n=args.prompts, vocab=args.vocab)
    spec = selected_workloads(args, [args.workload])[args.workload]
    fn = rollout_fn(model, queries, engine, chunk, generation_config(**spec))
    trim_heap()
    before = rss_mb()
    reset_peak_rss()
    torch.manual_seed(0)
    fn()
    result = timed(fn, queries.shape[1], spec["stop"])
    result["peak_growth_mb"] = peak_rss_mb() - before
    result["rss_before_mb"] = before
    child_result(result)


def memory_runs(args, workloads=WORKLOADS) -> dict:
    """Every variant in a fresh child process (see :func:`child`)."""
    script = Path(__file__).resolve()
    out = {}
    for workload in workloads:
        for lora in (False, True):
            for variant in VARIANTS:
                extra = ["--lora"] if lora else []
                out[(workload, lora, variant)] = run_child(
                    script, ["--child", "--variant", variant, "--workload", workload, *extra, *size_args(args)])
                growth = out[(workload, lora, variant)]["peak_growth_mb"]
                print(f"  memory {workload} lora={lora} {variant}: {growth:.1f} MiB", flush=True)
    return out


def threshold(args) -> list[dict]:
    """The auto rule's response-length threshold: uneven lengths (EOS ~1/50 per step, so short limits cut most
    responses: lengths bunch at the limit), continuous batching (cache of 32) vs generate (whole batch), by
    response_length, alternating in this process."""
    import torch

    model = build_model(**model_shape(args))
    queries = prompts(n=args.prompts, vocab=args.vocab)
    rows = []
    for response_length in args.threshold_lengths:
        config = generation_config(response_length, True)
        fns = {name: rollout_fn(model, queries, *VARIANTS[name], config)
               for name in ("generate (whole batch)", "continuous batching (cache of 32)")}
        torch.manual_seed(0)
        for fn in fns.values():
            fn()
        runs = alternate({name: (lambda fn=fn: timed(fn, queries.shape[1])) for name, fn in fns.items()},
                         args.repeats)
        gen = [r["tokens_per_s"] for r in runs["generate (whole batch)"]]
        cb = [r["tokens_per_s"] for r in runs["continuous batching (cache of 32)"]]
        rows.append({"response_length": response_length, "generate_tokens_per_s": median(gen),
                     "cb_tokens_per_s": median(cb), "ratio": median(ratios(cb, gen)),
                     "ratios": ratios(cb, gen),
                     "mean_length": median([r["mean_length"] for r in runs["generate (whole batch)"]])})
        print(rows[-1], flush=True)
    return rows


def speed(args, workloads=WORKLOADS) -> dict:
    """Tokens/s of every variant, alternating in this process, per workload and LoRA setting."""
    import torch

    out = {}
    for lora in (False, True):
        model = build_model(lora=lora, **model_shape(args))
        queries = prompts(n=args.prompts, vocab=args.vocab)
        for workload, spec in workloads.items():
            config = generation_config(**spec)
            fns = {name: rollout_fn(model, queries, engine, chunk, config) for name, (engine, chunk) in
                   VARIANTS.items()}
            torch.manual_seed(0)
            for fn in fns.values():
                fn()  # warm-up; builds the engines' caches
            runs = {name: (lambda fn=fn, context=queries.shape[1], stop=spec["stop"]: timed(fn, context, stop))
                    for name, fn in fns.items()}
            out[f"{workload}, {'LoRA' if lora else 'no LoRA'}"] = alternate(runs, args.repeats)
            print(f"  timed {workload} lora={lora} (load {load_average()})", flush=True)
    return out


def tolerance(args) -> dict:
    """Max |log-prob - teacher-forced log-prob| (kept positions), engine and generate, per setting."""
    import torch

    from trl_ext.ppo.rollout.engine import ContinuousBatchingRollout, engine_cache_plan, teacher_forced_logprobs
    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan
    from trl_ext.ppo.rollout.sequences import first_true_indices, truncate_response

    def kept(query_responses, context_length):
        responses = truncate_response(EOS, PAD, query_responses[:, context_length:])
        lengths = first_true_indices(responses == PAD) - 1
        return torch.arange(responses.shape[1]) <= lengths.unsqueeze(1)

    rows = []
    length = capped(96, args)
    bench = model_shape(args)
    models = {"tiny (hidden 64, 2 layers, vocab 384)": dict(hidden=64, layers=2, vocab=384),
              f"bench (hidden {bench['hidden']}, {bench['layers']} layers, vocab {bench['vocab']})": bench}
    for model_name, shape in models.items():
        for lora in (False, True):
            model = build_model(lora=lora, **shape)
            if lora:  # a non-zero adapter
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        if "lora_B" in name:
                            p.normal_(std=0.02)
            queries = prompts(n=min(16, args.prompts), vocab=shape["vocab"], seed=2)
            base = model.get_base_model() if lora else model
            for extra, label in [({}, "temperature only"), ({"top_k": 50}, "top-k 50"), ({"top_p": 0.9}, "top-p 0.9")]:
                for temperature in (0.7, 1.0, 1.3) if not extra else (1.0,):
                    config = generation_config(length, True, temperature=temperature, **extra)
                    cb = ContinuousBatchingRollout(engine_cache_plan(8, queries.shape[1], length))
                    torch.manual_seed(0)
                    qr, lp, _ = cb.sample(base, queries, PAD, config)
                    cb.close()
                    tf = teacher_forced_logprobs(model, qr, queries.shape[1], PAD, temperature, 8)
                    mask = kept(qr, queries.shape[1])
                    engine_diff = float((lp - tf)[mask].abs().max())
                    torch.manual_seed(0)
                    qr2, lp2 = generate_with_logprobs(model, queries, 8, PAD, sampling_plan(model, config))
                    tf2 = teacher_forced_logprobs(model, qr2, queries.shape[1], PAD, temperature, 8)
                    generate_diff = float((lp2 - tf2)[kept(qr2, queries.shape[1])].abs().max())
                    rows.append({"model": model_name, "lora": lora, "sampling": label, "temperature": temperature,
                                 "tokens": int(mask.sum()), "engine_max_abs_diff": engine_diff,
                                 "generate_max_abs_diff": generate_diff})
                    print(rows[-1], flush=True)
    return rows


class UpdateClock:
    """A TrainerCallback: wall time of each update (``on_step_end`` to ``on_step_end``, the first from
    ``on_train_begin``)."""

    def __init__(self):
        self.marks = []

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def on_train_begin(self, *args, **kwargs):
        self.marks = [time.perf_counter()]

    def on_step_end(self, *args, **kwargs):
        self.marks.append(time.perf_counter())


PHASES = ("time/rollout", "time/scoring", "time/optimization")
LENGTHS = ("completions/mean_length", "completions/max_length")


def verifiable(args) -> list[dict]:
    """Whole updates of the verifiable task, ``generate`` vs ``continuous_batching``, per ``response_length``.

    Each repeat trains one fresh trainer per engine (same SFT model, same seed) for ``--updates`` updates, the
    engines' runs alternating (A B, B A, ...); the first update of each run is a warm-up (the engine builds its cache)
    and is left out. Returns one row per (response_length, engine) with the per-update medians."""
    import gc
    import os
    from contextlib import redirect_stderr, redirect_stdout

    import verifiable as task  # benchmarks/verifiable.py: the task's SFT, trainer and data, not copied here
    from evaluate import read_jsonl

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.sft_dir:
        sft_dir, data = Path(args.sft_dir), Path(args.sft_dir).parent / "data"
    else:
        (sft_dir, sft_seconds), data = task.sft(work, max_steps=args.sft_steps), work / "data"
        print(f"SFT warm start ({args.sft_steps or 'the recipe'} steps): {sft_seconds:.0f} s ({sft_dir})", flush=True)
    train_rows = read_jsonl(data / "train.jsonl")
    estimator = task.ESTIMATORS[f"GRPO k={task.K} (KL in loss)"]

    def one_run(engine, response_length, updates=args.updates):
        trainer = task.make_rl_trainer(sft_dir, train_rows, work / "rl", updates=updates, seed=0,
                                       estimator=estimator, rollout_engine=engine, response_length=response_length)
        clock = UpdateClock()
        trainer.add_callback(clock)
        gc.collect()
        with open(os.devnull, "w") as sink, redirect_stdout(sink), redirect_stderr(sink):
            trainer.train()
        logs = [h for h in trainer.state.log_history if "time/rollout" in h]
        walls = [b - a for a, b in zip(clock.marks, clock.marks[1:])]
        chosen = trainer.rollout_engine_choice.engine
        del trainer
        gc.collect()
        keep = slice(1, None)  # the first update is the warm-up
        return {"engine": chosen, "update_s": walls[keep], **{k: [h[k] for h in logs][keep] for k in PHASES + LENGTHS}}

    for engine in ("generate", "continuous_batching"):  # the process's first runs are slower (lazy imports, allocator)
        one_run(engine, args.response_lengths[0], updates=2)
    rows = []
    for response_length in args.response_lengths:
        runs = alternate({engine: (lambda engine=engine, n=response_length: one_run(engine, n))
                          for engine in ("generate", "continuous_batching")}, args.repeats)
        for engine, measurements in runs.items():
            assert all(m["engine"] == engine for m in measurements)
            flat = {k: [x for m in measurements for x in m[k]] for k in ("update_s",) + PHASES + LENGTHS}
            rows.append({"response_length": response_length, "engine": engine, "runs": measurements,
                         **{k: median(v) for k, v in flat.items()}, "max_length_max": max(flat[LENGTHS[1]])})
        gen, cb = (rows[-2], rows[-1])
        # per-repeat ratio of the runs' median update time (the two runs of a repeat ran back to back)
        per_repeat = ratios([median(m["update_s"]) for m in runs["generate"]],
                            [median(m["update_s"]) for m in runs["continuous_batching"]])
        rollout_ratio = ratios([median(m["time/rollout"]) for m in runs["generate"]],
                               [median(m["time/rollout"]) for m in runs["continuous_batching"]])
        cb["speedup_update"], cb["speedup_update_range"] = median(per_repeat), [min(per_repeat), max(per_repeat)]
        cb["speedup_rollout"], cb["speedup_rollout_range"] = median(rollout_ratio), [min(rollout_ratio),
                                                                                     max(rollout_ratio)]
        print({k: v for k, v in gen.items() if k != "runs"}, {k: v for k, v in cb.items() if k != "runs"},
              f"load {load_average()}", flush=True)
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of uneven,fixed")
    parser.add_argument("--tolerance", action="store_true", help="only the log-prob tolerance study")
    parser.add_argument("--no-memory", action="store_true", help="skip the fresh-process memory runs")
    parser.add_argument("--memory-only", action="store_true", help="only the fresh-process memory runs")
    parser.add_argument("--threshold", action="store_true", help="only the auto rule's response-length study")
    parser.add_argument("--verifiable", action="store_true",
                        help="only whole updates of the verifiable task with each engine")
    parser.add_argument("--updates", type=int, default=11, help="--verifiable: updates per run (the first a warm-up)")
    parser.add_argument("--response-lengths", type=int, nargs="+", default=[5, 64], help="--verifiable")
    parser.add_argument("--sft-steps", type=int, default=None,
                        help="--verifiable: SFT steps of the warm start (default: the recipe's 1000)")
    parser.add_argument("--sft-dir", default=None, help="--verifiable: reuse this SFT model (data folder beside it)")
    parser.add_argument("--workdir", default=str(Path(__file__).resolve().parent / "results" / "engine_verifiable"),
                        help="--verifiable: where the task's data and models are written")
    parser.add_argument("--hidden", type=int, default=256, help="the benchmark model's hidden size")
    parser.add_argument("--layers", type=int, default=4, help="the benchmark model's decoder layers")
    parser.add_argument("--vocab", type=int, default=2048, help="the benchmark model's vocabulary")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per rollout (--tolerance: at most 16)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="cap on every response length of the workloads and of --tolerance")
    parser.add_argument("--threshold-lengths", type=int, nargs="+", default=[16, 32, 64, 128],
                        help="--threshold: the response lengths compared")
    parser.add_argument("--out", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--lora", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def report_threshold(args) -> None:
    """The ``--threshold`` study, its table and result file."""
    rows = threshold(args)
    print_table(["response_length", "mean length", "generate tokens/s", "continuous batching tokens/s",
                 "ratio (median)", "per-repeat"],
                [[r["response_length"], f"{r['mean_length']:.0f}", f"{r['generate_tokens_per_s']:.0f}",
                  f"{r['cb_tokens_per_s']:.0f}", f"{r['ratio']:.2f}",
                  "-".join(f"{x:.2f}" for x in (min(r["ratios"]), max(r["ratios"])))] for r in rows])
    write_result("rollout_engine_threshold", {"repeats": args.repeats}, rows, out=args.out)


def report_verifiable(args) -> None:
    """The ``--verifiable`` study, its table and result file."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "recipes" / "verifiable"))
    t0 = time.time()
    rows = verifiable(args)
    table = []
    for r in rows:
        update_speedup, rollout_speedup = (
            f"{r[k]:.2f} ({r[k + '_range'][0]:.2f}-{r[k + '_range'][1]:.2f})" if k in r else "1.00"
            for k in ("speedup_update", "speedup_rollout"))
        table.append([r["response_length"], r["engine"],
                      f"{r['completions/mean_length']:.1f} / {r['completions/max_length']:.0f}",
                      f"{r['update_s']:.2f}", f"{r['time/rollout']:.2f}", f"{r['time/scoring']:.2f}",
                      f"{r['time/optimization']:.2f}", update_speedup, rollout_speedup])
    print_table(["response_length", "engine", "length mean / max (median update)", "s per update",
                 "time/rollout", "time/scoring", "time/optimization", "update speed-up", "rollout speed-up"],
                table)
    print(f"total {time.time() - t0:.0f} s; load average now {load_average()}")
    write_result("rollout_engine_verifiable", {"repeats": args.repeats, "updates": args.updates,
                                               "response_lengths": args.response_lengths}, rows, out=args.out)


def report_memory(args) -> None:
    """The ``--memory-only`` runs, their table and result file."""
    memory = memory_runs(args, selected_workloads(args, list(WORKLOADS)))
    print_table(["workload", "LoRA", "engine", "peak RSS growth (MiB)", "tokens/s (this child)"],
                [[w, "LoRA" if lora else "no LoRA", v, f"{r['peak_growth_mb']:.1f}", f"{r['tokens_per_s']:.0f}"]
                 for (w, lora, v), r in memory.items()])
    write_result("rollout_engine_memory", {}, {" / ".join(map(str, k)): v for k, v in memory.items()},
                 out=args.out)


def report_tolerance(args) -> None:
    """The ``--tolerance`` study, its table and result file."""
    rows = tolerance(args)
    temp_only = [r for r in rows if r["sampling"] == "temperature only"]
    print_table(["model", "LoRA", "sampling", "T", "tokens", "engine max |diff|", "generate max |diff|"],
                [[r["model"], r["lora"], r["sampling"], r["temperature"], r["tokens"],
                  f"{r['engine_max_abs_diff']:.2e}", f"{r['generate_max_abs_diff']:.2e}"] for r in rows])
    print(f"largest engine difference, temperature only: {max(r['engine_max_abs_diff'] for r in temp_only):.2e}")
    write_result("rollout_engine_tolerance", {}, rows, out=args.out)


def report_speed(args) -> None:
    """The default study: tokens/s of every variant and (unless ``--no-memory``) their memory children; one
    table."""
    t0 = time.time()
    workloads = selected_workloads(args)
    timings = speed(args, workloads)
    memory = {} if args.no_memory else memory_runs(args, workloads)
    rows = []
    for key, runs in timings.items():
        workload, lora = key.split(", ")
        ref = [r["tokens_per_s"] for r in runs["generate (whole batch)"]]
        chunks = [r["tokens_per_s"] for r in runs["generate (chunks of 8)"]]
        for name, measurements in runs.items():
            tps = [r["tokens_per_s"] for r in measurements]
            mem = memory.get((workload, lora == "LoRA", name), {})
            rows.append([workload, lora, name, f"{median([r['mean_length'] for r in measurements]):.0f}",
                         f"{median(tps):.0f}", f"{median(ratios(tps, ref)):.2f}", f"{median(ratios(tps, chunks)):.2f}",
                         f"{min(ratios(tps, ref)):.2f}-{max(ratios(tps, ref)):.2f}",
                         f"{mem['peak_growth_mb']:.1f}" if mem else "-"])
    print_table(["workload", "LoRA", "engine", "mean length", "tokens/s", "vs generate (batch)",
                 "vs generate (chunks)", "per-repeat (batch)", "peak RSS growth (MiB)"], rows)
    print(f"total {time.time() - t0:.0f} s")
    write_result("rollout_engine", {"repeats": args.repeats, "workloads": workloads, "variants": VARIANTS,
                                    "model": model_shape(args), "prompts": args.prompts},
                 {"timings": timings, "memory": {" / ".join(map(str, k)): v for k, v in memory.items()}},
                 out=args.out, table=rows)


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_env()
    if args.child:
        return child(args)
    for mode, report in (("threshold", report_threshold), ("verifiable", report_verifiable),
                         ("memory_only", report_memory), ("tolerance", report_tolerance)):
        if getattr(args, mode):
            return report(args)
    report_speed(args)


if __name__ == "__main__":
    main()
