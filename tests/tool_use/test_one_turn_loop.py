"""The tool-use evaluator (recipes/tool_use/evaluate.py) and the trainer (trl_ext.PPOTrainer with tools or an
environment) play the same episodes from one scripted model: the same prompt tokens, completion tokens, observation
mask, messages (tool results included), truncation and reward, row for row.

The scripted model is a tiny Llama whose next-token logits at the end of each sequence are forced (a margin of 1e4)
to the script's next token, so greedy decoding (the evaluator) and sampling at any temperature (the trainer) write
the same turns. The script reads the conversation so far: the add task's calls and answers per prompt, and a binary
search in the guessing game that reads the environment's answers. One case puts a tool result exactly at the
``response_length`` limit: the result is kept and no turn follows (TRL's rule, drop only what passes the limit), in
both."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from ppo_helpers import first_rollout
from recipe_modules import recipe_module
from transformers import LlamaForCausalLM

from trl_ext import PPOConfig, PPOTrainer
from trl_ext.testing import build_scalar_model, tiny_llama_config
from trl_ext.testing.tools import build_tool_tokenizer

evaluate = recipe_module("tool_use", "evaluate")
tool_task, guess_env = evaluate.tool_task, evaluate.guess_env

HEADER = "<|im_start|>assistant\n"


def call(name: str, **arguments) -> str:
    args = ", ".join(f'"{k}": {v}' for k, v in arguments.items())
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{{args}}}}}\n</tool_call><|im_end|>'


ADD_SCRIPT = {  # user message -> the assistant's turns
    "What is 2 + 3?": [call("add", a=2, b=3), "The sum is 5.<|im_end|>"],
    "What is 10 + 1?": [call("add", a=10, b=1), "The sum is 12.<|im_end|>"],  # a wrong answer: reward 0
    "What is 4 + 4?": ["The sum is 8.<|im_end|>"],  # no tool call
}


def add_turn(text: str, turn: int) -> str:
    turns = next(turns for question, turns in ADD_SCRIPT.items() if question in text)
    return turns[turn] if turn < len(turns) else "<|im_end|>"


def guess_turn(text: str, turn: int) -> str:
    """A binary search over 1..HIGH, reading the environment's answers from the tool responses."""
    low, high = 1, guess_env.HIGH
    for answer in text.split("<tool_response>\n")[1:]:
        middle = (low + high) // 2
        if answer.startswith("correct"):
            return f"Found it: {middle}.<|im_end|>"
        low, high = (middle + 1, high) if answer.startswith("higher") else (low, middle - 1)
    return call("guess", number=(low + high) // 2)


class ScriptedLM(LlamaForCausalLM):
    """A tiny Llama that writes ``script(text, turn)``: the text of assistant turn ``turn`` (0-based) of the
    conversation ``text`` (the decoded context before the turn); after the script's text, EOS."""

    def setup(self, tokenizer, script):
        self.tokenizer, self.script, self.targets = tokenizer, script, {}
        self.header = tokenizer(HEADER, add_special_tokens=False)["input_ids"]
        return self

    def next_token(self, ids: list[int]) -> int:
        n = len(self.header)
        starts = [j for j in range(len(ids) - n + 1) if ids[j:j + n] == self.header]
        start = starts[-1] + n
        key = tuple(ids[:start])
        if key not in self.targets:
            text = self.tokenizer.decode(ids[:start])
            self.targets[key] = self.tokenizer(self.script(text, len(starts) - 1), add_special_tokens=False)[
                "input_ids"]
        target, written = self.targets[key], len(ids) - start
        return target[written] if written < len(target) else self.tokenizer.eos_token_id

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))  # the KV cache: None or empty on a whole sequence
        prefill = cache is None or cache.get_seq_length() == 0
        out = super().forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        self.context = input_ids if prefill else torch.cat((self.context, input_ids), 1)
        mask = attention_mask.bool() if attention_mask is not None else torch.ones_like(self.context, dtype=torch.bool)
        logits = out.logits.clone()
        for i in range(logits.shape[0]):
            logits[i, -1] = 0.0
            logits[i, -1, self.next_token(self.context[i][mask[i]].tolist())] = 1e4
        out.logits = logits
        return out


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer(["What is 2 + 3?", "The sum is 5.", guess_env.INSTRUCTION, "higher", "lower"])


def scripted(tok, script):
    torch.manual_seed(0)
    model = ScriptedLM(tiny_llama_config(tok, max_position_embeddings=512)).setup(tok, script)
    model.generation_config.pad_token_id, model.generation_config.eos_token_id = tok.pad_token_id, tok.eos_token_id
    return model


