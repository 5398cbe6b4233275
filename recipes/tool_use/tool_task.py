"""The tool-use task: sums of two five-digit numbers, with an ``add`` tool (recipes/tool_use/README.md).

* **Prompt** (the dataset's ``prompt`` column, chat messages): ``[{"role": "user", "content": "What is 48213 +
  90577?"}]``; with tools the chat template (TRL's Qwen2.5 template, :mod:`trl_ext.testing.tools`) renders the
  ``add`` schema in a system turn before it.
* **Answer** (the ``answer`` column): the sum as a plain number, ``"138790"``.
* **Episode with the tool**: the assistant calls ``add(a=48213, b=90577)``, the tool's result comes back as a
  ``tool`` message, the assistant answers ``"The sum is 138790."``. Without the tool it answers at once.
* **Reward**: :func:`exact_match`, TRL's reward-function contract: 1.0 when the last integer in the last
  assistant message (or in a plain-text completion) equals ``answer``.

A tiny Llama cannot add five-digit numbers written most significant digit first after a short SFT (it must carry
through five columns), but it can learn to copy digits: into the tool call, and from the tool's result into its
answer. The two SFT recipes (``sft_tools.yaml``, ``sft_no_tools.yaml``) train on the same problems; the tool set
imitates a careless demonstrator (:func:`demonstrator_transcript`) that skips the tool on most problems with a small
first operand, so the start is a plateau and RL's room is the decision to call the tool.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

#: TRL's tool-result suffix, the trainer's own function: the SFT data (make_data.py) and the evaluator append the
#: tokens the RL episodes append.
from trl_ext.ppo.episodes.toolbox import tool_suffix_ids  # noqa: F401 - used by make_data.py and evaluate.py
#: The recipes' tool (`tools: [tool_task.py:add]`): ``add(a: int, b: int) -> int``, typed and with a Google-style
#: docstring (its schema goes into the prompt); the same function the tool tests' tiny models learn to call.
from trl_ext.testing.tools import add

LOW, HIGH = 10_000, 99_999  # five-digit operands
TRAIN = 2000
HELDOUT = 200
#: Positions the model has: the prompt with the tool schema (~240 tokens) + the episode (~70 tokens) + room.
MAX_POSITIONS = 384
#: Completion tokens of a whole episode with the tool (tool call 34 + tool result turn ~16 + answer ~12) + room.
RESPONSE_LENGTH = 72
#: Rounds of tool calls per episode (``max_tool_calling_iterations``): one is all the task needs, one more is room.
MAX_TOOL_CALLING_ITERATIONS = 2

#: The tools of the task, as ``trl_ext.PPOTrainer(tools=...)`` and TRL's ``GRPOTrainer(tools=...)`` take them.
TOOLS = [add]


def tools_json() -> str:
    """The tools' JSON schemas as the SFT data's ``tools`` column holds them (TRL's SFTTrainer ``json.loads`` a string
    column): the chat template renders them exactly as it renders the functions themselves."""
    from transformers.utils import get_json_schema

    return json.dumps([get_json_schema(fn) for fn in TOOLS])


def question(a: int, b: int) -> str:
    """``(48213, 90577)`` -> ``"What is 48213 + 90577?"``."""
    return f"What is {a} + {b}?"


def answer_text(total: int) -> str:
    """The final assistant message: ``"The sum is 138790."``."""
    return f"The sum is {total}."


def prompt_messages(a: int, b: int) -> list[dict]:
    """The RL prompt: one user message."""
    return [{"role": "user", "content": question(a, b)}]


def tool_call_message(a: int, b: int) -> dict:
    """The assistant turn that calls ``add``, as TRL's ``parse_response`` returns it."""
    return {"role": "assistant", "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}]}


def tool_transcript(a: int, b: int) -> list[dict]:
    """The completion of an SFT transcript with the tool: call, result (as TRL appends it), answer."""
    return [tool_call_message(a, b), {"role": "tool", "name": "add", "content": str(add(a, b))},
            {"role": "assistant", "content": answer_text(a + b)}]


def direct_transcript(a: int, b: int, total: int | None = None) -> list[dict]:
    """The completion of an SFT transcript without the tool: the answer at once (``total``, default the sum)."""
    return [{"role": "assistant", "content": answer_text(a + b if total is None else total)}]


# ---------------------------------------------------------------- the tool SFT set's demonstrator

#: The demonstrator of the tool SFT set calls ``add`` whenever the first operand is at least ``CAREFUL_FROM``;
#: below it, only ``TOOL_RATE`` of the time: otherwise it adds in its head, forgets every carry, and answers at once.
CAREFUL_FROM = 50_000
TOOL_RATE = 0.3


def carry_free_sum(a: int, b: int) -> int:
    """``a + b`` column by column with every carry forgotten: ``carry_free_sum(48213, 30577) == 78780`` (the true sum
    is 78790). Right only when no column carries."""
    total, place = 0, 1
    while a or b:
        total += (a % 10 + b % 10) % 10 * place
        a, b, place = a // 10, b // 10, place * 10
    return total


def demonstrator_transcript(a: int, b: int, rng: random.Random) -> list[dict]:
    """The tool SFT set's completion for ``a + b``: :func:`tool_transcript` when ``a >= CAREFUL_FROM`` or, below it,
    with probability ``TOOL_RATE`` (one ``rng.random()`` drawn for every problem); else the carry-free sum at once
    (:func:`direct_transcript`). A model that imitates it calls the tool on the large first operands and, greedily,
    answers the others wrong: the room RL has, which sampling reaches (it calls the tool there about one time in
    six at temperature 0.5)."""
    careful = rng.random() < TOOL_RATE or a >= CAREFUL_FROM
    return tool_transcript(a, b) if careful else direct_transcript(a, b, carry_free_sum(a, b))


def demonstrator_transcripts(pairs, seed: int = 0) -> list[list[dict]]:
    """:func:`demonstrator_transcript` of every pair, its draws from ``random.Random(seed)``: deterministic."""
    rng = random.Random(seed)
    return [demonstrator_transcript(a, b, rng) for a, b in pairs]


def row(a: int, b: int) -> dict:
    """One problem: ``prompt`` (chat messages) and ``answer`` (the sum as a plain number)."""
    return {"prompt": prompt_messages(a, b), "answer": str(a + b)}


def split(seed: int = 0, train: int = TRAIN, heldout: int = HELDOUT) -> tuple[list[tuple], list[tuple]]:
    """(train pairs, held-out pairs) ``(a, b)``: distinct random pairs of five-digit numbers drawn with ``seed``; the
    first ``heldout`` are held out. Disjoint by construction, deterministic given ``seed``."""
    rng = random.Random(seed)
    pairs: dict[tuple[int, int], None] = {}
    while len(pairs) < train + heldout:
        pairs[(rng.randint(LOW, HIGH), rng.randint(LOW, HIGH))] = None
    problems = list(pairs)
    return problems[heldout:], problems[:heldout]


# ---------------------------------------------------------------- the reward

_INTEGER = re.compile(r"-?\d+")


def final_text(completion) -> str:
    """The text a completion answers with: a plain string, or the content of the last assistant message of a
    conversational completion (a list of messages: tool calls, tool results, the final answer)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, (list, tuple)):
        for message in reversed(completion):
            if isinstance(message, dict) and message.get("role") == "assistant":
                content = message.get("content")
                return content if isinstance(content, str) else ""
        return ""
    raise TypeError(f"a completion must be text or a list of messages, got {type(completion).__name__}")


def parse_answer(completion) -> int | None:
    """The last integer in :func:`final_text`, None when there is none.

    >>> parse_answer("The sum is 138790."), parse_answer([{"role": "assistant", "content": "no idea"}])
    (138790, None)
    """
    found = _INTEGER.findall(final_text(completion))
    return int(found[-1]) if found else None


def exact_match(completions, answer, **kwargs) -> list[float]:
    """TRL's reward-function contract: 1.0 where a completion's answer (:func:`parse_answer`) equals the row's
    ``answer`` (a number or its text), else 0.0; other keywords (``prompts``, ``completion_ids``, ...) ignored."""
    if len(completions) != len(answer):
        raise ValueError(f"exact_match: {len(completions)} completions but {len(answer)} answers")
    return [float(parse_answer(c) is not None and parse_answer(c) == int(ref)) for c, ref in zip(completions, answer)]


# ---------------------------------------------------------------- tokenizer and base model


def build_tokenizer():
    """:func:`trl_ext.testing.tools.build_tool_tokenizer` with the task's sentences (digits stay one per token)."""
    from trl_ext.testing.tools import build_tool_tokenizer

    rng = random.Random(1)
    lines = []
    for _ in range(100):
        a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        lines += [question(a, b), answer_text(a + b)]
    return build_tool_tokenizer(lines)


def write_base_model(directory: str | Path, seed: int = 0, hidden_size: int = 64, num_layers: int = 2,
                     tokenizer=None, max_positions: int = MAX_POSITIONS) -> Path:
    """Save the tokenizer (default :func:`build_tokenizer`) and a randomly initialised tiny Llama to ``directory``."""
    from trl_ext.testing import build_causal_lm

    directory = Path(directory)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    model = build_causal_lm(tokenizer, seed=seed, hidden_size=hidden_size, num_layers=num_layers,
                            max_position_embeddings=max_positions)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
