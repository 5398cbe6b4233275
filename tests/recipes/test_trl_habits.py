"""TRL's habits in recipes: `trl-ext train --config RECIPE` (as `trl grpo --config x.yaml`), GRPOConfig's key names in
PPO recipes mapped exactly as PPOConfig.from_grpo_config maps them (and refused beside their PPO names), and
`report_to: tensorboard` writing event files offline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trl_ext.cli import main
from trl_ext.errors import UserInputError
from trl_ext.recipe_loader import resolve_recipe

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "recipes" / "demo"
GRPO_KEYS = dict(num_generations=4, beta=0.04, epsilon=0.3, epsilon_high=0.28, max_completion_length=12,
                 loss_type="dr_grpo", num_iterations=2, scale_rewards="none", importance_sampling_level="sequence")


def ppo_recipe(tmp_path, **keys):
    base = dict(trainer="ppo", model_name_or_path="tiny://policy", reward_model_path="tiny://reward",
                dataset_name=str(DEMO / "data" / "prompts.jsonl"), output_dir=str(tmp_path / "out"), use_cpu=True,
                bf16=False, report_to="none", per_device_train_batch_size=8)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**base, **keys}))
    return path


def test_config_option_is_the_recipe(tiny_env, capsys):
    recipe = str(DEMO / "reward.yaml")
    assert main(["check", recipe, "--learning_rate", "0.5"]) == 0
    plain = capsys.readouterr().out
    assert main(["check", "--config", recipe, "--learning_rate", "0.5"]) == 0
    assert capsys.readouterr().out == plain and "learning_rate: 0.5" in plain
    assert main(["check", f"--config={recipe}", "--verbose"]) == 0
    capsys.readouterr()
    assert main(["check", recipe, "--config", recipe]) == 2
    assert "the recipe is given twice" in capsys.readouterr().err
    assert main(["train", "--config"]) == 2
    assert "--config needs the recipe file" in capsys.readouterr().err


def test_grpo_names_map_as_from_grpo_config_maps_them(tiny_env, tmp_path):
    import trl

    import trl_ext
    from trl_ext.ppo.grpo_compat.from_grpo import RENAMED

    args = resolve_recipe(ppo_recipe(tmp_path, **GRPO_KEYS)).training_args
    grpo = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                          per_device_train_batch_size=8, **GRPO_KEYS)
    expected = trl_ext.PPOConfig.from_grpo_config(grpo)
    targets = [key for name in GRPO_KEYS for key in RENAMED[name]] + ["stop_token", "advantage_estimator", "kl_in"]
    assert {k: getattr(args, k) for k in targets} == {k: getattr(expected, k) for k in targets}
    assert (args.num_samples_per_prompt, args.kl_coef, args.cliprange, args.cliprange_high) == (4, 0.04, 0.3, 0.28)
    assert (args.response_length, args.stop_token, args.loss_aggregation, args.num_ppo_epochs) == (
        12, "eos", "seq_mean_token_sum_norm", 2)
    assert (args.grpo_scale_by_std, args.ratio_level, args.advantage_estimator, args.kl_in) == (
        False, "sequence", "grpo", "loss")
    # command-line overrides too, and cispo's cap as from_grpo_config computes it
    args = resolve_recipe(ppo_recipe(tmp_path), ["--num_generations", "2", "--loss_type", "cispo",
                                                 "--epsilon_high", "5.0", "--max_completion_length", "8"]).training_args
    assert (args.num_samples_per_prompt, args.policy_loss, args.cliprange_high, args.response_length) == (
        2, "cispo", 4.0, 8)
    # an estimator the recipe sets wins, and its own kl_in default holds (as from_grpo_config's overrides)
    args = resolve_recipe(ppo_recipe(tmp_path, advantage_estimator="rloo", num_generations=4, beta=0.1)).training_args
    assert (args.advantage_estimator, args.kl_coef, args.kl_in) == ("rloo", 0.1, "reward")


@pytest.mark.parametrize("keys, message", [
    (dict(beta=0.04, kl_coef=0.05), "recipe: keys 'beta' and 'kl_coef' are both given: 'beta' is GRPOConfig's name "
                                    "for 'kl_coef'"),
    (dict(max_completion_length=8, response_length=8), "keys 'max_completion_length' and 'response_length'"),
    (dict(loss_type="dapo", loss_aggregation="token_mean"), "keys 'loss_type' and 'loss_aggregation'"),
    (dict(loss_type="vespo"), "recipe: key 'loss_type': 'vespo' has no counterpart in trl-ext"),
    (dict(scale_rewards="batch"), "recipe: key 'scale_rewards': 'batch' has no counterpart"),
])
def test_both_names_or_a_value_without_counterpart_are_refused(tiny_env, tmp_path, capsys, keys, message):
    path = ppo_recipe(tmp_path, **keys)
    with pytest.raises(UserInputError) as info:
        resolve_recipe(path)
    assert message in str(info.value)
    assert main(["check", str(path)]) == 2 and capsys.readouterr().err.count("\n") == 1


def test_check_prints_the_recipe_under_ppo_names(tiny_env, tmp_path, capsys):
    assert main(["check", str(ppo_recipe(tmp_path, num_generations=4, beta=0.04))]) == 0
    resolved = yaml.safe_load(capsys.readouterr().out)
    assert (resolved["num_samples_per_prompt"], resolved["kl_coef"], resolved["advantage_estimator"]) == (4, 0.04,
                                                                                                           "grpo")
    assert "beta" not in resolved and "num_generations" not in resolved
    # and a DPO recipe keeps its own `beta`
    assert main(["check", str(DEMO / "dpo.yaml"), "--beta", "0.2"]) == 0
    assert "beta: 0.2" in capsys.readouterr().out


def test_report_to_tensorboard_writes_the_logged_metrics_offline(tiny_env, tmp_path):
    """Two PPO updates with `report_to: tensorboard` (no network: HF_HUB_OFFLINE, WANDB_MODE offline): the event
    file holds each update's objective/scores as trainer_state.json logged it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "ppo"
    assert main(["train", "--config", str(DEMO / "ppo.yaml"), "--reward_model_path", "tiny://reward",
                 "--output_dir", str(out), "--total_episodes", "16", "--report_to", "tensorboard"]) == 0
    (events,) = sorted(out.glob("runs/*/events.out.tfevents.*"))
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    logged = [h["objective/scores"] for h in json.loads((out / "trainer_state.json").read_text())["log_history"]
              if "objective/scores" in h]
    written = accumulator.Scalars("train/objective/scores")
    assert [e.step for e in written] == [1, 2] and [e.value for e in written] == pytest.approx(logged, rel=1e-6)
