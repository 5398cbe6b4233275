"""Measure a policy on the gold task: gold reward, proxy (reward-model) reward, KL to the SFT model, LM loss.

:class:`GoldEvaluator` samples responses the way trl-ext's PPO does (temperature 1, no top-k/top-p, at most
``response_length`` tokens, stopped at the end-of-sequence token) and reports, averaged over the samples:

* ``gold``: :func:`gold_task.gold_reward` of the decoded response;
* ``proxy``: the reward model's score of prompt + response, read at the last token as TRL's PPO does;
* ``kl``: the sampled estimate of KL(policy || SFT) per response, ``sum_t log pi(y_t) - log pi_sft(y_t)`` over
  the response tokens (the eos included): the quantity PPO logs as ``objective/kl``, here for any policy (DPO too);
* ``lm_loss``: mean negative log-likelihood per completion token on held-out SFT text (the alignment tax is its
  rise over the SFT model's);
* ``length`` (words), ``eos`` (fraction of responses that ended) and the mean of each gold term.

:func:`sample_pairs` makes the preference data: two samples of the SFT model per prompt, labelled by the gold
reward, each label flipped with probability ``noise``.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

import gold_task


def _load(path, scalar=False):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cls = AutoModelForSequenceClassification if scalar else AutoModelForCausalLM
    return cls.from_pretrained(str(path)).eval() if isinstance(path, (str, Path)) else path.eval()


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], *, response_length: int = gold_task.RESPONSE_LENGTH,
           seed: int = 0, batch_size: int = 256) -> list[dict]:
    """One sampled response per prompt: ``{"prompt", "query_ids", "response_ids" (up to and with eos), "text"}``."""
    from transformers import GenerationConfig

    torch.manual_seed(seed)
    config = GenerationConfig(max_new_tokens=response_length, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        queries = [tokenizer(p)["input_ids"] for p in chunk]
        if len({len(q) for q in queries}) != 1:
            raise ValueError("the gold task's prompts all have the same length; got different lengths")
        input_ids = torch.tensor(queries)
        generated = model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                   generation_config=config)[:, input_ids.shape[1]:]
        for prompt, query, response in zip(chunk, queries, generated.tolist()):
            if tokenizer.eos_token_id in response:
                response = response[:response.index(tokenizer.eos_token_id) + 1]
            else:
                response = [t for t in response if t != tokenizer.pad_token_id]
            text = tokenizer.decode(response, skip_special_tokens=True).strip()
            out.append({"prompt": prompt, "query_ids": query, "response_ids": response, "text": text})
    return out


def _batch(samples: list[dict], pad_id: int):
    """Right-padded prompt+response ids, attention mask, and a mask of the response tokens."""
    seqs = [s["query_ids"] + s["response_ids"] for s in samples]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    resp = torch.zeros_like(ids, dtype=torch.bool)
    for i, (s, seq) in enumerate(zip(samples, seqs)):
        ids[i, :len(seq)] = torch.tensor(seq)
        attn[i, :len(seq)] = 1
        resp[i, len(s["query_ids"]):len(seq)] = True
    return ids, attn, resp


@torch.no_grad()
def response_logprobs(model, samples: list[dict], pad_id: int, batch_size: int = 256) -> torch.Tensor:
    """Sum of log-probabilities of each sample's response tokens under ``model``."""
    totals = []
    for start in range(0, len(samples), batch_size):
        ids, attn, resp = _batch(samples[start:start + batch_size], pad_id)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        totals.append((logp * resp[:, 1:]).sum(-1))
    return torch.cat(totals)


@torch.no_grad()
def proxy_scores(reward_model, samples: list[dict], pad_id: int, batch_size: int = 256) -> torch.Tensor:
    """The reward model's score of each prompt + response, at its last token (as TRL's PPO scores rollouts)."""
    scores = []
    for start in range(0, len(samples), batch_size):
        ids, attn, _ = _batch(samples[start:start + batch_size], pad_id)
        logits = reward_model(input_ids=ids, attention_mask=attn).logits.float()  # (batch, 1), at the last token
        scores.append(logits[:, 0])
    return torch.cat(scores)


@torch.no_grad()
def lm_loss(model, tokenizer, rows: list[dict], batch_size: int = 256) -> float:
    """Mean NLL per completion token (eos included) of ``rows`` (prompt/completion), as SFT's loss."""
    samples = [{"query_ids": tokenizer(r["prompt"])["input_ids"],
                "response_ids": tokenizer(r["completion"])["input_ids"] + [tokenizer.eos_token_id]} for r in rows]
    n_tokens = sum(len(s["response_ids"]) for s in samples)
    return -response_logprobs(model, samples, tokenizer.pad_token_id, batch_size).sum().item() / n_tokens


