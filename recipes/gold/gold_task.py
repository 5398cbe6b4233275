"""The gold-reward task: a tiny synthetic language whose true ("gold") reward is a program.

Prompts ask for a number of words about a topic; responses are bags of words. Everything is offline and
deterministic given a seed, and small enough that the whole RLHF pipeline (SFT -> reward model -> PPO / DPO) runs on
a CPU in minutes (recipes/gold/README.md).

* **Prompt**: ``write {count} words about the {topic}``, count in three..eight, topic one of :data:`TOPICS`.
* **Gold reward** (:func:`gold_reward`), of the response's words::

      gold = 1.0 * [the prompt's topic appears]
           + 1.0 * min(number of distinct positive words, 2)
           - 1.0 * (number of negative words)
           - 1.0 * (number of repeated words: occurrences of a word after its first)
           - 0.5 * |number of words - count|

  The best answers score 3.0 (e.g. ``good cat is happy`` for "write four words about the cat"). Getting there takes
  a little planning: the topic, two different positive words, distinct fillers, and stopping at the right count.
* **The SFT corpus** (:func:`write_response`) is what imperfect human writers produced: the topic half the time,
  0-3 positive and 0-2 negative words, a length off by up to two words, an occasional repeated word. A model trained
  on it samples a few good answers and many poor ones, so that pairs of its samples are informative.
* **The trap**: on samples of the SFT model, the gold reward goes with positive words (more is better, up to two)
  and against negative words; repeated words and wrong lengths are rare there. A small reward model trained on a
  few hundred noisy pairs of such samples learns "positive words are good" and little about repeats or length.
  A policy that maximises it can pile up positive words, repeat them, and overrun the count: the proxy reward keeps
  rising while the gold reward stops rising and falls (reward-model overoptimization, Gao et al. 2022).

The tokenizer is word-level (one token per word, :func:`build_tokenizer`), so a response of k words is k tokens plus
the end-of-sequence token.
"""

from __future__ import annotations

import random
from pathlib import Path

TOPICS = ("cat", "dog", "bird", "fish", "tree", "sun", "moon", "star", "sea", "river", "city", "garden", "book",
          "song", "house", "road")
POSITIVE = ("good", "great", "happy", "kind", "nice", "lovely", "wonderful", "bright")
NEGATIVE = ("bad", "sad", "rude", "awful")
# Words that count for nothing (the other topics are fillers too: only the prompt's topic scores).
NEUTRAL = ("the", "a", "is", "was", "very", "and", "so", "it", "big", "small", "red", "blue", "old", "new", "little",
           "one")
COUNTS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
PROMPT_TEMPLATE = "write {count} words about the {topic}"
PROMPT_WORDS = ("write", "words", "about")

#: The best gold reward a response can get.
MAX_GOLD = 3.0
#: Room for the longest answer the writers produce (count 8 + 2 words) plus the end-of-sequence token.
RESPONSE_LENGTH = 11


def vocabulary() -> list[str]:
    """Every word of the language, in a fixed order (the tokenizer's ids follow it)."""
    words = [*PROMPT_WORDS, *COUNTS, *TOPICS, *POSITIVE, *NEGATIVE, *NEUTRAL]
    seen: dict[str, None] = {}
    for w in words:
        seen.setdefault(w, None)
    return list(seen)


# --------------------------------------------------------------------------------------------------------------
# The gold reward


def make_prompt(topic: str, count: int) -> str:
    name = next(k for k, v in COUNTS.items() if v == count)
    return PROMPT_TEMPLATE.format(count=name, topic=topic)


def all_prompts() -> list[str]:
    """The 96 prompts of the language (16 topics x 6 counts)."""
    return [make_prompt(topic, n) for topic in TOPICS for n in COUNTS.values()]


