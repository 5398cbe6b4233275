"""The verifiable task: two-digit addition, checked by a program (no reward model).

* **Prompt**: ``"4 7 + 3 5 ="``: two numbers 0..99, zero-padded to two digits, one token per digit (6 tokens).
* **Answer** (the dataset's ``answer`` column): the sum as a plain number, ``"82"`` (0..198).
* **Completion** the model should write: the sum's digits separated by spaces, ``" 8 2"``, then the end-of-sequence
  token: at most 3 digits + eos, so RL's ``response_length`` is 5 (room for one token of junk).
* **Checker**: :func:`arithmetic_task.exact_match_reward` (1.0 when the completion's leading digits
  read as the right number, else 0.0), :func:`~arithmetic_task.parse_answer`.

There are 10,000 problems. :func:`split` shuffles them with a seed and cuts a held-out set (500) and a training set
(4,000) that share no problem. A tiny Llama (hidden 64, 2 layers) trained with SFT on the training problems learns
the sums slowly, and when depends on the seed: the 1000-step SFT recipe stops with the model right on about a third
of the held-out problems for seed 0 and on 5-11 % for seeds 1-3; the room RL with the exact-match reward then closes.

The tokenizer is word-level over the digits, ``+`` and ``=`` (built here as ``recipes/gold/gold_task.py`` builds the
gold task's; ``trl_ext.testing``'s BPE tokenizer knows digits only as words): ``tokenizer(prompt + completion)``
equals ``tokenizer(prompt) + tokenizer(completion)``.
"""

from __future__ import annotations

import random
from pathlib import Path

SPECIAL_TOKENS = ("<pad>", "</s>", "<s>", "<unk>")
WORDS = tuple(str(d) for d in range(10)) + ("+", "=")
#: The longest answer (3 digits) + the end-of-sequence token + one token of room.
RESPONSE_LENGTH = 5
HELDOUT = 500
TRAIN = 4000


def make_prompt(a: int, b: int) -> str:
    """``(47, 35)`` -> ``"4 7 + 3 5 ="``."""
    if not (0 <= a <= 99 and 0 <= b <= 99):
        raise ValueError(f"operands must be in 0..99, got {a} and {b}")
    return f"{a // 10} {a % 10} + {b // 10} {b % 10} ="


def completion_text(total: int) -> str:
    """What SFT teaches the model to write after the prompt: ``82`` -> ``" 8 2"``."""
    return " " + " ".join(str(total))


def row(a: int, b: int) -> dict:
    """One problem as a dataset row: ``prompt``, ``answer`` (the sum as a plain number) and the SFT ``completion``."""
    return {"prompt": make_prompt(a, b), "answer": str(a + b), "completion": completion_text(a + b)}


def split(seed: int = 0, heldout: int = HELDOUT, train: int = TRAIN) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows): the 10,000 problems shuffled with ``seed``; the first ``heldout`` are held out,
    the next ``train`` are the training set. Disjoint by construction, deterministic given ``seed``."""
    if heldout + train > 10_000:
        raise ValueError(f"only 10000 problems: heldout {heldout} + train {train} is too many")
    problems = [(a, b) for a in range(100) for b in range(100)]
    random.Random(seed).shuffle(problems)
    return [row(*p) for p in problems[heldout:heldout + train]], [row(*p) for p in problems[:heldout]]


def build_tokenizer():
    """A word-level tokenizer over :data:`WORDS` (one token per digit/symbol) with pad/eos/bos/unk; Metaspace
    pre-tokenizer and decoder as in :mod:`trl_ext.testing`, so decoded text keeps its spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in WORDS:
        vocab["\u2581" + word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>", model_max_length=16)


def write_base_model(directory: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2) -> Path:
    """Save the tokenizer and a randomly initialised tiny Llama (~70k parameters) to ``directory``."""
    from trl_ext.testing import build_causal_lm

    directory = Path(directory)
    tokenizer = build_tokenizer()
    model = build_causal_lm(tokenizer, seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                            max_position_embeddings=16)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
