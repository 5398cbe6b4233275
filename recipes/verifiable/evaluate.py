"""Held-out exact-match accuracy of policies on the verifiable addition task.

    python recipes/verifiable/evaluate.py outputs/verifiable/sft outputs/verifiable/grpo
    (--data: the held-out file, default outputs/verifiable/data/heldout.jsonl)

For every held-out problem the model answers once greedily (``greedy``: the accuracy the tables report) and
``--samples`` times at temperature 1 with no top-k/top-p, as RL samples (``sampled``: the mean reward RL sees on
problems it never trained on). Each answer is at most ``RESPONSE_LENGTH`` tokens, stopped at the end-of-sequence
token, decoded without special tokens and scored by ``arithmetic_task.exact_match_reward``, the
reward function RL trains on.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import addition_task

from arithmetic_task import exact_match_reward


@torch.no_grad()
def answers(model, tokenizer, prompts: list[str], *, greedy: bool, seed: int = 0,
            response_length: int = addition_task.RESPONSE_LENGTH) -> list[str]:
    """One decoded completion per prompt (the task's prompts all have the same length: no padding)."""
    from transformers import GenerationConfig

    queries = torch.tensor([tokenizer(p)["input_ids"] for p in prompts])
    sampling = {} if greedy else dict(temperature=1.0, top_k=0, top_p=1.0)  # greedy: no sampling knobs (no warning)
    config = GenerationConfig(max_new_tokens=response_length, do_sample=not greedy, **sampling,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    out = model.generate(input_ids=queries, attention_mask=torch.ones_like(queries), generation_config=config)
    texts = []
    for response in out[:, queries.shape[1]:].tolist():
        if tokenizer.eos_token_id in response:
            response = response[:response.index(tokenizer.eos_token_id) + 1]
        texts.append(tokenizer.decode(response, skip_special_tokens=True))
    return texts


def accuracy(model, tokenizer, rows: list[dict], *, samples: int = 4, seed: int = 0) -> dict[str, float]:
    """``{"greedy": exact-match accuracy of greedy answers, "sampled": mean over ``samples`` temperature-1 answers
    per problem}`` on ``rows`` (dicts with ``prompt`` and ``answer``)."""
    was_training = model.training
    model.eval()
    prompts, refs = [r["prompt"] for r in rows], [r["answer"] for r in rows]
    greedy = exact_match_reward(answers(model, tokenizer, prompts, greedy=True), refs)
    sampled = []
    for s in range(samples):
        sampled += exact_match_reward(answers(model, tokenizer, prompts, greedy=False, seed=seed + s), refs)
    model.train(was_training)
    return {"greedy": sum(greedy) / len(greedy), "sampled": sum(sampled) / max(len(sampled), 1)}


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="model directories (tokenizer saved beside the model)")
    p.add_argument("--data", default="outputs/verifiable/data/heldout.jsonl")
    p.add_argument("--samples", type=int, default=4, help="temperature-1 answers per problem")
    a = p.parse_args(argv)
    import transformers  # only the table: no progress bar per model load, no library warnings

    from trl_ext.runtime.quiet_console import quiet_console

    quiet_console()  # the lines trl-ext train filters too (bitsandbytes' optional-kernel warning, DeepSpeed's probe)
    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = read_jsonl(a.data)
    print(f"{'model':40s} {'greedy':>8s} {'sampled':>8s}   (exact match on {len(rows)} held-out problems)")
    for path in a.models:
        acc = accuracy(AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path), rows,
                       samples=a.samples)
        print(f"{path:40s} {acc['greedy']:8.3f} {acc['sampled']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