def parse_prompt(prompt: str) -> tuple[str, int]:
    """``"write four words about the cat"`` -> ``("cat", 4)``."""
    words = prompt.split()
    if len(words) != 6 or words[0] != "write" or words[1] not in COUNTS or words[-1] not in TOPICS:
        raise ValueError(f"not a prompt of the gold task: {prompt!r}")
    return words[-1], COUNTS[words[1]]


def gold_terms(prompt: str, response: str) -> dict[str, float]:
    """The gold reward's terms for one response (see the module docstring); their sum is :func:`gold_reward`."""
    topic, count = parse_prompt(prompt)
    words = response.split()
    return {
        "topic": 1.0 * (topic in words),
        "positive": 1.0 * min(len(set(words) & set(POSITIVE)), 2),
        "negative": -1.0 * sum(w in NEGATIVE for w in words),
        "repeats": -1.0 * (len(words) - len(set(words))),
        "length": -0.5 * abs(len(words) - count),
    }


def gold_reward(prompt: str, response: str) -> float:
    """The true reward of ``response`` (plain text, words separated by spaces) to ``prompt``; at most 3.0."""
    return sum(gold_terms(prompt, response).values())


# --------------------------------------------------------------------------------------------------------------
# The SFT corpus: what imperfect writers produced


def _draw(rng: random.Random, weights: dict[int, float]) -> int:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def write_response(rng: random.Random, topic: str, count: int) -> str:
    """One writer's answer: the topic first half the time, then 0-3 positive and 0-2 negative words and fillers in
    random order; the length is off by up to two words, and one time in ten a word is repeated."""
    first = [topic] if rng.random() < 0.5 else []
    content = rng.sample(POSITIVE, _draw(rng, {0: 0.35, 1: 0.35, 2: 0.25, 3: 0.05}))
    content += rng.sample(NEGATIVE, _draw(rng, {0: 0.6, 1: 0.3, 2: 0.1}))
    length = max(1, count + _draw(rng, {-2: 0.05, -1: 0.2, 0: 0.5, 1: 0.2, 2: 0.05}))
    fillers = [w for w in NEUTRAL + TOPICS if w != topic]
    rest = length - len(first)
    words = content[:rest] + rng.sample(fillers, max(0, rest - len(content)))
    if len(words) > 1 and rng.random() < 0.1:
        words[rng.randrange(len(words))] = rng.choice(words)  # a careless repeat (sometimes a no-op)
    rng.shuffle(words)
    return " ".join(first + words)


def sft_examples(n: int, seed: int) -> list[dict]:
    """``n`` prompt/completion rows of the SFT corpus (TRL's prompt-completion format; completions start with a
    space, so that prompt + completion is the text)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topic, count = rng.choice(TOPICS), rng.choice(list(COUNTS.values()))
        rows.append({"prompt": make_prompt(topic, count), "completion": " " + write_response(rng, topic, count)})
    return rows


# --------------------------------------------------------------------------------------------------------------
# Tokenizer and base model


def build_tokenizer():
    """A word-level tokenizer over :func:`vocabulary` (one token per word), deterministic, with pad/eos/bos/unk
    (:func:`trl_ext.testing.word_level_tokenizer`: decoded text keeps its spaces and ``tokenizer(prompt + completion)``
    equals ``tokenizer(prompt) + tokenizer(completion)``)."""
    from trl_ext.testing import word_level_tokenizer

    return word_level_tokenizer(vocabulary(), model_max_length=64)


def build_base_model(tokenizer, seed: int = 0, hidden_size: int = 64, num_layers: int = 2):
    """A randomly initialised tiny Llama for the task (the model SFT starts from)."""
    from trl_ext.testing import build_causal_lm

    return build_causal_lm(tokenizer, seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                           max_position_embeddings=32)


def write_base_model(directory: str | Path, seed: int = 0, **model_kwargs) -> Path:
    """Save the tokenizer and a random base model to ``directory`` (a checkpoint ``from_pretrained`` reads)."""
    directory = Path(directory)
    tokenizer = build_tokenizer()
    model = build_base_model(tokenizer, seed=seed, **model_kwargs)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
