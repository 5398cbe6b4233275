"""benchmarks/tool_use.py, every variant for one tiny update: GAE, RLOO and GRPO with the add tool (multi-turn
episodes) and without it, and the guessing-game environment case (environment_factory, the environment's reward).

What must hold: each variant trains the estimator it names, from the SFT model it names, with the tool exactly when
it says so (the trainer logs tool metrics only with tools), and its result row holds one update's reward and a
held-out exact match; the environment case's reward is the environment's (`rewards/GuessEnv/mean`), with the games
played before and after RL. The shipped RL recipes (recipes/tool_use/{gae,rloo,grpo,grpo_guess}.yaml) resolve to
the benchmark's settings, and gae.yaml trains an update with the tool."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
TINY = ["--updates", "1", "--seeds", "1", "--set", "per_device_train_batch_size=4", "local_rollout_forward_batch_size=4",
        "num_ppo_epochs=1"]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import tool_use
    finally:
        sys.path.remove(str(BENCH))
    return tool_use


@pytest.fixture(scope="module")
def sft_work(bench, tmp_path_factory):
    """The benchmark's data (8 training problems, 4 held out) and both SFT recipes for 2 steps."""
    work = tmp_path_factory.mktemp("tool_use_bench")
    bench.setup_env(threads=1)
    bench.sft(work, train=8, heldout=4, max_steps=2)
    return work


def run(bench, sft_work, tmp_path, *extra):
    out = tmp_path / "result.json"
    assert bench.main(["--sft-dir", str(sft_work), "--out", str(out), *TINY, *extra]) == 0
    return json.loads(out.read_text())


def test_every_variant_is_named_for_its_settings(bench):
    assert len(bench.VARIANTS) == 6
    for name, variant in bench.VARIANTS.items():
        assert name.endswith(", tools") == variant["tools"] and name.endswith(", no tools") != variant["tools"]
        assert variant["advantage_estimator"] in name.lower().replace("gae (value model)", "gae")


@pytest.mark.parametrize("name", [
    "GAE (value model), tools", "GAE (value model), no tools", "RLOO k=4, tools", "RLOO k=4, no tools",
    "GRPO k=4 (KL in loss), tools", "GRPO k=4 (KL in loss), no tools"])
def test_variant_runs_one_update(bench, sft_work, tmp_path, name):
    result = run(bench, sft_work, tmp_path, "--only", name)
    variant = bench.VARIANTS[name]
    row = result["results"]["runs"][name]
    settings = row["settings"]
    assert settings["advantage_estimator"] == variant["advantage_estimator"]
    assert settings["response_length"] == (72 if variant["tools"] else 16)
    assert settings.get("max_tool_calling_iterations") == (2 if variant["tools"] else None)
    (seed,) = row["seeds"]
    assert len(seed["reward"]) == 1 and 0.0 <= seed["reward"][0] <= 1.0
    assert len(seed["tool_calls"]) == (1 if variant["tools"] else 0)  # tool metrics only when the trainer has tools
    assert 0.0 <= seed["end"]["exact_match"] <= 1.0
    assert seed["start"] == result["results"]["sft"]["tools" if variant["tools"] else "no tools"]


def test_environment_case_runs_one_update(bench, sft_work, tmp_path):
    result = run(bench, sft_work, tmp_path, "--only", "--guess", "1", "--guess-sft-steps", "2",
                 "--guess-eval-samples", "1")
    guess = result["results"]["guess"]
    assert guess["settings"]["advantage_estimator"] == "grpo" and guess["settings"]["max_tool_calling_iterations"] == 4
    assert len(guess["reward"]) == 1 and 0.0 <= guess["reward"][0] <= 1.0  # the environment's own reward was logged
    assert len(guess["turns"]) == 1 and guess["turns"][0] >= 1.0
    assert result["results"]["runs"] == {}
    for when in ("before", "after"):  # each secret played once greedily and once sampled
        for mode in ("greedy", "sampled"):
            assert 0.0 <= guess[when][mode]["reward"] <= 1.0 and 0.0 <= guess[when][mode]["found"] <= 1.0


RL_RECIPES = {"gae.yaml": "GAE (value model), tools", "rloo.yaml": "RLOO k=4, tools",
              "grpo.yaml": "GRPO k=4 (KL in loss), tools"}


def test_shipped_guess_recipe_carries_the_benchmarks_settings(bench, sft_work, tmp_path):
    """recipes/tool_use/grpo_guess.yaml resolves to the PPOConfig of the benchmark's environment case."""
    from trl_ext.recipe_loader import resolve_recipe

    recipe = resolve_recipe(bench.TASK / "grpo_guess.yaml", [
        "--model_name_or_path", str(sft_work / "guess_base"), "--dataset_name",
        str(sft_work / "data" / "guess_train.jsonl"), "--output_dir", str(tmp_path / "out")])
    expected = {**bench.RL_SETTINGS, **bench.GUESS_RL, "total_episodes": bench.GUESS_UPDATES * bench.EPISODES_PER_UPDATE}
    assert {key: getattr(recipe.training_args, key) for key in expected} == expected
    assert recipe.environment_factory.__name__ == "GuessEnv" and not recipe.reward_funcs


