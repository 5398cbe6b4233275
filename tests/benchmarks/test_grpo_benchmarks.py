"""benchmarks/vs_trl_grpo.py through its ``main``: TRL's GRPOTrainer and trl_ext.PPOTrainer(grpo), both built from
one GRPOConfig, two updates each from a 2-step SFT model of the verifiable task (16 training problems, 8 held out).
Each side runs the updates its settings say (TRL counts optimizer steps: 2 per update), and the result holds both
sides' held-out accuracy and time per update. Where TRL is older than 1.13 the script refuses with exit status 2."""

from __future__ import annotations

import json
import math

from benchmark_scripts import loaded_script


def test_both_trainers_run_the_same_updates(tmp_path):
    out = tmp_path / "vs.json"
    with loaded_script("vs_trl_grpo") as script:
        argv = ["--updates", "2", "--repeats", "1", "--workdir", str(tmp_path / "work"), "--out", str(out)]
        if not script.trl_version_ok()[0]:
            assert script.main(argv) == 2 and not out.exists()
            return
        import verifiable  # beside the script (benchmarks/ is on the path while it is loaded)

        sft_dir, _ = verifiable.sft(tmp_path / "sft", max_steps=2, train=16, heldout=8)
        assert script.main(["--sft-dir", str(sft_dir), *argv]) == 0
        k, rl = script.K, script.RL_SETTINGS
    batch, epochs = rl["per_device_train_batch_size"], rl["num_ppo_epochs"]
    result = json.loads(out.read_text())
    settings, r = result["meta"]["settings"], result["results"]
    ours, theirs = settings["ours"], settings["trl_config"]
    assert (ours["advantage_estimator"], ours["num_samples_per_prompt"], ours["kl_in"]) == ("grpo", k, "loss")
    assert ours["loss_aggregation"] == "token_mean" and ours["total_episodes"] == 2 * batch
    assert theirs["num_generations"] == k and theirs["max_steps"] == 2 * epochs
    assert 0 <= r["sft"]["greedy"] <= 1 and 0 <= r["sft"]["sampled"] <= 1
    for name in ("trl_ext", "trl"):
        (run,) = r["runs"][name]
        assert run["seed"] == 0 and run["updates"] == 2  # TRL: one update per `num_iterations` optimizer steps
        assert run["seconds_per_update"] > 0 and run["wall_s"] > 0
        assert 0 <= run["greedy"] <= 1 and 0 <= run["sampled"] <= 1
    (ratio,) = r["time_ratio"]
    assert math.isfinite(ratio) and ratio > 0
