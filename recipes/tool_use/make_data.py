"""Step 1 of the tool-use task: the base model and the data (recipes/tool_use/README.md).

    python recipes/tool_use/make_data.py     # -> outputs/tool_use/base, outputs/tool_use/data/

* ``base/``: the tokenizer (TRL's Qwen2.5 chat template, digits one per token) and a randomly initialised tiny
  Llama (hidden 64, 2 layers, 384 positions), SFT's start;
* ``data/train.jsonl``: 2000 problems, columns ``prompt`` (chat messages) and ``answer``: RL's prompts;
* ``data/heldout.jsonl``: 200 other problems, the same columns: exact match is measured there;
* ``data/sft_tools.jsonl``: the training problems as SFT transcripts with the tool, pre-tokenized (TRL's
  SFTTrainer takes an ``input_ids`` column as is): ``input_ids`` are the tokens RL sees, the prompt rendered with
  ``tools=[add]`` then the episode (the tool call, TRL's tool-result suffix, the answer), and ``completion_mask``
  is 1 on the policy's own tokens only (the call turn and the answer, each through its ``<|im_end|>``): 0 on the
  prompt and on the tool-result suffix, which the model cannot predict and need not (``sft_tools.yaml`` sets
  ``completion_only_loss: true`` so that SFTTrainer masks the loss with it);
* ``data/sft_no_tools.jsonl``: the same problems answered at once (``prompt``, ``completion``; no tools);
* ``guess_base/``, ``data/guess_sft.jsonl``, ``data/guess_train.jsonl``: the guessing game (guess_env.py): its
  tokenizer and random tiny Llama (512 positions: a game is longer), 1000 SFT games pre-tokenized as RL's episodes
  (``input_ids``, ``completion_mask``: :func:`episode_sft_row`, the environment's answers masked) and 1000 RL rows
  (``prompt``, ``secret``, which ``GuessEnv.reset`` reads).
* ``quiz_base/``, ``data/quiz_sft.jsonl``, ``data/quiz_train.jsonl``, ``data/quiz_heldout.jsonl``: the counting quiz
  (quiz_env.py, :func:`write_quiz`): its tokenizer and random tiny Llama, the careless player's 1000 training
  quizzes pre-tokenized as RL's episodes, the same quizzes as RL rows (``prompt``, ``numbers``) and 200 held-out ones.
* ``dice_base/``, ``data/dice_sft.jsonl``, ``data/dice_train{4,8}.jsonl``, ``data/dice_heldout{4,8}.jsonl``: the quiz
  with a die on screen (dice_quiz_env.py, :func:`write_dice_quiz`): 4- and 8-round quizzes, the SFT set both mixed.

Deterministic given ``--seed``; held-out and training problems are disjoint.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dice_quiz_env
import guess_env
import quiz_env
import tool_task

GUESS_SFT, GUESS_RL = 1000, 1000
QUIZ_TRAIN, QUIZ_HELDOUT = 1000, 200


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def sft_rows(pairs) -> list[dict]:
    """SFT transcripts without the tool (conversational prompt-completion) of ``pairs``: the answer at once."""
    return [{"prompt": tool_task.prompt_messages(a, b), "completion": tool_task.direct_transcript(a, b)}
            for a, b in pairs]


def assistant_turn_ids(tokenizer, context: list[dict], message: dict, tools: list) -> list[int]:
    """The tokens the chat template renders for the assistant ``message`` after ``context`` (with the ``tools``'
    schemas), through its end-of-turn token: what the policy generates for that turn."""
    head = tokenizer.apply_chat_template(context, tools=tools, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(context + [message], tools=tools, tokenize=False)
    if not full.startswith(head):
        raise ValueError("the chat template renders the assistant turn's context differently: no turn to cut out")
    turn = full[len(head):]
    turn = turn[:turn.index(tokenizer.eos_token) + len(tokenizer.eos_token)]
    return tokenizer(turn, add_special_tokens=False)["input_ids"]


def episode_sft_row(tokenizer, prompt: list[dict], completion: list[dict], tools: list) -> dict:
    """One pre-tokenized SFT transcript of a multi-turn episode: ``input_ids`` = ``prompt`` rendered with the
    ``tools``' schemas (as RL renders it: for an environment, the prompt with its ``reset`` text), then token for
    token what RL's episode concatenates: each assistant turn of ``completion`` through its end of turn, and after
    each run of ``tool`` messages TRL's tool-result suffix (:func:`tool_task.tool_suffix_ids`: the results and the
    next assistant header); ``completion_mask`` 1 on the assistant turns (the policy's tokens), 0 on the prompt and
    the suffixes."""
    ids = tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    mask, context, k = [0] * len(ids), list(prompt), 0
    while k < len(completion):
        if completion[k]["role"] == "assistant":
            span, action, end = assistant_turn_ids(tokenizer, context, completion[k], tools), 1, k + 1
        else:  # the tool messages answering the last turn's calls: one suffix, as TRL appends them
            end = next((j for j in range(k, len(completion)) if completion[j]["role"] != "tool"), len(completion))
            span, action = tool_task.tool_suffix_ids(tokenizer, completion[k:end]), 0
        ids, mask, context, k = ids + span, mask + [action] * len(span), context + completion[k:end], end
    return {"input_ids": ids, "completion_mask": mask}


def tool_sft_row(tokenizer, a: int, b: int, completion: list[dict] | None = None) -> dict:
    """The tool task's SFT transcript of ``a + b`` (:func:`episode_sft_row` with ``tools=[add]``): ``completion``,
    by default :func:`tool_task.tool_transcript` (the call turn, TRL's tool-result suffix, the answer turn)."""
    completion = tool_task.tool_transcript(a, b) if completion is None else completion
    return episode_sft_row(tokenizer, tool_task.prompt_messages(a, b), completion, tool_task.TOOLS)


def guess_sft_rows(tokenizer, n: int, seed: int = 0) -> list[dict]:
    """``n`` games of the guessing game's SFT player (:func:`guess_env.sft_rows`) as :func:`episode_sft_row`s: the
    prompt with ``reset``'s text and the ``guess`` tool's schema, then guesses, TRL's suffixes of the answers, the
    final message."""
    tools = guess_env.environment_tools()
    return [episode_sft_row(tokenizer, r["prompt"], r["completion"], tools) for r in guess_env.sft_rows(n, seed=seed)]


def make_data(out: str | Path, *, seed: int = 0, train: int = tool_task.TRAIN,
              heldout: int = tool_task.HELDOUT) -> Path:
    """Write ``base/`` and ``data/*.jsonl`` under ``out``; returns ``out``."""
    out = Path(out)
    tool_task.write_base_model(out / "base", seed=seed)
    train_pairs, heldout_pairs = tool_task.split(seed=seed, train=train, heldout=heldout)
    write_jsonl(out / "data" / "train.jsonl", [tool_task.row(a, b) for a, b in train_pairs])
    write_jsonl(out / "data" / "heldout.jsonl", [tool_task.row(a, b) for a, b in heldout_pairs])
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out / "base")
    demonstrated = tool_task.demonstrator_transcripts(train_pairs, seed=seed)
    write_jsonl(out / "data" / "sft_tools.jsonl",
                [tool_sft_row(tokenizer, a, b, c) for (a, b), c in zip(train_pairs, demonstrated)])
    write_jsonl(out / "data" / "sft_no_tools.jsonl", sft_rows(train_pairs))
    guess_env.write_base_model(out / "guess_base", seed=seed)
    guess_tokenizer = AutoTokenizer.from_pretrained(out / "guess_base")
    write_jsonl(out / "data" / "guess_sft.jsonl", guess_sft_rows(guess_tokenizer, min(train, GUESS_SFT), seed=seed))
    write_jsonl(out / "data" / "guess_train.jsonl", guess_env.rl_rows(min(train, GUESS_RL), seed=seed + 1))
    write_quiz(out, seed=seed, train=min(train, QUIZ_TRAIN))
    write_dice_quiz(out, seed=seed, train=min(train, QUIZ_TRAIN))
    return out


def write_quiz(out: Path, *, seed: int = 0, train: int = 0) -> None:
    """The counting quiz (quiz_env.py): ``quiz_base/``, ``data/quiz_sft.jsonl`` (the careless player's transcripts
    of the training quizzes as :func:`episode_sft_row`s), ``data/quiz_train.jsonl`` and ``data/quiz_heldout.jsonl``
    (``prompt``, ``numbers``: RL's rows and the held-out quizzes)."""
    from transformers import AutoTokenizer

    quiz_env.write_base_model(out / "quiz_base", seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(out / "quiz_base")
    train_quizzes, heldout_quizzes = quiz_env.split(seed=seed, train=train, heldout=QUIZ_HELDOUT)
    tools = quiz_env.environment_tools()
    write_jsonl(out / "data" / "quiz_sft.jsonl", [episode_sft_row(tokenizer, r["prompt"], r["completion"], tools)
                                                  for r in quiz_env.sft_rows(train_quizzes, seed=seed)])
    write_jsonl(out / "data" / "quiz_train.jsonl", [quiz_env.row(q) for q in train_quizzes])
    write_jsonl(out / "data" / "quiz_heldout.jsonl", [quiz_env.row(q) for q in heldout_quizzes])


def write_dice_quiz(out: Path, *, seed: int = 0, train: int = 0) -> None:
    """The quiz with a die on screen (dice_quiz_env.py): ``dice_base/``; for 4 and 8 rounds, ``data/dice_train{R}.jsonl``
    and ``data/dice_heldout{R}.jsonl`` (RL's rows, the held-out quizzes); ``data/dice_sft.jsonl``: the careless
    player's transcripts of both sets of training quizzes, shuffled together."""
    import random

    from transformers import AutoTokenizer

    dice_quiz_env.write_base_model(out / "dice_base", seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(out / "dice_base")
    tools, sft = dice_quiz_env.environment_tools(), []
    for rounds in (4, 8):
        train_quizzes, heldout_quizzes = dice_quiz_env.split(rounds, seed=seed, train=train, heldout=QUIZ_HELDOUT)
        sft += [episode_sft_row(tokenizer, r["prompt"], r["completion"], tools)
                for r in dice_quiz_env.sft_rows(train_quizzes, seed=seed + rounds)]
        write_jsonl(out / "data" / f"dice_train{rounds}.jsonl", [dice_quiz_env.row(q) for q in train_quizzes])
        write_jsonl(out / "data" / f"dice_heldout{rounds}.jsonl", [dice_quiz_env.row(q) for q in heldout_quizzes])
    random.Random(seed).shuffle(sft)
    write_jsonl(out / "data" / "dice_sft.jsonl", sft)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="outputs/tool_use", help="output folder (default: outputs/tool_use)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=tool_task.TRAIN)
    parser.add_argument("--heldout", type=int, default=tool_task.HELDOUT)
    args = parser.parse_args()
    path = make_data(args.out, seed=args.seed, train=args.train, heldout=args.heldout)
    print(f"wrote {path / 'base'} and {path / 'data'}")
