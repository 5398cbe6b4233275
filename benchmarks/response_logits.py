"""Logits only where used: peak memory of PPO's reference pass (scoring) and of one training micro-batch (update),
each in a fresh process on CPU, three ways:

* ``trl_ext``: today's code: the reference log-probs of ``trl_ext.ppo.rollout.logprobs.response_logprobs`` (the LM
  head on the positions that predict a response token, a slice of rows at a time) and the training forward with
  ``logits_to_keep`` (``trl_ext.ppo.rollout.sequences.forward``, as ``PPOTrainer.compute_micro_batch_loss`` calls it);
* ``full_logits``: trl-ext before that change: logits of every prompt and response position, the response's sliced
  out (the reference pass without hidden states, the training forward with them);
* ``trl112``: TRL 1.12's own ``forward`` (hidden states of every layer kept) and ``selective_log_softmax``, as its
  PPOTrainer runs them; only where TRL 1.12 is importable (``--trl112-site DIR``, as for gpu_ppo.py).

A random-initialised Llama with Qwen2.5's vocabulary (151,936 tokens) and two small layers (hidden 64), float32,
512-token prompts and 64-token responses (random tokens, one response stopped early), temperature 0.7. The child
builds the model, warms the pass up once, hands freed heap back (glibc malloc_trim), resets the kernel's peak RSS and
reads it after the pass: growth = peak - RSS before. Children run with ``MALLOC_MMAP_THRESHOLD_=131072`` (freed
large buffers go back to the OS, so RSS follows live memory). Beside each growth: the logits bytes the pass holds by
``trl_ext.ppo.memory.budget``'s rule, and a checksum of the log-probs (equal across the ways).

    python benchmarks/response_logits.py --trl112-site /tmp/trl112     # about a minute on 2 CPU cores
    python benchmarks/response_logits.py --quick                        # small vocabulary and lengths (the test)
    python benchmarks/response_logits.py --ways trl_ext --phases scoring --batch 64   # the recipes' chunk

Prints a table and writes benchmarks/results/response_logits.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (child_result, peak_rss_mb, print_table, reset_peak_rss, rss_mb, run_child, setup_env, trim_heap,
                     write_result)  # noqa: E402

WAYS = ("trl_ext", "full_logits", "trl112")
PHASES = ("scoring", "update")
CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}
TEMPERATURE = 0.7
MIB = 2**20


def build(a):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=a.vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    query_responses = torch.randint(1, a.vocab, (a.batch, a.prompt + a.response))
    query_responses[0, : a.prompt // 4] = 0  # a left-padded prompt
    query_responses[-1, -a.response // 2 :] = 0  # a stopped response
    return model, query_responses


def reference_pass(way: str, model, query_responses, context: int):
    """The reference log-probs of the responses, as each way computes them (no gradients)."""
    import torch

    from trl_ext.ppo.rollout.logprobs import response_logprobs, sequence_logits
    from trl_ext.trl_internals import selective_log_softmax

    responses = query_responses[:, context:]
    with torch.no_grad():
        if way == "trl_ext":
            return response_logprobs(model, query_responses, context, 0, TEMPERATURE)
        if way == "full_logits":
            logits = sequence_logits(model, query_responses, 0).logits[:, context - 1 : -1]
        else:
            from trl.experimental.ppo.ppo_trainer import forward

            logits = forward(model, query_responses, 0).logits[:, context - 1 : -1]
        logits /= TEMPERATURE + 1e-7
        return selective_log_softmax(logits, responses)


def training_pass(way: str, model, query_responses, context: int):
    """One training micro-batch's forward and backward of ``-mean(log-probs)``; returns the log-probs."""
    from trl_ext.ppo.rollout.sequences import forward
    from trl_ext.trl_internals import selective_log_softmax

    responses = query_responses[:, context:]
    if way == "trl_ext":
        logits = forward(model, query_responses, 0, logits_to_keep=responses.shape[1] + 1).logits[:, :-1]
    elif way == "full_logits":
        logits = forward(model, query_responses, 0).logits[:, context - 1 : -1]
    else:
        from trl.experimental.ppo.ppo_trainer import forward as trl_forward

        logits = trl_forward(model, query_responses, 0).logits[:, context - 1 : -1]
    logits /= TEMPERATURE + 1e-7
    logprobs = selective_log_softmax(logits, responses)
    (-logprobs.mean()).backward()
    model.zero_grad(set_to_none=True)
    return logprobs.detach()


