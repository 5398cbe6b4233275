"""Held-out exact match of policies on the tool-use task, greedy, with or without the ``add`` tool.

    python recipes/tool_use/evaluate.py outputs/tool_use/sft_tools --tools
    python recipes/tool_use/evaluate.py outputs/tool_use/sft_no_tools
    (--data: the held-out file, default outputs/tool_use/data/heldout.jsonl)

Every held-out problem is played as an episode by the trainer's own turn loop (``trl_ext.PPOTrainer(tools=...)``'s
``MultiTurnRollout``, through :func:`trl_ext.ppo.episodes.play_episodes`; TRL's ``GRPOTrainer(tools=...)``
contract) with a greedy sampler: the prompt is rendered with the tools' schemas, the model generates a turn up to its
end-of-turn token, the turn is parsed by TRL's ``parse_response``; a turn that calls tools gets each call run and the
results appended (the template's rendering of the tool messages and the next generation prompt), and generation
resumes, at most ``max_tool_calling_iterations`` rounds and ``response_length`` completion tokens in all (a tool
result that would pass the limit is dropped and the episode ends; one that reaches it exactly is kept, with no turn
after it). Without ``--tools`` an episode is one turn. The episode (a list of messages) is scored by
``tool_task.exact_match``, the reward function RL trains on.

    python recipes/tool_use/evaluate.py --game outputs/tool_use/sft_guess outputs/tool_use/grpo_guess

``--game``: the guessing game (guess_env.py) instead, with ``environment_factory=GuessEnv`` as RL plays it (one
instance per game, reset with the game's row):
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
import dice_quiz_env
import guess_env
import quiz_env
import tool_task


#: TRL's tool-result suffix (kept here by name: the evaluator and the benchmark append it).
tool_suffix_ids = tool_task.tool_suffix_ids


def sampler(model, tokenizer, *, greedy: bool, temperature: float = 1.0):
    """The trainer's turn sampler (``sample(queries, max_new_tokens) -> (query_responses, logprobs)``, the
    log-probs taken as sampled) with ``model``: greedy, or from the whole distribution at ``temperature`` (as RL
    samples)."""
    from transformers import GenerationConfig

    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    sampling = {} if greedy else dict(temperature=temperature, top_k=0, top_p=1.0)  # greedy: no sampling knobs

    def sample(queries: torch.Tensor, max_new_tokens: int):
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not greedy, **sampling,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        return generate_with_logprobs(model, queries, queries.shape[0], tokenizer.pad_token_id,
                                      sampling_plan(model, config))

    return sample


def play(model, tokenizer, prompts: list[list[dict]], *, tools: list | None = None, environment_factory=None,
         rows: list[dict] | None = None, greedy: bool = True, temperature: float = 1.0,
         max_tool_calling_iterations: int = tool_task.MAX_TOOL_CALLING_ITERATIONS,
         response_length: int = tool_task.RESPONSE_LENGTH):
    """Play each prompt (chat messages) as an episode with the trainer's turn loop
    (:func:`trl_ext.ppo.episodes.play_episodes`, module docstring): ``(EpisodeBatch, environments)``. ``rows``: each
    prompt's dataset columns, which an environment's ``reset`` gets."""
    from trl_ext.ppo.episodes import play_episodes

    with torch.no_grad():
        return play_episodes(tokenizer, prompts, sampler(model, tokenizer, greedy=greedy, temperature=temperature),
                             response_length=response_length, max_tool_calling_iterations=max_tool_calling_iterations,
                             tools=tools, environment_factory=environment_factory, rows=rows)


def single_turn(model, tokenizer, prompts: list[list[dict]], *, greedy: bool = True,
                response_length: int = tool_task.RESPONSE_LENGTH) -> list[list[dict]]:
    """Without tools an episode is one turn: each prompt rendered by the chat template, one turn sampled with the
    trainer's sampler up to its end of turn, parsed into the assistant message."""
    from trl.chat_template_utils import add_response_schema

    from trl_ext.ppo.episodes.multi_turn import left_pad, turn_ids
    from trl_ext.ppo.episodes.toolbox import parse_turn  # TRL's parse_response on TRL 1.12 too

    tokenizer = add_response_schema(tokenizer)
    seqs = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            for p in prompts]
    queries = left_pad(seqs, tokenizer.pad_token_id, torch.zeros(1, dtype=torch.long))
    with torch.no_grad():
        query_responses, _ = sampler(model, tokenizer, greedy=greedy)(queries, response_length)
    responses = query_responses[:, queries.shape[1]:]
    return [[parse_turn(tokenizer, turn_ids(r, response_length, tokenizer.eos_token_id, tokenizer.pad_token_id),
                        seq, [])] for r, seq in zip(responses, seqs)]