class GoldEvaluator:
    """Evaluates policies against one SFT model, reward model and held-out text (loaded once).

    Args:
        tokenizer: the task's tokenizer.
        sft: the SFT model (path or model): the reference of ``kl``.
        reward_model: the proxy (path or model), or None (no ``proxy``).
        heldout: prompt/completion rows of held-out SFT text, or None (no ``lm_loss``).
        samples_per_prompt: responses sampled per prompt of :func:`gold_task.all_prompts` (96 prompts).
        seed: sampling seed (the same for every policy evaluated).
    """

    def __init__(self, tokenizer, *, sft, reward_model=None, heldout: list[dict] | None = None,
                 samples_per_prompt: int = 4, seed: int = 0):
        self.tokenizer = tokenizer
        self.sft = _load(sft)
        self.reward_model = _load(reward_model, scalar=True) if reward_model is not None else None
        self.heldout = heldout
        self.prompts = gold_task.all_prompts() * samples_per_prompt
        self.seed = seed

    def evaluate(self, policy) -> dict:
        """Gold and proxy reward, KL to the SFT model, LM loss on the held-out text, of ``policy`` (path or model)."""
        policy = _load(policy)
        tok, pad = self.tokenizer, self.tokenizer.pad_token_id
        samples = sample(policy, tok, self.prompts, seed=self.seed)
        result = {"gold": _mean(gold_task.gold_reward(s["prompt"], s["text"]) for s in samples)}
        if self.reward_model is not None:
            result["proxy"] = proxy_scores(self.reward_model, samples, pad).mean().item()
        logp = response_logprobs(policy, samples, pad)
        result["kl"] = (logp - response_logprobs(self.sft, samples, pad)).mean().item()
        if self.heldout is not None:
            result["lm_loss"] = lm_loss(policy, tok, self.heldout)
        result["length"] = _mean(len(s["text"].split()) for s in samples)
        result["eos"] = _mean(float(s["response_ids"][-1:] == [tok.eos_token_id]) for s in samples)
        terms = [gold_task.gold_terms(s["prompt"], s["text"]) for s in samples]
        result.update({f"gold/{k}": _mean(t[k] for t in terms) for k in terms[0]})
        return result

    def evaluate_run(self, output_dir) -> list[dict]:
        """:meth:`evaluate` of every ``checkpoint-N`` in a run's ``output_dir`` (step N), and of the final model in
        ``output_dir`` itself when there is one (its step read from ``trainer_state.json``), in step order."""
        import json

        output_dir = Path(output_dir)
        points = {int(p.name.split("-")[1]): p for p in output_dir.glob("checkpoint-*")
                  if (p / "trainer_state.json").exists()}
        if (output_dir / "config.json").exists() and (output_dir / "trainer_state.json").exists():
            step = json.loads((output_dir / "trainer_state.json").read_text())["global_step"]
            points.setdefault(step, output_dir)
        return [{"step": step, **self.evaluate(points[step])} for step in sorted(points)]


def sample_pairs(sft, tokenizer, n_pairs: int, *, noise: float, seed: int) -> tuple[list[dict], dict]:
    """``n_pairs`` preference pairs from two samples of the SFT model per prompt, labelled by the gold reward.

    Pairs whose two responses have the same gold reward are skipped (no preference). Each remaining label is flipped
    with probability ``noise`` (``chosen`` is then the worse response). Returns the rows (``prompt``, ``chosen``,
    ``rejected`` with a leading space, as TRL's reward and DPO trainers concatenate them; ``gold_chosen``,
    ``gold_rejected``, ``flipped``) and counts.
    """
    sft = _load(sft)
    rng = random.Random(seed)
    all_prompts = gold_task.all_prompts()
    rows, drawn, ties, round_ = [], 0, 0, 0
    while len(rows) < n_pairs:
        wanted = n_pairs - len(rows)
        prompts = [rng.choice(all_prompts) for _ in range(wanted + wanted // 4 + 8)]  # ~10 % of pairs are ties
        first = sample(sft, tokenizer, prompts, seed=seed * 1000 + 2 * round_)
        second = sample(sft, tokenizer, prompts, seed=seed * 1000 + 2 * round_ + 1)
        round_ += 1
        for a, b in zip(first, second):
            drawn += 1
            ga, gb = gold_task.gold_reward(a["prompt"], a["text"]), gold_task.gold_reward(b["prompt"], b["text"])
            if ga == gb:
                ties += 1
                continue
            better, worse = (a, b) if ga > gb else (b, a)
            flipped = rng.random() < noise
            if flipped:
                better, worse = worse, better
            rows.append({"prompt": a["prompt"], "chosen": " " + better["text"], "rejected": " " + worse["text"],
                         "gold_chosen": max(ga, gb) if not flipped else min(ga, gb),
                         "gold_rejected": min(ga, gb) if not flipped else max(ga, gb), "flipped": flipped})
            if len(rows) == n_pairs:
                break
    flips = sum(r["flipped"] for r in rows)
    return rows, {"pairs": len(rows), "drawn": drawn, "ties_skipped": ties, "flipped": flips,
                  "noise": flips / len(rows)}


@torch.no_grad()
def pair_accuracy(reward_model, tokenizer, rows: list[dict], batch_size: int = 256) -> float:
    """Fraction of pairs whose gold-better response the reward model scores higher (ties count half)."""
    reward_model = _load(reward_model, scalar=True)

    def as_samples(column):
        return [{"query_ids": tokenizer(r["prompt"])["input_ids"],
                 "response_ids": tokenizer(r[column])["input_ids"] + [tokenizer.eos_token_id]} for r in rows]

    a = proxy_scores(reward_model, as_samples("chosen"), tokenizer.pad_token_id, batch_size)
    b = proxy_scores(reward_model, as_samples("rejected"), tokenizer.pad_token_id, batch_size)
    gold_a = torch.tensor([r["gold_chosen"] for r in rows])
    gold_b = torch.tensor([r["gold_rejected"] for r in rows])
    right = torch.where(gold_a > gold_b, (a > b).float(), (b > a).float()) + 0.5 * (a == b).float()
    return right.mean().item()


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)
