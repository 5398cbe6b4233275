"""Held-out exact match of policies on the tool-use task, greedy, with or without the ``add`` tool.

    python recipes/tool_use/evaluate.py outputs/tool_use/sft_tools --tools
    python recipes/tool_use/evaluate.py outputs/tool_use/sft_no_tools
    (--data: the held-out file, default outputs/tool_use/data/heldout.jsonl)

Every held-out problem is played as an episode, as RL plays it (TRL's ``GRPOTrainer(tools=...)`` contract): the
prompt is rendered by the chat template (with the tools' schemas when ``--tools``), the model generates a turn up to
its end-of-turn token, the turn is parsed by TRL's ``parse_response``; a turn that calls tools gets each call run and
the results appended as ``tool`` messages (the tokens TRL appends: the template's rendering of the tool messages and
the next generation prompt), and generation resumes, at most ``max_tool_calling_iterations`` times and
``response_length`` completion tokens in all. The episode (a list of messages) is scored by
``tool_task.exact_match``, the reward function RL trains on.

    python recipes/tool_use/evaluate.py --game outputs/tool_use/sft_guess outputs/tool_use/grpo_guess

``--game``: the guessing game (guess_env.py) instead, one ``GuessEnv`` per game as ``environment_factory`` gives RL:
every secret greedily and ``--samples`` times sampled at ``--temperature`` (:func:`game_evaluation`), scored by the
environment's ``get_reward``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import guess_env
import tool_task


#: TRL's tool-result suffix (kept here by name: the evaluator and the benchmark append it).
tool_suffix_ids = tool_task.tool_suffix_ids


def run_tool_calls(tool_calls: list[dict], tools: list) -> list[dict]:
    """The ``tool`` messages answering ``tool_calls``, as the trainer runs them (its ``ToolExecutor``, no time
    limit: TRL's contract, a failing call's content is ``{"error": ...}``)."""
    from trl_ext.ppo.episodes.tool_calls import ToolCallCounts, ToolExecutor

    return ToolExecutor([], None).run({0: tool_calls}, {0: {fn.__name__: fn for fn in tools}}, ToolCallCounts())[0]


@torch.no_grad()
def generate_turn(model, tokenizer, sequences: list[list[int]], budgets: list[int], *, greedy: bool,
                  temperature: float = 1.0) -> list[list[int]]:
    """One turn for each sequence (left-padded batch): the new tokens up to and including EOS, at most its budget;
    sampled from the whole distribution at ``temperature`` (as RL samples) unless ``greedy``."""
    from transformers import GenerationConfig

    width = max(len(s) for s in sequences)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences])
    sampling = {} if greedy else dict(temperature=temperature, top_k=0, top_p=1.0)  # greedy: no sampling knobs
    config = GenerationConfig(max_new_tokens=max(budgets), do_sample=not greedy, **sampling,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=pad)
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, width:].tolist()
    turns = []
    for new, budget in zip(out, budgets):
        new = new[:budget]
        if tokenizer.eos_token_id in new:
            new = new[:new.index(tokenizer.eos_token_id) + 1]
        turns.append(new)
    return turns


def episodes(model, tokenizer, prompts: list[list[dict]], *, tools: list | None, greedy: bool = True,
             max_tool_calling_iterations: int = tool_task.MAX_TOOL_CALLING_ITERATIONS,
             response_length: int = tool_task.RESPONSE_LENGTH, row_tools: list[list] | None = None,
             temperature: float = 1.0) -> list[list[dict]]:
    """Play each prompt (chat messages) as an episode (module docstring); returns the completions as TRL passes them
    to reward functions: lists of messages (assistant turns, tool results). ``row_tools``: each prompt's own tools
    instead of ``tools`` (an environment's bound methods, one environment per episode)."""
    from trl.chat_template_utils import add_response_schema

    from trl_ext.ppo.episodes.toolbox import parse_turn  # TRL's parse_response on TRL 1.12 too

    tokenizer = add_response_schema(tokenizer)
    row_tools = row_tools if row_tools is not None else [tools] * len(prompts)
    seqs = [tokenizer.apply_chat_template(p, tools=t or None, add_generation_prompt=True, tokenize=True,
                                          return_dict=False) for p, t in zip(prompts, row_tools)]
    starts = [len(s) for s in seqs]
    completions: list[list[dict]] = [[] for _ in prompts]
    active, calls_left = list(range(len(prompts))), max_tool_calling_iterations
    while active:
        budgets = [response_length - (len(seqs[i]) - starts[i]) for i in active]
        turns = generate_turn(model, tokenizer, [seqs[i] for i in active], budgets, greedy=greedy,
                              temperature=temperature)
        still = []
        for i, new in zip(active, turns):
            message = parse_turn(tokenizer, new, seqs[i], row_tools[i])
            completions[i].append(message)
            seqs[i] = seqs[i] + new
            if not (row_tools[i] and message.get("tool_calls") and calls_left > 0):
                continue
            results = run_tool_calls(message["tool_calls"], row_tools[i])
            suffix = tool_suffix_ids(tokenizer, results)
            if len(seqs[i]) + len(suffix) - starts[i] >= response_length:
                continue  # no room for the results and an answer: the episode ends truncated, as TRL drops them
            completions[i].extend(results)
            seqs[i] = seqs[i] + suffix
            still.append(i)
        active, calls_left = still, calls_left - 1
    return completions


def accuracy(model, tokenizer, rows: list[dict], *, tools: bool, greedy: bool = True,
             max_tool_calling_iterations: int = tool_task.MAX_TOOL_CALLING_ITERATIONS,
             response_length: int = tool_task.RESPONSE_LENGTH) -> dict[str, float]:
    """``{"exact_match": mean reward of the episodes, "tool_calls": fraction of episodes that called a tool}`` on
    ``rows`` (dicts with ``prompt`` and ``answer``), with the task's tools when ``tools``."""
    was_training = model.training
    model.eval()
    done = episodes(model, tokenizer, [r["prompt"] for r in rows], tools=tool_task.TOOLS if tools else None,
                    greedy=greedy, max_tool_calling_iterations=max_tool_calling_iterations,
                    response_length=response_length)
    model.train(was_training)
    rewards = tool_task.exact_match(done, [r["answer"] for r in rows])
    called = [any(m.get("role") == "tool" for m in c) for c in done]
    return {"exact_match": sum(rewards) / len(rewards), "tool_calls": sum(called) / len(called)}


def game_scores(model, tokenizer, secrets: list[int], *, greedy: bool = True, temperature: float = 1.0) -> dict:
    """The guessing game (guess_env.py) played once per secret in ``secrets`` as RL plays it (a ``GuessEnv`` per
    game, reset with the secret, its ``guess`` the game's tool, at most ``MAX_GUESSES`` rounds and
    ``RESPONSE_LENGTH`` tokens): ``{"reward": mean get_reward(), "guesses": mean guesses per game, "found": share
    of games won}``."""
    envs = [guess_env.GuessEnv() for _ in secrets]
    prompts = [[{"role": "user", "content": guess_env.INSTRUCTION + env.reset(secret=s)}]
               for env, s in zip(envs, secrets)]
    was_training = model.training
    model.eval()
    episodes(model, tokenizer, prompts, tools=None, row_tools=[[env.guess] for env in envs], greedy=greedy,
             temperature=temperature, max_tool_calling_iterations=guess_env.MAX_GUESSES,
             response_length=guess_env.RESPONSE_LENGTH)
    model.train(was_training)
    n = len(envs)
    return {"reward": sum(e.get_reward() for e in envs) / n, "guesses": sum(e.guesses for e in envs) / n,
            "found": sum(e.found for e in envs) / n}


def game_evaluation(model, tokenizer, *, samples: int = 16, temperature: float = 0.5, seed: int = 0) -> dict:
    """The game's evaluation: ``{"greedy": game_scores over the 8 secrets, "sampled": over the 8 secrets x
    samples games at temperature}`` (torch seeded with ``seed``)."""
    secrets = list(range(1, guess_env.HIGH + 1))
    torch.manual_seed(seed)
    return {"greedy": game_scores(model, tokenizer, secrets),
            "sampled": game_scores(model, tokenizer, secrets * samples, greedy=False, temperature=temperature)}


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="model directories (tokenizer saved beside the model)")
    p.add_argument("--tools", action="store_true", help="offer the add tool (the tool-use recipes' setting)")
    p.add_argument("--data", default="outputs/tool_use/data/heldout.jsonl")
    p.add_argument("--show", type=int, default=0, help="print the first N episodes")
    p.add_argument("--game", action="store_true", help="play the guessing game instead (guess_env.py): every "
                   "secret greedily, and --samples times sampled at --temperature")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.5)
    a = p.parse_args(argv)
    import transformers  # only the table: no progress bar per model load, no library warnings

    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if a.game:
        print(f"{'model':40s} {'greedy reward':>13s} {'guesses':>8s} {'sampled reward':>15s} {'guesses':>8s} "
              f"{'found':>6s}   (8 secrets; sampled x{a.samples} at temperature {a.temperature})")
        for path in a.models:
            model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
            g = game_evaluation(model, tokenizer, samples=a.samples, temperature=a.temperature)
            print(f"{path:40s} {g['greedy']['reward']:13.3f} {g['greedy']['guesses']:8.2f} "
                  f"{g['sampled']['reward']:15.3f} {g['sampled']['guesses']:8.2f} {g['sampled']['found']:6.2f}")
        return 0

    rows = read_jsonl(a.data)
    print(f"{'model':40s} {'exact match':>12s} {'tool calls':>11s}   ({len(rows)} held-out problems, greedy)")
    for path in a.models:
        model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        acc = accuracy(model, tokenizer, rows, tools=a.tools)
        print(f"{path:40s} {acc['exact_match']:12.3f} {acc['tool_calls']:11.3f}")
        if a.show:
            shown = episodes(model, tokenizer, [r["prompt"] for r in rows[:a.show]],
                             tools=tool_task.TOOLS if a.tools else None)
            for row, episode in zip(rows, shown):
                print(f"  {row['prompt'][0]['content']} -> {json.dumps(episode)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