def logits_bytes(a, way: str, phase: str) -> int:
    """The logits the pass holds by memory_budget's rule (float32): the reference's one slice, or one micro-batch's
    logits times LOGIT_COPIES (logits, gradient, one softmax-sized temporary) in training."""
    from trl_ext.ppo.memory.budget import LOGIT_COPIES, logprob_slice_rows

    positions = a.response + 1 if way == "trl_ext" else a.prompt + a.response
    if phase == "scoring":
        rows = min(a.batch, logprob_slice_rows(a.response, a.vocab)) if way == "trl_ext" else a.batch
        return rows * positions * a.vocab * 4
    return LOGIT_COPIES * a.micro_batch * positions * a.vocab * 4


def child(a) -> dict:
    import torch

    model, query_responses = build(a)
    if a.phase == "update":
        query_responses = query_responses[: a.micro_batch]
        model.train()
        run = training_pass
    else:
        model.eval()
        run = reference_pass
    run(a.way, model, query_responses, a.prompt)  # warm-up: first-call allocations are not the pass's
    trim_heap()
    before = rss_mb()
    reset_peak_rss()
    logprobs = run(a.way, model, query_responses, a.prompt)
    growth = peak_rss_mb() - before
    mask = query_responses[:, a.prompt :] != 0
    return {"way": a.way, "phase": a.phase, "growth_mib": growth, "logits_mib": logits_bytes(a, a.way, a.phase) / MIB,
            "checksum": float(torch.where(mask, logprobs, 0).sum()), "trl": __import__("trl").__version__}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--batch", type=int, default=4, help="sequences in the reference pass (the rollout chunk)")
    p.add_argument("--micro-batch", type=int, default=2, help="sequences in the training micro-batch")
    p.add_argument("--quick", action="store_true", help="vocabulary 4096, 64-token prompts, 8-token responses")
    p.add_argument("--trl112-site", default=None, help="site-packages folder holding TRL 1.12 (the trl112 way)")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated subset of {','.join(WAYS)}")
    p.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated subset of {','.join(PHASES)}")
    p.add_argument("--out", default=None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--way", choices=WAYS, help=argparse.SUPPRESS)
    p.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.vocab, a.prompt, a.response = 4096, 64, 8
    return a


def trl112_importable() -> bool:
    try:
        from trl.experimental.ppo.ppo_trainer import forward  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv=None) -> int:
    a = parse_args(argv)
    setup_env(1)
    if a.child:
        child_result(child(a))
        return 0
    sizes = ["--vocab", str(a.vocab), "--prompt", str(a.prompt), "--response", str(a.response), "--batch",
             str(a.batch), "--micro-batch", str(a.micro_batch)]
    import os

    results = []
    for phase in [x for x in PHASES if x in a.phases.split(",")]:
        for way in [x for x in WAYS if x in a.ways.split(",")]:
            env = dict(CHILD_ENV)
            if way == "trl112":
                if a.trl112_site:
                    env["PYTHONPATH"] = os.pathsep.join([a.trl112_site, str(Path(__file__).resolve().parents[1])])
                elif not trl112_importable():
                    continue
            results.append(run_child(Path(__file__), ["--child", "--way", way, "--phase", phase, *sizes], env=env))
    rows = []
    for r in results:
        base = next((x for x in results if x["phase"] == r["phase"] and x["way"] == "trl_ext"), None)
        rows.append([r["phase"], f"{r['way']} (TRL {r['trl']})", f"{r['growth_mib']:.0f}", f"{r['logits_mib']:.0f}",
                     f"{r['growth_mib'] / base['growth_mib']:.1f}" if base and base["growth_mib"] > 0 else "-",
                     f"{r['checksum']:.4f}"])
    print_table(["phase", "way", "peak RSS growth MiB", "logits by the budget's rule MiB", "x trl_ext's growth",
                 "log-prob checksum"], rows)
    write_result("response_logits", {k: getattr(a, k) for k in ("vocab", "prompt", "response", "batch",
                                                                 "micro_batch")}, results, out=a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
