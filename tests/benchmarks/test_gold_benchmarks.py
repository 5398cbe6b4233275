"""benchmarks/gold_reward.py, gold_critic_free.py, gold_upcast.py and objectives.py (its gold task) through their
``main`` with ``--smoke`` (64 SFT examples, 32 + 16 preference pairs, 2 SFT, reward and DPO steps), one training
seed, one or two PPO updates and one evaluation sample per prompt: every step of the pipeline and every variant each
study compares runs, and its result JSON holds each variant's evaluated checkpoints. Nothing here depends on what the
tiny models learn: each variant is recognised by what its settings make the trainer log or load."""

from __future__ import annotations

import json
import math

from benchmark_scripts import loaded_script

SMALL_EVAL = ["--smoke", "--seeds", "1", "--samples-per-prompt", "1"]


def run(tmp_path, name, *args) -> dict:
    out = tmp_path / f"{name}.json"
    with loaded_script(name) as script:
        assert script.main([*SMALL_EVAL, *args, "--workdir", str(tmp_path / "work"), "--out", str(out)]) == 0
        constants = {k: getattr(script, k) for k in ("ESTIMATORS", "QLORA_POLICY", "VARIANTS", "BINARY")
                     if hasattr(script, k)}
    return {**json.loads(out.read_text()), **constants}


def evaluated(point: dict, proxy: bool = True) -> bool:
    keys = ("gold", "kl", "lm_loss", "length") + (("proxy",) if proxy else ())
    return all(math.isfinite(point[k]) for k in keys) and -3 <= point["gold"] <= 3


def checkpoints(seed_record: dict, sft: dict, steps: list[int]) -> bool:
    """The run's points: the SFT model's, then one per checkpoint at ``steps``, each evaluated."""
    points = seed_record["points"]
    return points[0] == sft and [p["step"] for p in points[1:]] == steps and all(map(evaluated, points))


def test_gold_reward_every_reward_model_ppo_and_dpo_variant(tmp_path):
    result = run(tmp_path, "gold_reward", "--ppo-updates", "1", "--reward-seeds", "1",
                 "--figures", str(tmp_path / "figures"))
    assert result["meta"]["settings"]["smoke"] is True
    r = result["results"]
    assert r["pairs"]["train"]["pairs"] == 32 and r["pairs"]["test"]["pairs"] == 16
    assert r["pairs"]["test"]["flipped"] == 0  # the held-out pairs' labels are clean
    assert [m["label_smoothing"] for m in r["reward_models"]] == [0.0, 0.2]
    assert all(0 <= m["gold_accuracy"] <= 1 and 0 <= m["noisy_train_accuracy"] <= 1 for m in r["reward_models"])
    sft = r["sft"]
    assert sft["step"] == 0 and sft["kl"] == 0.0 and evaluated(sft)
    kl_coefs = {"PPO kl 0.01": 0.01, "PPO kl 0.05": 0.05, "PPO kl 0.2": 0.2, "PPO adaptive kl": 0.05,
                "PPO-ptx kl 0.05": 0.05}
    dpo = ["DPO beta 0.03", "DPO beta 0.1", "DPO beta 0.3", "cDPO beta 0.1"]
    assert list(r["runs"]) == [*kl_coefs, *dpo]
    for name, coef in kl_coefs.items():
        (seed,) = r["runs"][name]["seeds"]
        assert r["runs"][name]["kind"] == "ppo" and checkpoints(seed, sft, [1])
        assert seed["logged"]["objective/kl_coef"]["value"] == [coef]  # the update's coefficient (adaptive: its start)
    assert r["runs"]["PPO-ptx kl 0.05"]["overrides"]["ptx_dataset_name"].endswith("ptx.jsonl")
    for name in dpo:  # 2 steps (--smoke) of a batch of 32 pairs, a checkpoint after each
        (seed,) = r["runs"][name]["seeds"]
        assert r["runs"][name]["kind"] == "dpo" and checkpoints(seed, sft, [1, 2])
        assert len(seed["logged"]["rewards/margins"]["value"]) >= 1
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == [
        "gold_proxy_vs_gold.png", "gold_training_curves.png", "gold_vs_kl.png"]


def test_gold_critic_free_every_estimator(tmp_path):
    result = run(tmp_path, "gold_critic_free", "--ppo-updates", "2", "--figures", str(tmp_path / "figures"))
    r = result["results"]
    assert list(r["runs"]) == list(result["ESTIMATORS"])
    for name, run_ in r["runs"].items():
        assert run_["overrides"] == result["ESTIMATORS"][name]
        (seed,) = run_["seeds"]
        assert checkpoints(seed, r["sft"], [1, 2])
        assert seed["seconds_per_update"] > 0 and seed["peak_anon_mb"] > 0
        assert len(seed["logged"]["objective/scores"]["value"]) == 2
        # only the group estimators (k = 4) log the fraction of groups whose scores are all equal
        grouped = run_["overrides"].get("num_samples_per_prompt", 1) > 1
        assert len(seed["logged"]["objective/frac_groups_equal_scores"]["value"]) == (2 if grouped else 0)
    assert (tmp_path / "figures" / "gold_critic_free.png").is_file()


def test_gold_upcast_both_residual_dtypes(tmp_path):
    """The 4-bit nf4 LoRA policy in bfloat16, with and without the float32 upcast of the non-quantized modules."""
    result = run(tmp_path, "gold_upcast", "--updates", "2")
    r = result["results"]
    assert result["meta"]["settings"]["policy"] == result["QLORA_POLICY"]
    assert sorted(r["start"]) == ["False", "True"] and all(map(evaluated, r["start"].values()))
    runs = {run_["upcast_non_quantized"]: run_ for run_ in r["runs"]}
    assert sorted(runs) == [False, True] and len(r["runs"]) == 2
    assert runs[True]["embedding_dtype"] == "torch.float32" and runs[False]["embedding_dtype"] == "torch.bfloat16"
    for run_ in runs.values():
        assert evaluated(run_["end"]) and run_["seconds"] > 0
        assert len(run_["logged"]["objective/scores"]["value"]) == 2


def test_objectives_every_variant_on_the_gold_task(tmp_path):
    """GRPO with each objective setting, then the binary-reward pair (the proxy's score thresholded at the SFT model's
    mean), without and with dynamic sampling."""
    result = run(tmp_path, "objectives", "--ppo-updates", "2")
    variants = {**result["VARIANTS"], **result["BINARY"]}
    r = result["results"]
    assert list(r["runs"]) == list(variants)
    for name, run_ in r["runs"].items():
        assert run_["overrides"] == variants[name]
        (seed,) = run_["seeds"]
        logged = seed["logged"]
        updates = len(logged["objective/kl"]["value"])
        dynamic = variants[name].get("dynamic_sampling", False)
        # the binary runs stop at 2 x 16 generated responses: dynamic sampling may get there in one update
        assert updates == 2 or (dynamic and updates == 1)
        assert checkpoints(seed, r["sft"], list(range(1, updates + 1)))
        assert bool(logged["sampling/completions"]["value"]) == dynamic  # only dynamic sampling logs what it drew
        assert seed["completions"] >= 32 if dynamic else seed["completions"] == 32
        assert len(logged["objective/frac_groups_equal_scores"]["value"]) == updates  # k = 4 in every variant
        # the time of the updates after the first (none after a single one)
        assert seed["seconds_per_update"] > 0 if updates == 2 else math.isnan(seed["seconds_per_update"])