@pytest.mark.parametrize("recipe_name", sorted(RL_RECIPES))
def test_shipped_rl_recipes_carry_the_benchmarks_settings(bench, sft_work, tmp_path, recipe_name):
    """recipes/tool_use/{gae,rloo,grpo}.yaml resolve to the PPOConfig the benchmark trains its tool variant with
    (every setting it passes, and its episode budget), with the add tool and the exact-match reward."""
    import inspect

    from trl_ext.recipe_loader import resolve_recipe

    recipe = resolve_recipe(bench.TASK / recipe_name, [
        "--model_name_or_path", str(sft_work / "sft_tools"), "--dataset_name", str(sft_work / "data" / "train.jsonl"),
        "--output_dir", str(tmp_path / "out")])
    variant = dict(bench.VARIANTS[RL_RECIPES[recipe_name]])
    assert variant.pop("tools") is True
    expected = {**bench.RL_SETTINGS, **bench.WITH_TOOLS, **variant,
                "total_episodes": bench.RL_UPDATES * bench.EPISODES_PER_UPDATE}
    args = recipe.training_args
    assert {key: getattr(args, key) for key in expected} == expected
    def named(functions):  # the loader imports tool_task.py from the recipe's folder as its own module
        return [(f.__name__, Path(inspect.getfile(f)).resolve()) for f in functions]

    from trl_ext.testing.tools import add

    assert recipe.tools == [add]  # tool_task.py:add is the tests' add (the tool the tiny models learn)
    assert named(recipe.reward_funcs) == [("exact_match", bench.TASK / "tool_task.py")]
    assert recipe.reward_model_args is None and (recipe.value_model_args is not None) == (recipe_name == "gae.yaml")


def test_shipped_gae_recipe_trains_one_update_with_the_tool(bench, sft_work, tmp_path):
    """recipes/tool_use/gae.yaml as shipped, one update of 4 episodes from the tiny SFT model: the trainer plays
    episodes with the add tool (tool metrics logged) and scores them with exact_match only (no reward model)."""
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    recipe = resolve_recipe(bench.TASK / "gae.yaml", [
        "--model_name_or_path", str(sft_work / "sft_tools"), "--dataset_name", str(sft_work / "data" / "train.jsonl"),
        "--output_dir", str(tmp_path / "gae"), "--total_episodes", "4", "--per_device_train_batch_size", "4",
        "--local_rollout_forward_batch_size", "4", "--num_ppo_epochs", "1", "--disable_tqdm", "true"])
    trainer = run(recipe)
    (log,) = [h for h in trainer.state.log_history if "reward" in h]
    assert log["reward"] == log["rewards/exact_match/mean"]  # the only reward source
    assert "tools/call_frequency" in log and "episodes/turns_mean" in log and log["episodes/turns_mean"] >= 1
    assert trainer.args.lam == 1.0 and trainer.args.advantage_estimator == "gae"


@pytest.mark.parametrize(("recipe_name", "base", "data", "held", "end"), [
    ("sft_tools.yaml", "base", "sft_tools.jsonl", 1500, 2000),
    ("sft_guess.yaml", "guess_base", "guess_sft.jsonl", 400, 600),
    ("sft_quiz.yaml", "quiz_base", "quiz_sft.jsonl", 950, 1200)])
def test_shipped_sft_recipes_hold_the_learning_rate_then_decay_it_to_zero(sft_work, tmp_path, recipe_name, base, data,
                                                                        held, end):
    """The tool-use SFT recipes' warmup-stable-decay schedule as HF's Trainer builds it from the resolved config
    (``create_scheduler``: type, warm-up steps, ``lr_scheduler_kwargs``): up over 50 steps, held at the peak to step
    ``held``, then down to 0 at ``end`` (the recipes end settled, not mid-way through a change)."""
    import torch
    from transformers import get_scheduler

    from trl_ext.recipe_loader import resolve_recipe

    recipe = resolve_recipe(BENCH.parent / "recipes" / "tool_use" / recipe_name, [
        "--model_name_or_path", str(sft_work / base), "--dataset_name", str(sft_work / "data" / data),
        "--output_dir", str(tmp_path / "out")])
    args = recipe.training_args
    assert args.max_steps == end
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=args.learning_rate)
    scheduler = get_scheduler(args.lr_scheduler_type, optimizer, num_warmup_steps=args.get_warmup_steps(end),
                              num_training_steps=end, scheduler_specific_kwargs=args.lr_scheduler_kwargs)
    lrs = []
    for _ in range(end):
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    peak = args.learning_rate
    assert lrs[0] == 0 and lrs[25] == pytest.approx(peak / 2) and lrs[49] < peak
    assert lrs[50:held] == pytest.approx([peak] * (held - 50))
    assert all(a > b for a, b in zip(lrs[held:], lrs[held + 1:])) and lrs[-1] < peak * 1e-4

