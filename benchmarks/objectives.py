"""Policy objectives on the gold task (issue 26): the GRPO baseline against clip-higher, Dr. GRPO, GSPO, dual clip,
dynamic sampling and an entropy bonus, at the same number of updates, prompts and generated responses, 3 seeds.

The pipeline of benchmarks/gold_critic_free.py (benchmarks/gold_reward.py's data, random base, SFT, noisy preference
pairs and seed-0 proxy reward model; recipes/gold/ppo.yaml: 16 responses per update, 4 PPO epochs, 2 mini-batches,
lr 3e-4), with `advantage_estimator: grpo`, k = 4 samples per prompt, the KL (coefficient 0.05) in the loss, and one
objective key changed per variant (see VARIANTS). Every checkpoint is evaluated by recipes/gold/gold_eval.py (gold
reward, proxy reward, KL to the SFT model); also logged: the policy's entropy, the responses generated per update
(dynamic sampling may generate more) and the wall time per update.

    python benchmarks/objectives.py            # 48 updates x 7 variants x 3 seeds, then the binary-reward pair
    python benchmarks/objectives.py --quick    # 24 updates, 1 seed

The gold task's proxy scores are continuous, so groups of equal scores are rare and dynamic sampling has little to do.
A second part (`BINARY`) trains GRPO on a verifier-like binary reward, 1 when the proxy scores a response above the
SFT model's mean proxy score and 0 otherwise, without and with dynamic sampling, at the same number of generated
responses: a run with dynamic sampling stops once it has generated as many as the 48-update baseline (it then has
fewer updates, each on informative groups only). Gold is still the evaluator.

Writes benchmarks/results/objectives.json.
"""

from __future__ import annotations

import argparse
import shutil
from contextlib import contextmanager
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import RESULTS, AnonPeakSampler, load_average, print_table, setup_env, write_result  # noqa: E402
from gold_reward import NOISE, _cleanup, _mean, _slug, log_series, proxy_setup, train  # noqa: E402

