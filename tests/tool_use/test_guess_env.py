"""The guessing game (recipes/tool_use/guess_env.py), the tool-use task's environment case: its SFT games are token
for token the episodes trl_ext.PPOTrainer's multi-turn rollout plays with ``environment_factory=GuessEnv``, their
loss is on the policy's own turns only, and the shipped ``grpo_guess.yaml`` trains on the environment's reward.

What must hold: replaying an SFT game's guesses through the trainer's own rollout (Toolbox + MultiTurnRollout: the
environment reset with the row, the prompt rendered with the ``guess`` schema and the reset text, each turn parsed by
TRL's ``parse_response``, the environment's answers appended as TRL's tool-result suffix) gives exactly the SFT
row's tokens, its action mask is the row's ``completion_mask`` and the environment ends with the game's reward;
SFTTrainer with ``sft_guess.yaml``'s ``completion_only_loss`` labels exactly the guesses and the final message;
the recipe's logged reward is the mean of its environments' ``get_reward()``."""

from __future__ import annotations


import episode_replay
import pytest
from recipe_modules import read_jsonl, recipe_module

guess_env = recipe_module("tool_use", "guess_env")


def games(seed: int = 0, n: int = 6) -> list[dict]:
    """The games make_data tokenized (as messages), the same seed."""
    return guess_env.sft_rows(n, seed=seed)


def test_game_rules():
    env = guess_env.GuessEnv()
    assert env.reset(secret=5, prompt="ignored") == " You have 4 guesses."
    assert [env.guess(n) for n in (3, 7, 5)] == ["higher", "lower", "correct"]
    assert env.get_reward() == pytest.approx(0.8)
    assert env.guess(2) == "correct" and env.guesses == 3  # after the find a guess costs nothing
    env.reset(secret=1)
    assert [env.guess(n) for n in (2, 3, 4, 5)] == ["lower"] * 4 and env.get_reward() == 0.0
    env.reset(secret=8)
    assert env.guess(8) == "correct" and env.get_reward() == 1.0
    (tool,) = guess_env.environment_tools()
    assert tool.__name__ == "guess" and isinstance(tool.__self__, guess_env.GuessEnv)


def test_data_files(tool_use_data):
    data = tool_use_data / "data"
    sft, rl = read_jsonl(data / "guess_sft.jsonl"), read_jsonl(data / "guess_train.jsonl")
    assert len(sft) == len(rl) == 6
    assert all(sorted(r) == ["completion_mask", "input_ids"] for r in sft)
    assert all(len(r["input_ids"]) == len(r["completion_mask"]) <= guess_env.MAX_POSITIONS for r in sft)
    assert all(r["prompt"] == guess_env.prompt_messages() and 1 <= r["secret"] <= guess_env.HIGH for r in rl)


def replay(tokenizer, example: dict, secret: int):
    """An SFT game played by trl_ext's multi-turn rollout with ``environment_factory=GuessEnv``."""
    return episode_replay.replay(tokenizer, example, guess_env.GuessEnv, guess_env.prompt_messages(),
                                 {"secret": secret}, max_tool_calling_iterations=guess_env.MAX_GUESSES,
                                 response_length=guess_env.RESPONSE_LENGTH)


