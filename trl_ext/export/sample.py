"""``trl-ext sample RUN_DIR --prompts FILE``: generations from a run's policy, optionally scored by a reward model.
How it works: docs/internals-recipes.md#trl-ext-sample."""

from __future__ import annotations

import json
import os

from ..errors import UserInputError
from .score import padded_batch

__all__ = ["generation_settings", "generate_samples"]

DEFAULT_MAX_NEW_TOKENS = 64


def generation_settings(run, model, *, greedy: bool = False, max_new_tokens: int | None = None,
                        temperature: float | None = None) -> dict:
    """``generate`` keyword arguments for ``run``'s policy (see the module docstring); ``stop_token_id`` is the
    token a response is cut after (``None``: not cut)."""
    from .export_models import ppo_sampling_settings

    if run.recipe.get("trainer") == "ppo":
        ppo = ppo_sampling_settings(run.recipe)
        settings = {k: ppo[k] for k in ("max_new_tokens", "top_k", "top_p", "min_p", "repetition_penalty",
                                        "do_sample")}
        settings["temperature"] = ppo["temperature"] + 1e-7  # as PPOTrainer
        stop = ppo["stop_token_id"]
        if ppo["stop_token"] == "eos":
            stop = "eos"
        settings["stop_token_id"] = stop
    else:
        config = model.generation_config
        settings = {"max_new_tokens": config.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
                    "do_sample": bool(config.do_sample), "temperature": config.temperature,
                    "top_k": config.top_k, "top_p": config.top_p, "stop_token_id": "eos"}
    if max_new_tokens is not None:
        if max_new_tokens < 1:
            raise UserInputError(f"--max-new-tokens {max_new_tokens}: must be at least 1")
        settings["max_new_tokens"] = max_new_tokens
    if temperature is not None:
        if temperature <= 0:
            raise UserInputError(f"--temperature {temperature}: must be > 0 (use --greedy for greedy decoding)")
        settings["temperature"], settings["do_sample"] = temperature, True
    if greedy:
        settings.update(do_sample=False, temperature=None, top_k=None, top_p=None, min_p=None, repetition_penalty=None)
    return settings


def generate_samples(model, tokenizer, prompt_ids: list[list[int]], settings: dict, *, num_samples: int = 1,
                     batch_size: int = 8) -> list[list[list[int]]]:
    """Response token ids, ``num_samples`` per prompt, each cut after its stop token (pad tokens removed)."""
    import torch
    from transformers import GenerationConfig

    stop = settings.get("stop_token_id")
    stop = tokenizer.eos_token_id if stop == "eos" else stop
    gen_kwargs = {k: v for k, v in settings.items() if k != "stop_token_id" and v is not None}
    config = GenerationConfig(**gen_kwargs, eos_token_id=stop, pad_token_id=tokenizer.pad_token_id,
                              num_return_sequences=num_samples)
    pad = tokenizer.pad_token_id
    device = next(model.parameters()).device
    out: list[list[list[int]]] = []
    with torch.no_grad():
        for start in range(0, len(prompt_ids), batch_size):
            chunk = prompt_ids[start:start + batch_size]
            input_ids, attention_mask = padded_batch(chunk, pad, left=True)
            generated = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                                       generation_config=config)
            responses = generated[:, input_ids.shape[1]:].cpu().tolist()
            for i in range(len(chunk)):
                per_prompt = []
                for response in responses[i * num_samples:(i + 1) * num_samples]:
                    if stop is not None and stop in response:
                        response = response[:response.index(stop) + 1]
                    per_prompt.append([t for t in response if t != pad] if pad != stop else response)
                out.append(per_prompt)
    return out


def main(args) -> int:
    """``trl-ext sample`` (parsed arguments from :mod:`trl_ext.cli`)."""
    from transformers import set_seed

    from ..recipe_loader.data import open_split, tokenize_prompts
    from .run_dir import load_merged, load_run_tokenizer, open_run

    if os.path.exists(args.out) and not args.overwrite:
        raise UserInputError(f"--out {args.out}: exists; give a new file, or --overwrite to replace it")
    for key, value in (("--num-samples", args.num_samples), ("--batch-size", args.batch_size)):
        if value < 1:
            raise UserInputError(f"{key} {value}: must be at least 1")
    run = open_run(args.run, models_too=True)
    source = run.source("policy")
    dataset = open_split(args.prompts, args.split, key="--prompts", split_key="--split")
    if "prompt" not in dataset.column_names:
        raise UserInputError(f"--prompts {args.prompts}: no `prompt` column (columns: {dataset.column_names})")
    if args.limit is not None:
        dataset = dataset.select(range(min(args.limit, len(dataset))))
    if args.reward:  # check it before loading the policy
        open_run(args.reward, models_too=True).source("reward")
    tokenizer = load_run_tokenizer(run, source)
    tokenizer.padding_side = "left"
    model = load_merged(source, dtype=args.dtype or run.dtype, tokenizer=tokenizer)
    settings = generation_settings(run, model, greedy=args.greedy, max_new_tokens=args.max_new_tokens,
                                   temperature=args.temperature)
    prompts = list(dataset["prompt"])
    prompt_ids = [list(ids) for ids in tokenize_prompts(dataset.select_columns(["prompt"]), tokenizer)["input_ids"]]
    set_seed(args.seed)
    responses = generate_samples(model, tokenizer, prompt_ids, settings, num_samples=args.num_samples,
                                 batch_size=args.batch_size)
    rows = []
    for prompt, samples in zip(prompts, responses):
        for k, ids in enumerate(samples):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            response = [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
            rows.append({"prompt": prompt, "sample": k, "response": response})
    if args.reward:
        from .score import load_reward_model, score_rows

        del model
        reward, reward_tokenizer = load_reward_model(args.reward, dtype=args.dtype)
        for row, scores in zip(rows, score_rows(reward, reward_tokenizer, rows, kind="rows", name="samples",
                                                batch_size=args.batch_size)):
            row["score"] = scores[0]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for row in rows:
        prompt = row["prompt"] if isinstance(row["prompt"], str) else row["prompt"][-1]["content"]
        response = row["response"] if isinstance(row["response"], str) else row["response"][0]["content"]
        score = f"  [score {row['score']:.4f}]" if "score" in row else ""
        print(f"{prompt!r} -> {response!r}{score}")
    if "score" in rows[0]:
        print(f"mean score {sum(r['score'] for r in rows) / len(rows):.4f} over {len(rows)} samples")
    print(f"wrote {len(rows)} samples to {args.out}")
    return 0
