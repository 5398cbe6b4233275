"""A whole PPO update with a slow verifier: does scoring overlap generation?

The verifier takes 20 ms per completion (it sleeps: a sandbox, a subprocess, a server). One update of
`trl_ext.PPOTrainer` (`grpo`, k = 4, tiny policy, LoRA) over 64 completions generated in chunks of 16, measured as
the update's `time/rollout + time/scoring` (generation, the reference pass and the rewards; the optimisation
phase does not depend on the verifier), in four designs, each in the same process and alternating:

* `generation alone`: an instant reward function (what the rollout and scoring cost without the verifier);
* `in process`: the slow verifier in the training process (TRL's way): about generation + 64 x 20 ms;
* `workers`: the slow verifier in `reward_num_workers` processes, one call per completion, each chunk's calls
  started as soon as the chunk is generated: the target is about max(generation, scoring), not their sum;
* `scoring alone` is measured apart: the same 64 calls on a `FunctionPool` of the same size, no trainer.

    python benchmarks/reward_overlap.py            # 3 repeats of 3 updates each: about 1-2 min on 2 busy cores
    python benchmarks/reward_overlap.py --quick    # 1 repeat

Prints a table and writes benchmarks/results/reward_overlap.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import alternate, load_average, print_table, setup_env, write_result  # noqa: E402

PER_COMPLETION_S = 0.020


def slow_verifier(completions, **kwargs):
    time.sleep(PER_COMPLETION_S * len(completions))
    return [float(len(c) % 3) for c in completions]


def instant(completions, **kwargs):
    return [float(len(c) % 3) for c in completions]


def make_trainer(tiny, out, reward_func, workers, args):
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext import PPOConfig, PPOTrainer
    from trl_ext.testing import tiny_corpus

    tok = AutoTokenizer.from_pretrained(tiny.tokenizer)
    tok.padding_side = "left"
    texts = [" ".join(line.split()[:4]) for line in tiny_corpus(64, seed=3)]
    data = Dataset.from_dict({"input_ids": [tok(t)["input_ids"] for t in texts], "prompt": texts})
    config = PPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, report_to="none", disable_tqdm=True, save_strategy="no",
        per_device_train_batch_size=args.batch, gradient_accumulation_steps=1, num_mini_batches=1, num_ppo_epochs=1,
        total_episodes=args.batch * args.updates, response_length=args.response_length, num_sample_generations=0,
        local_rollout_forward_batch_size=args.chunk, advantage_estimator="grpo", num_samples_per_prompt=4,
        reward_num_workers=workers, logging_steps=1, seed=0,
    )
    return PPOTrainer(args=config, processing_class=tok, model=AutoModelForCausalLM.from_pretrained(tiny.policy),
                      ref_model=None, reward_model=None, value_model=None, train_dataset=data,
                      peft_config=LoraConfig(r=8, target_modules="all-linear"), reward_funcs=[reward_func])


def time_run(tiny, out, reward_func, workers, args) -> float:
    """Median over the run's updates (the first one, which warms up, left out) of rollout + scoring seconds."""
    trainer = make_trainer(tiny, out, reward_func, workers, args)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "time/rollout" in e][1:]
    return statistics.median(e["time/rollout"] + e["time/scoring"] for e in logs)


def time_pool_alone(workers, args) -> float:
    """The same calls on a pool of the same size, no trainer: one call per completion, all at once."""
    from trl_ext.user_code.workers import FunctionPool

    with FunctionPool([slow_verifier], workers) as pool:
        pool.submit(0, {"prompts": ["p"], "completions": ["c"], "completion_ids": [[1]]}).result()  # warm
        start = time.perf_counter()
        calls = [pool.submit(0, {"prompts": ["p"], "completions": ["c"], "completion_ids": [[1]]})
                 for _ in range(args.batch)]
        for call in calls:
            assert call.result().status == "ok"
        return time.perf_counter() - start


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--chunk", type=int, default=16)
    p.add_argument("--response-length", type=int, default=24)
    p.add_argument("--updates", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workdir", default=None, help="where the tiny models and runs go (default: a new temp folder)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 1
    setup_env()
    import tempfile

    from trl_ext.testing import build_tiny_models

    work = Path(args.workdir or tempfile.mkdtemp(prefix="reward_overlap_"))
    tiny = build_tiny_models(work / "tiny")
    runs = {
        "generation alone": lambda: time_run(tiny, work / "a", instant, 0, args),
        "in process": lambda: time_run(tiny, work / "b", slow_verifier, 0, args),
        f"{args.workers} workers": lambda: time_run(tiny, work / "c", slow_verifier, args.workers, args),
        "scoring alone": lambda: time_pool_alone(args.workers, args),
    }
    results = alternate(runs, args.repeats)
    med = {name: statistics.median(values) for name, values in results.items()}
    serial = args.batch * PER_COMPLETION_S
    gen, scoring = med["generation alone"], med["scoring alone"]
    rows = [
        ["generation alone (instant reward)", med["generation alone"], "-"],
        [f"scoring alone ({args.workers} workers, no trainer)", scoring, "-"],
        [f"in process ({args.batch} x {PER_COMPLETION_S * 1000:.0f} ms = {serial:.2f} s)", med["in process"],
         f"{med['in process'] / max(gen, scoring):.2f}"],
        [f"{args.workers} workers, overlapped", med[f"{args.workers} workers"],
         f"{med[f'{args.workers} workers'] / max(gen, scoring):.2f}"],
    ]
    print(f"\nrollout + scoring seconds per update, median of {args.repeats} repeats "
          f"(load {load_average()[0]:.1f}); target for workers: about max(generation, scoring) = "
          f"{max(gen, scoring):.3f} s, sum = {gen + scoring:.3f} s\n")
    print_table(["design", "s per update", "/ max(gen, scoring)"], rows)
    write_result("reward_overlap", vars(args), results, out=args.out, medians=med)


if __name__ == "__main__":
    main()