def episodes(model, tokenizer, prompts: list[list[dict]], *, tools: list | None, greedy: bool = True,
             max_tool_calling_iterations: int = tool_task.MAX_TOOL_CALLING_ITERATIONS,
             response_length: int = tool_task.RESPONSE_LENGTH) -> list[list[dict]]:
    """Play each prompt (chat messages) as an episode (module docstring); returns the completions as TRL passes them
    to reward functions: lists of messages (assistant turns, tool results)."""
    if not tools:
        return single_turn(model, tokenizer, prompts, greedy=greedy, response_length=response_length)
    batch, _ = play(model, tokenizer, prompts, tools=tools, greedy=greedy,
                    max_tool_calling_iterations=max_tool_calling_iterations, response_length=response_length)
    return batch.completions


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
    was_training = model.training
    model.eval()
    _, envs = play(model, tokenizer, [guess_env.prompt_messages() for _ in secrets],
                   environment_factory=guess_env.GuessEnv, rows=[{"secret": s} for s in secrets], greedy=greedy,
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


def quiz_scores(model, tokenizer, rows: list[dict], *, greedy: bool = True, temperature: float = 1.0,
                environment=None) -> dict:
    """The counting quiz played once per row (``numbers``) as RL plays it (an ``environment`` per quiz: quiz_env.py's
    ``QuizEnv`` by default, or dice_quiz_env.py's ``DiceQuizEnv``, its dice rolled from seed 0 so that every model
    meets the same; its ``answer`` the tool, one round per number, the quiz's response length): ``{"reward": mean
    share of rounds right (prize and luck left out; the optimum is 1.0), "small": the share right of the rounds
    below LARGE_FROM, "large": of the others, "finished": share of quizzes whose every round was answered}``."""
    import random

    environment = environment or quiz_env.QuizEnv
    n = len(rows[0]["numbers"])
    length = quiz_env.RESPONSE_LENGTH if environment is quiz_env.QuizEnv else dice_quiz_env.RESPONSE_LENGTH[n]
    was_training, state = model.training, random.getstate()
    model.eval()
    random.seed(0)
    try:
        _, envs = play(model, tokenizer, [r["prompt"] for r in rows], environment_factory=environment, rows=rows,
                       greedy=greedy, temperature=temperature, max_tool_calling_iterations=n, response_length=length)
    finally:
        model.train(was_training)
        random.setstate(state)
    rounds = [(n >= quiz_env.LARGE_FROM, k < len(e.right) and e.right[k])
              for e in envs for k, n in enumerate(e.numbers)]
    small = [right for large, right in rounds if not large]
    large = [right for large, right in rounds if large]
    return {"reward": sum(sum(e.right) / len(e.numbers) for e in envs) / len(envs),
            "small": sum(small) / max(len(small), 1), "large": sum(large) / max(len(large), 1),
            "finished": sum(len(e.right) == len(e.numbers) for e in envs) / len(envs)}


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in open(path)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="+", help="model directories (tokenizer saved beside the model)")
    p.add_argument("--tools", action="store_true", help="offer the add tool (the tool-use recipes' setting)")
    p.add_argument("--data", default=None, help="the held-out file (default: outputs/tool_use/data/heldout.jsonl, "
                   "with --quiz quiz_heldout.jsonl)")
    p.add_argument("--show", type=int, default=0, help="print the first N episodes")
    p.add_argument("--game", action="store_true", help="play the guessing game instead (guess_env.py): every "
                   "secret greedily, and --samples times sampled at --temperature")
    p.add_argument("--quiz", action="store_true", help="play the counting quiz instead (quiz_env.py): every "
                   "held-out quiz greedily (--data default: outputs/tool_use/data/quiz_heldout.jsonl)")
    p.add_argument("--dice", action="store_true", help="with --quiz: the quiz with a die on screen (dice_quiz_env.py; "
                   "--data default: outputs/tool_use/data/dice_heldout4.jsonl)")
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--temperature", type=float, default=0.5)
    a = p.parse_args(argv)
    heldout = "dice_heldout4" if a.dice else "quiz_heldout" if a.quiz else "heldout"
    a.data = a.data or f"outputs/tool_use/data/{heldout}.jsonl"
    import transformers  # only the table: no progress bar per model load, no library warnings

    from trl_ext.runtime.quiet_console import quiet_console

    quiet_console()  # the lines trl-ext train filters too (bitsandbytes' optional-kernel warning, DeepSpeed's probe)
    transformers.utils.logging.disable_progress_bar()
    transformers.logging.set_verbosity_error()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if a.quiz:
        rows = read_jsonl(a.data)
        small, large = f"0-{quiz_env.LARGE_FROM - 1} right", f"{quiz_env.LARGE_FROM}-{quiz_env.HIGHEST} right"
        print(f"{'model':40s} {'greedy reward':>13s} {small:>10s} {large:>10s}   ({len(rows)} held-out quizzes; "
              "optimum 1.000)")
        for path in a.models:
            model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
            q = quiz_scores(model, tokenizer, rows, environment=dice_quiz_env.DiceQuizEnv if a.dice else None)
            print(f"{path:40s} {q['reward']:13.3f} {q['small']:10.3f} {q['large']:10.3f}")
        return 0
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