K = 4
GRPO = {"advantage_estimator": "grpo", "num_samples_per_prompt": K}
VARIANTS = {
    "GRPO (baseline)": {},
    "clip-higher (0.2/0.28)": {"cliprange_high": 0.28},
    "Dr. GRPO (sum/L, no std)": {"loss_aggregation": "seq_mean_token_sum_norm", "grpo_scale_by_std": False},
    "GSPO (sequence ratio)": {"ratio_level": "sequence", "loss_aggregation": "seq_mean_token_mean",
                              "cliprange_low": 3e-4, "cliprange_high": 4e-4},
    "dual clip (c = 3)": {"dual_clip": 3.0},
    "dynamic sampling": {"dynamic_sampling": True, "max_sampling_rounds": 3},
    "entropy bonus (0.01)": {"entropy_coef": 0.01},
}
BINARY = {
    "binary reward: GRPO": {},
    "binary reward: dynamic sampling": {"dynamic_sampling": True, "max_sampling_rounds": 3},
}
LOGGED = ("objective/kl", "objective/entropy", "policy/entropy_avg", "objective/frac_groups_equal_scores",
          "sampling/completions", "policy/clipfrac_avg", "time/rollout", "time/scoring", "time/optimization")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="24 updates, one seed")
    p.add_argument("--ppo-updates", type=int, default=None, help="PPO updates per run (default 48, quick 24)")
    p.add_argument("--seeds", type=int, default=None, help="training seeds per variant (default 3, quick 1)")
    p.add_argument("--samples-per-prompt", type=int, default=4, help="evaluation samples per prompt (96 prompts)")
    p.add_argument("--only", nargs="*", default=None, help="run only these variants (names as in the table)")
    p.add_argument("--workdir", default=str(RESULTS / "objectives_runs"), help="where the runs are written")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/objectives.json)")
    p.add_argument("--skip-continuous", action="store_true", help="run the binary-reward part only")
    a = p.parse_args(argv)
    updates = a.ppo_updates or (24 if a.quick else 48)
    seeds = list(range(a.seeds or (1 if a.quick else 3)))

    setup_env(threads=1)
    work = Path(a.workdir)
    if work.exists():
        shutil.rmtree(work)
    started = time.perf_counter()
    data, reward_dir, evaluator = proxy_setup(work, a.samples_per_prompt)
    sft_point = {"step": 0, **evaluator.evaluate(work / "sft")}

    common = {"model_name_or_path": work / "sft", "reward_model_path": reward_dir,
              "dataset_name": data / "prompts.jsonl", "total_episodes": updates * 16, "save_strategy": "steps",
              "save_steps": max(1, updates // 4), "disable_tqdm": True, **GRPO}
    runs = {}
    variants = {**({} if a.skip_continuous else VARIANTS), **BINARY}
    for seed in seeds:  # seeds outermost: a cut-short study still has every variant
        for name, overrides in variants.items():
            if a.only is not None and name not in a.only:
                continue
            run = runs.setdefault(name, {"overrides": overrides, "seeds": []})
            out = work / f"{_slug(name)}-seed{seed}".translate(str.maketrans("", "", "()=,/.:"))
            binary = binary_reward(sft_point["proxy"], updates * 16) if name in BINARY else None
            with AnonPeakSampler(interval=0.02) as peak, binary or _nothing():
                trainer, secs = train("ppo", {**common, **overrides, "output_dir": out, "seed": seed})
            logged = log_series(trainer, *LOGGED)
            per_update = [sum(logged[k]["value"][i] for k in ("time/rollout", "time/scoring", "time/optimization"))
                          for i in range(1, len(logged["time/rollout"]["value"]))]  # the first update left out
            completions = logged["sampling/completions"]["value"] or [16] * len(logged["objective/kl"]["value"])
            run["seeds"].append({"seed": seed, "seconds": secs, "seconds_per_update": _mean(per_update),
                                 "peak_anon_mb": peak.peak_mb, "points": [sft_point] + evaluator.evaluate_run(out),
                                 "completions": sum(completions),
                                 "logged": {k: logged[k] for k in LOGGED[:6]}})
            del trainer
            _cleanup(out, False)
            write_result("objectives", {"updates": updates, "seeds": seeds}, {"sft": sft_point, "runs": runs},
                         out=a.out)  # after every run: a partial study is kept

    total = time.perf_counter() - started
    report(sft_point, runs)
    settings = {"quick": a.quick, "ppo_updates": updates, "seeds": seeds, "k": K, "noise": NOISE,
                "samples_per_prompt": a.samples_per_prompt, "seconds": {"total": total}}
    write_result("objectives", settings, {"sft": sft_point, "runs": runs}, out=a.out)
    print(f"total {total:.0f} s; load average now {load_average()}")
    return 0


@contextmanager
def _nothing():
    yield


@contextmanager
def binary_reward(threshold: float, budget: int):
    """While active, the recipe pipeline's `trl_ext.PPOTrainer` scores 1 where the proxy reward model's score exceeds
    ``threshold`` and 0 elsewhere, and stops once ``budget`` responses were generated (dynamic sampling's
    `sampling/completions`; without it every update generates 16)."""
    import trl_ext
    from transformers import TrainerCallback

    class Budget(TrainerCallback):
        def __init__(self):
            self.generated = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "objective/kl" in logs:
                self.generated += logs.get("sampling/completions", args.batch_size)
                if self.generated >= budget:
                    control.should_training_stop = True

    class BinaryProxy(trl_ext.PPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(Budget())

        def compute_scores(self, postprocessed_query_response, context_length):
            return (super().compute_scores(postprocessed_query_response, context_length) > threshold).float()

    original = trl_ext.PPOTrainer
    trl_ext.PPOTrainer = BinaryProxy
    try:
        yield
    finally:
        trl_ext.PPOTrainer = original


def report(sft_point, runs) -> None:
    headers = ["variant", "seeds", "gold at the end (range)", "proxy", "KL to SFT", "best gold on the way (KL there)",
               "policy entropy at the end", "responses generated", "updates", "frac. groups all equal",
               "s per update"]
    table = [["SFT model", "-", f"{sft_point['gold']:.2f}", sft_point["proxy"], 0.0, "-", "-", "-", "-", "-", "-"]]
    for name, run in runs.items():
        ends = [r["points"][-1] for r in run["seeds"]]
        golds = [e["gold"] for e in ends]
        bests = [max(r["points"], key=lambda q: q["gold"]) for r in run["seeds"]]
        spread = f" ({min(golds):.2f}-{max(golds):.2f})" if len(golds) > 1 else ""
        frac = [v for r in run["seeds"] for v in r["logged"]["objective/frac_groups_equal_scores"]["value"]]
        entropy = [r["logged"]["policy/entropy_avg"]["value"][-1] for r in run["seeds"]]
        table.append([name, len(ends), f"{_mean(golds):.2f}{spread}", _mean(e["proxy"] for e in ends),
                      _mean(e["kl"] for e in ends),
                      f"{_mean(b['gold'] for b in bests):.2f} ({_mean(b['kl'] for b in bests):.2f})",
                      _mean(entropy), _mean(r["completions"] for r in run["seeds"]),
                      _mean(len(r["logged"]["objective/kl"]["value"]) for r in run["seeds"]), _mean(frac),
                      _mean(r["seconds_per_update"] for r in run["seeds"])])
    print_table(headers, table)


if __name__ == "__main__":
    sys.exit(main())