def trainer_episodes(tok, tmp_path, script, rows, *, response_length, iterations, **kwargs):
    """One rollout of a PPOTrainer (GAE, temperature 0.7) over ``rows`` (one batch): ``{key: (episode, score,
    environment)}`` (:func:`key`)."""
    args = PPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", seed=0,
                     per_device_train_batch_size=len(rows), gradient_accumulation_steps=1, num_mini_batches=1,
                     total_episodes=len(rows), response_length=response_length, temperature=0.7,
                     num_sample_generations=0, stop_token="eos", save_strategy="no", num_ppo_epochs=1,
                     max_tool_calling_iterations=iterations)
    ppo = PPOTrainer(args, tok, scripted(tok, script), None, None, Dataset.from_list(rows),
                     build_scalar_model(tok, max_position_embeddings=512), **kwargs)
    rollout, _ = first_rollout(ppo)
    episodes = rollout.episodes.episodes
    environments = ppo.multi_turn.toolbox.environments or [None] * len(episodes)
    return {key(e, env): (e, float(s), env) for e, s, env in zip(episodes, rollout.scores, environments)}


def key(episode, environment):
    """Which row an episode played (its batch order is the data loader's): its prompt tokens, and its game's secret
    (every game has the same prompt)."""
    return tuple(episode.prompt_ids), getattr(environment, "secret", None)


def assert_same_episodes(trained: dict, played: list) -> None:
    assert len(trained) == len(played)
    for episode, score, environment in played:
        other, other_score, _ = trained[key(episode, environment)]  # the same prompt tokens
        assert other.ids == episode.ids  # the same completion tokens
        assert other.action == episode.action  # the same observation mask
        assert other.messages == episode.messages  # the same turns and tool results
        assert (other.turns, other.truncated) == (episode.turns, episode.truncated)
        assert other_score == pytest.approx(score, abs=1e-6)  # the trainer keeps scores in float32


def add_rows():
    return [{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in zip(ADD_SCRIPT, ("5", "11", "8"))]


def play_add(tok, rows, response_length):
    batch, _ = evaluate.play(scripted(tok, add_turn), tok, [r["prompt"] for r in rows], tools=tool_task.TOOLS,
                             max_tool_calling_iterations=2, response_length=response_length)
    rewards = tool_task.exact_match(batch.completions, [r["answer"] for r in rows])
    return [(e, r, None) for e, r in zip(batch.episodes, rewards)]


def test_tool_episodes_are_the_trainers(tok, tmp_path):
    rows = add_rows()
    played = play_add(tok, rows, 96)
    assert [[m["role"] for m in e.messages] for e, _, _ in played] == [
        ["assistant", "tool", "assistant"], ["assistant", "tool", "assistant"], ["assistant"]]
    assert [e.messages[1]["content"] for e, _, _ in played[:2]] == ["5", "11"]
    assert [r for _, r, _ in played] == [1.0, 0.0, 1.0]
    trained = trainer_episodes(tok, tmp_path, add_turn, rows, response_length=96, iterations=2,
                               tools=tool_task.TOOLS, reward_funcs=[tool_task.exact_match])
    assert_same_episodes(trained, played)


def test_a_tool_result_exactly_at_the_limit_is_kept_in_both(tok, tmp_path):
    """``response_length`` = the first row's call + its tool result: the result is kept (it reaches the limit, it
    does not pass it) and the episode ends there; the second row's longer call and result pass it: dropped."""
    rows = add_rows()
    n_call = len(tok(ADD_SCRIPT["What is 2 + 3?"][0], add_special_tokens=False)["input_ids"])
    suffix = tool_task.tool_suffix_ids(tok, [{"role": "tool", "name": "add", "content": "5"}])
    limit = n_call + len(suffix)
    played = play_add(tok, rows, limit)
    exact, over, direct = (e for e, _, _ in played)
    assert [m["role"] for m in exact.messages] == ["assistant", "tool"] and len(exact.ids) == limit
    assert exact.truncated == "length" and exact.turns == 1 and exact.action[-len(suffix):] == [False] * len(suffix)
    assert [m["role"] for m in over.messages] == ["assistant"] and over.truncated == "length"
    assert direct.truncated is None
    trained = trainer_episodes(tok, tmp_path, add_turn, rows, response_length=limit, iterations=2,
                               tools=tool_task.TOOLS, reward_funcs=[tool_task.exact_match])
    assert_same_episodes(trained, played)


def test_guessing_game_episodes_are_the_trainers(tok, tmp_path):
    """``--game``'s episodes (environment_factory=GuessEnv, the environment's reward) against the trainer's with the
    same environment: the same games, guesses and rewards."""
    secrets = [1, 6, 8]
    rows = [guess_env.row(s) for s in secrets]
    batch, envs = evaluate.play(scripted(tok, guess_turn), tok, [r["prompt"] for r in rows],
                                environment_factory=guess_env.GuessEnv, rows=[{"secret": s} for s in secrets],
                                max_tool_calling_iterations=guess_env.MAX_GUESSES,
                                response_length=guess_env.RESPONSE_LENGTH)
    assert [e.guesses for e in envs] == [3, 2, 4] and all(e.found for e in envs)  # binary search over 1..8
    played = [(e, env.get_reward(), env) for e, env in zip(batch.episodes, envs)]
    trained = trainer_episodes(tok, tmp_path, guess_turn, rows, response_length=guess_env.RESPONSE_LENGTH,
                               iterations=guess_env.MAX_GUESSES, environment_factory=guess_env.GuessEnv)
    assert_same_episodes(trained, played)
    assert sorted(env.guesses for _, _, env in trained.values()) == [2, 3, 4]