def test_sft_game_is_the_rl_episode(tool_use_data):
    """Each SFT game replayed by the trainer's rollout: the same prompt tokens (the guess schema, the reset text),
    the same episode tokens, the action mask equal to completion_mask, and the game's reward at the end."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_use_data / "guess_base")
    for game, example in zip(games(), read_jsonl(tool_use_data / "data" / "guess_sft.jsonl")):
        secret = int(game["completion"][-1]["content"][len("Found it: "):-1])
        guesses = sum(m["role"] == "tool" for m in game["completion"])
        rollout, episode, env = replay(tok, example, secret)
        assert rollout.prompt_ids[0] + episode.ids == example["input_ids"]
        assert [0] * len(episode.prompt_ids) + [int(a) for a in episode.action] == example["completion_mask"]
        assert episode.messages == game["completion"]  # what the trainer's reward sources get
        assert episode.turns == guesses + 1 and episode.truncated is None
        assert (env.secret, env.guesses, env.found) == (secret, guesses, True)
        assert env.get_reward() == pytest.approx(1.0 - 0.1 * (guesses - 1))
        assert tok.decode(episode.ids).count("<tool_response>") == guesses


def test_sft_loss_covers_only_the_guesses_and_the_final_message(tool_use_data):
    """TRL's SFTTrainer with sft_guess.yaml's completion_only_loss: labels -100 on the prompt and the
    environment's answers, the tokens elsewhere; the labelled text is the guesses and "Found it"."""
    import yaml
    from datasets import load_dataset
    from recipe_modules import RECIPES
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trl_ext

    recipe = yaml.safe_load(open(RECIPES / "tool_use" / "sft_guess.yaml"))
    assert recipe["completion_only_loss"] is True
    base = tool_use_data / "guess_base"
    tok = AutoTokenizer.from_pretrained(base)
    ds = load_dataset("json", data_files=str(tool_use_data / "data" / "guess_sft.jsonl"), split="train")
    args = trl_ext.SFTConfig(output_dir=str(tool_use_data / "sft"), max_length=recipe["max_length"], use_cpu=True,
                             report_to="none", completion_only_loss=recipe["completion_only_loss"])
    trainer = trl_ext.SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base), args=args, train_dataset=ds,
                                 processing_class=tok)
    for k, (game, example) in enumerate(zip(games(), read_jsonl(tool_use_data / "data" / "guess_sft.jsonl"))):
        labels = trainer.data_collator([dict(trainer.train_dataset[k])])["labels"][0].tolist()
        assert labels == [t if m else -100 for t, m in zip(example["input_ids"], example["completion_mask"])]
        kept = tok.decode([t for t in labels if t != -100])
        calls = [m["tool_calls"][0]["function"]["arguments"]["number"] for m in game["completion"] if "tool_calls" in m]
        assert kept == "".join('<tool_call>\n{"name": "guess", "arguments": {"number": %d}}\n</tool_call><|im_end|>'
                               % n for n in calls) + game["completion"][-1]["content"] + "<|im_end|>"


def test_the_shipped_grpo_recipe_trains_on_the_environment(tool_use_data, tmp_path):
    """recipes/tool_use/grpo_guess.yaml as shipped (environment_factory: GuessEnv, no reward function), on the game's
    base model and its RL rows, for one update of 8 episodes: the environment is the only reward source and the
    logged reward is the mean of the update's environments' get_reward()."""
    from recipe_modules import RECIPES

    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    recipe = resolve_recipe(RECIPES / "tool_use" / "grpo_guess.yaml", [
        "--model_name_or_path", str(tool_use_data / "guess_base"),
        "--dataset_name", str(tool_use_data / "data" / "guess_train.jsonl"), "--output_dir", str(tmp_path / "grpo"),
        "--total_episodes", "8", "--per_device_train_batch_size", "8", "--local_rollout_forward_batch_size", "8",
        "--num_ppo_epochs", "1", "--response_length", "48", "--disable_tqdm", "true"])
    assert recipe.environment_factory.__name__ == "GuessEnv" and not recipe.reward_funcs
    trainer = run(recipe)
    args = trainer.args
    assert (args.advantage_estimator, args.num_samples_per_prompt, args.max_tool_calling_iterations) == ("grpo", 4, 4)
    (log,) = [h for h in trainer.state.log_history if "rewards/GuessEnv/mean" in h]
    environments = trainer.multi_turn.toolbox.environments
    assert len(environments) == 8 and {type(e).__name__ for e in environments} == {"GuessEnv"}
    secrets = [e.secret for e in environments]  # each of the 2 prompts' rows reset 4 environments (k = 4)
    assert len(set(secrets[:4])) == len(set(secrets[4:])) == 1
    assert set(secrets) <= {r["secret"] for r in read_jsonl(tool_use_data / "data" / "guess_train.jsonl")}
    assert log["rewards/GuessEnv/mean"] == pytest.approx(sum(e.get_reward() for e in environments) / 8)
    assert log["reward"] == pytest.approx(log["rewards/GuessEnv/mean"]) and trainer.state.global_step == 1
