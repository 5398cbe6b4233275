"""benchmarks/vs_trl_grpo.py and objectives.py --task verifiable through their ``main``, from one 2-step SFT model of
the verifiable task (16 training problems, 8 held out), two updates per run.

vs_trl_grpo: TRL's GRPOTrainer and trl_ext.PPOTrainer(grpo), both built from one GRPOConfig, each run the updates
its settings say (TRL counts optimizer steps: 2 per update), and the result holds both sides' held-out accuracy and
time per update; where TRL is older than 1.13 the script refuses with exit status 2. Its controls: with `--order trl`
both reward functions see the same prompts update by update (by default they do not), and with `--same-draws` both
trainers sample the same tokens from the same model. objectives: every objective
variant trains with its settings (dynamic sampling logs its rounds), with a held-out curve from the SFT model on."""

from __future__ import annotations

import json
import math

import pytest

from benchmark_scripts import loaded_script


@pytest.fixture(scope="module")
def sft_dir(tmp_path_factory):
    with loaded_script("verifiable") as verifiable:
        sft_dir, _ = verifiable.sft(tmp_path_factory.mktemp("verifiable_sft"), max_steps=2, train=16, heldout=8)
    return sft_dir


def accuracy(point: dict) -> bool:
    return 0 <= point["greedy"] <= 1 and 0 <= point["sampled"] <= 1


def vs_trl_grpo(sft_dir, tmp_path, *extra):
    """vs_trl_grpo.py's main, 2 updates and 1 repeat: (result, K, RL_SETTINGS), or None where TRL < 1.13 (then the
    script must have refused with exit status 2 and written nothing)."""
    out = tmp_path / "vs.json"
    argv = ["--sft-dir", str(sft_dir), "--updates", "2", "--repeats", "1", "--workdir", str(tmp_path / "work"),
            "--out", str(out), *extra]
    with loaded_script("vs_trl_grpo") as script:
        if not script.trl_version_ok()[0]:
            assert script.main(argv) == 2 and not out.exists()
            return None
        assert script.main(argv) == 0
        return json.loads(out.read_text()), script.K, script.RL_SETTINGS


def test_vs_trl_grpo_both_trainers_run_the_same_updates(sft_dir, tmp_path):
    ran = vs_trl_grpo(sft_dir, tmp_path)
    if ran is None:
        return
    result, k, rl = ran
    batch, epochs = rl["per_device_train_batch_size"], rl["num_ppo_epochs"]
    settings, r = result["meta"]["settings"], result["results"]
    ours, theirs = settings["ours"], settings["trl_config"]
    assert (ours["advantage_estimator"], ours["num_samples_per_prompt"], ours["kl_in"]) == ("grpo", k, "loss")
    assert ours["loss_aggregation"] == "token_mean" and ours["total_episodes"] == 2 * batch
    assert theirs["num_generations"] == k and theirs["max_steps"] == 2 * epochs
    assert theirs["bf16"] is False and settings["trl_bf16"] is False  # float32 on both sides unless --trl-bf16
    assert accuracy(r["sft"])
    for name in ("trl_ext", "trl"):
        (run,) = r["runs"][name]
        assert run["seed"] == 0 and run["updates"] == 2  # TRL: one update per `num_iterations` optimizer steps
        assert run["seconds_per_update"] > 0 and run["wall_s"] > 0 and accuracy(run)
    (ratio,) = r["time_ratio"]
    assert math.isfinite(ratio) and ratio > 0
    # each trainer shuffles its own way: the 16 prompts of update 1 come in other orders (the control's baseline)
    assert r["paired"]["same_prompts"] == [False] and r["runs"]["trl"][0]["sampled_digest"] is None


def test_vs_trl_grpo_same_prompt_order_and_draws(sft_dir, tmp_path):
    """--order trl --same-draws: ours takes TRL's RepeatSampler order (both reward functions see the same prompts in
    the same order at every update) and both reseed before generating, so from the same SFT model update 1 samples
    the same tokens in both trainers."""
    ran = vs_trl_grpo(sft_dir, tmp_path, "--order", "trl", "--same-draws")
    if ran is None:
        return
    result, k, _ = ran
    assert result["meta"]["settings"]["order"] == "trl" and result["meta"]["settings"]["same_draws"] is True
    ours, theirs = result["results"]["runs"]["trl_ext"][0], result["results"]["runs"]["trl"][0]
    assert ours["prompts_per_update"] == theirs["prompts_per_update"] and len(ours["prompts_per_update"]) == 2
    assert len(set(ours["prompts_per_update"][0])) == 16  # 16 distinct prompts per update, each k times
    assert len(ours["sampled_digest"]) == len(theirs["sampled_digest"]) == 2  # one generate call per update
    assert ours["sampled_digest"][0] == theirs["sampled_digest"][0]
    assert result["results"]["paired"]["same_prompts"] == [True]
    assert result["results"]["paired"]["sampled_differ_from_update"][0] != 1


def test_objectives_every_variant_on_the_verifiable_task(sft_dir, tmp_path):
    out = tmp_path / "objectives.json"
    with loaded_script("objectives") as script:
        assert script.main(["--task", "verifiable", "--sft-dir", str(sft_dir), "--ppo-updates", "2", "--seeds", "1",
                            "--workdir", str(tmp_path / "work"), "--out", str(out)]) == 0
        variants = script.VERIFIABLE_VARIANTS
    result = json.loads(out.read_text())
    settings, r = result["meta"]["settings"], result["results"]
    assert settings["rl"]["advantage_estimator"] == "grpo" and settings["completions_per_run"] == 2 * 64
    assert list(r["runs"]) == list(variants) and accuracy(r["sft"])
    for name, run in r["runs"].items():
        assert run["overrides"] == variants[name]
        (seed,) = run["seeds"]
        dynamic = variants[name].get("dynamic_sampling", False)
        # dynamic sampling may generate the run's 128 completions in fewer updates, and logs its sampling rounds
        assert 1 <= seed["updates"] <= 2 and seed["updates"] == len(seed["reward"]) == len(seed["objective/kl"])
        assert bool(seed["sampling/rounds"]) == dynamic
        assert seed["completions"] >= 128 if dynamic else seed["completions"] == 128
        assert seed["curve"][0] == {"update": 0, **r["sft"]} and all(map(accuracy, seed["curve"]))
