"""A tiny tokenizer that speaks TRL's tool-calling chat format, for tests, demos and benchmarks of tool use. How it
works: docs/internals.md#testing-tools."""

from __future__ import annotations

import json
import random
from pathlib import Path

__all__ = ["ADD_PAIRS", "TOOL_SPECIAL_TOKENS", "add", "add_transcript", "build_tool_tokenizer", "fit_to_conversations",
           "qwen2_5_chat_template", "save_tool_models"]

TOOL_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TOOL_TAGS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def qwen2_5_chat_template() -> str:
    """TRL's copy of the Qwen2.5 chat template (the text ``add_response_schema`` compares against)."""
    from ..trl_internals import trl_chat_template

    return trl_chat_template("qwen2_5.jinja")


def _corpus(extra_lines: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    template = qwen2_5_chat_template()
    lines = [template, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
             "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
             "function signatures within <tools></tools> XML tags:\n<tools>\n</tools>\n\nFor each function call, "
             "return a json object with function name and arguments within <tool_call></tool_call> XML tags:"]
    for _ in range(200):
        name = rng.choice(["add", "multiply", "guess", "lookup", "echo", "calculator"])
        args = {rng.choice("abxyn"): rng.randint(0, 99999) for _ in range(rng.randint(1, 2))}
        lines.append('<tool_call>\n' + json.dumps({"name": name, "arguments": args}) + '\n</tool_call>')
        lines.append(json.dumps({"type": "function", "function": {"name": name, "description": "Adds two integers.",
                                 "parameters": {"type": "object", "properties": {"a": {"type": "integer",
                                 "description": "The first number."}}, "required": ["a"]},
                                 "return": {"type": "integer", "description": "The result."}}}))
        lines.append(f"<tool_response>\n{rng.randint(0, 10**6)}\n</tool_response>")
    lines.append("".join(chr(c) for c in range(32, 127)))  # every printable character
    return lines + list(extra_lines)


def build_tool_tokenizer(extra_lines: list[str] = (), vocab_size: int = 1000, seed: int = 0):
    """A byte-level BPE tokenizer with TRL's Qwen2.5 chat template (module docstring); ``extra_lines``: text the
    task's prompts and answers use, so that its words become single tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=TOOL_SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(list(extra_lines), seed), trainer=trainer)
    tok.add_tokens([AddedToken(tag, normalized=False, special=False) for tag in TOOL_TAGS])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<|endoftext|>", eos_token="<|im_end|>",
                                      additional_special_tokens=["<|im_start|>"])
    wrapped.chat_template = qwen2_5_chat_template()
    return wrapped


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first number.
        b: The second number.

    Returns:
        The sum of a and b.
    """
    return a + b


def fit_to_conversations(model, tokenizer, conversations: list[list[dict]], tools: list, *, steps: int, lr: float,
                         prompt_messages: int | None = None):
    """Adam steps on ``conversations`` rendered with ``tools``, one batch, so that a tiny model writes their tool calls
    when it samples (seconds). ``prompt_messages``: the loss leaves out the first that many messages (rendered with
    the assistant header, as a prompt is); None: every token counts."""
    import torch

    seqs, starts = [], []
    for conversation in conversations:
        seqs.append(tokenizer.apply_chat_template(conversation, tools=tools, tokenize=True,
                                                  return_dict=True)["input_ids"])
        starts.append(0 if prompt_messages is None else len(tokenizer.apply_chat_template(
            conversation[:prompt_messages], tools=tools, add_generation_prompt=True, tokenize=True,
            return_dict=True)["input_ids"]))
    ids = torch.full((len(seqs), max(map(len, seqs))), tokenizer.pad_token_id)
    attention = torch.zeros_like(ids, dtype=torch.bool)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)], attention[i, : len(seq)] = torch.tensor(seq), True
    labels = ids.masked_fill(~attention, -100)
    for i, start in enumerate(starts):
        labels[i, :start] = -100
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


ADD_PAIRS = [(2, 3), (4, 1), (7, 5), (6, 6)]
"""The sums of the tool tests' prompts ("Add 2 and 3.") and of the transcripts their caller is fitted to."""


def add_transcript(a: int, b: int) -> list[dict]:
    """An episode of :func:`add` in TRL's messages: the question, the call, its result, the answer."""
    return [{"role": "user", "content": f"Add {a} and {b}."},
            {"role": "assistant", "content": "",
             "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]},
            {"role": "tool", "name": "add", "content": str(a + b)},
            {"role": "assistant", "content": f"The sum is {a + b}."}]


def save_tool_models(root) -> Path:
    """Saves under ``root``: ``tok`` (:func:`build_tool_tokenizer`), ``caller`` (a tiny Llama fitted in ~10 s to the
    :func:`add_transcript` episodes of :data:`ADD_PAIRS`: it calls ``add``, then answers), ``untrained`` (the same
    model before the fit) and ``value`` (a scalar-headed model); deterministic. Returns ``root``."""
    from . import build_causal_lm, build_scalar_model

    root = Path(root)
    tok = build_tool_tokenizer(["Add 2 and 3.", "The sum is 5."])
    caller = fit_to_conversations(build_causal_lm(tok, max_position_embeddings=512), tok,
                                  [add_transcript(a, b) for a, b in ADD_PAIRS], [add], steps=100, lr=1e-2,
                                  prompt_messages=1)
    for name, model in [("caller", caller), ("untrained", build_causal_lm(tok, max_position_embeddings=512)),
                        ("value", build_scalar_model(tok, max_position_embeddings=512))]:
        model.save_pretrained(root / name)
    tok.save_pretrained(root / "tok")
    return root
