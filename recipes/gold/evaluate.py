"""Evaluate trained policies on the gold task: gold reward, proxy reward, KL to the SFT model, alignment tax.

    python recipes/gold/evaluate.py outputs/gold/ppo outputs/gold/dpo
    python recipes/gold/evaluate.py outputs/gold/ppo --checkpoints     # every checkpoint-N of the run too

Each folder is a policy (a run's output_dir or a checkpoint). Prints one row per policy, the SFT model first:
``gold`` (the true reward, at most 3.0), ``proxy`` (the reward model's score), ``kl`` (sampled KL to the SFT model
per response, in nats), ``lm_loss`` (per-token loss on the held-out SFT text; its rise over the SFT model's is the
alignment tax), the mean response length in words, and the gold reward's terms (topic, positive, negative,
repeats, length). See recipes/gold/gold_eval.py.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gold_eval

COLUMNS = ["gold", "proxy", "kl", "lm_loss", "length", "gold/topic", "gold/positive", "gold/negative", "gold/repeats",
           "gold/length"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("policies", nargs="+", help="policy folders (output_dir of a PPO/DPO run, or a checkpoint)")
    p.add_argument("--checkpoints", action="store_true", help="also every checkpoint-N inside each folder")
    p.add_argument("--sft", default="outputs/gold/sft", help="the SFT model: the KL reference (outputs/gold/sft)")
    p.add_argument("--reward", default="outputs/gold/reward", help="the proxy reward model (outputs/gold/reward)")
    p.add_argument("--heldout", default="outputs/gold/data/sft/test.jsonl", help="held-out SFT text")
    p.add_argument("--samples-per-prompt", type=int, default=8, help="responses sampled per prompt (96 prompts)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same for every policy)")
    a = p.parse_args(argv)

    import transformers
    from transformers import AutoTokenizer

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(a.sft)
    heldout = [json.loads(line) for line in open(a.heldout)]
    evaluator = gold_eval.GoldEvaluator(tokenizer, sft=a.sft, reward_model=a.reward, heldout=heldout,
                                        samples_per_prompt=a.samples_per_prompt, seed=a.seed)
    rows = [("SFT " + a.sft, evaluator.evaluate(a.sft))]
    for folder in map(Path, a.policies):
        if a.checkpoints:
            rows += [(f"{folder} @ {point['step']}", point) for point in evaluator.evaluate_run(folder)]
        else:
            rows.append((str(folder), evaluator.evaluate(folder)))
    width = max(len(name) for name, _ in rows)
    print(f"{'policy':{width}}  " + "  ".join(f"{c.split('/')[-1]:>8}" for c in COLUMNS))
    for name, result in rows:
        print(f"{name:{width}}  " + "  ".join(f"{result[c]:8.3f}" for c in COLUMNS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
