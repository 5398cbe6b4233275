"""Policy objectives on the gold task: the GRPO baseline against clip-higher, Dr. GRPO, GSPO, dual clip,
dynamic sampling and an entropy bonus, at the same number of updates, prompts and generated responses, 3 seeds.

The pipeline of benchmarks/gold_critic_free.py (benchmarks/gold_reward.py's data, random base, SFT, noisy preference
pairs and seed-0 proxy reward model; recipes/gold/ppo.yaml: 16 responses per update, 4 PPO epochs, 2 mini-batches,
lr 3e-4), with `advantage_estimator: grpo`, k = 4 samples per prompt, the KL (coefficient 0.05) in the loss, and one
objective key changed per variant (see VARIANTS). Every checkpoint is evaluated by recipes/gold/gold_eval.py (gold
reward, proxy reward, KL to the SFT model); also logged: the policy's entropy, the responses generated per update
(dynamic sampling may generate more) and the wall time per update.

    python benchmarks/objectives.py            # 48 updates x 7 variants x 3 seeds, then the binary-reward pair
    python benchmarks/objectives.py --quick    # 24 updates, 1 seed
    python benchmarks/objectives.py --smoke --ppo-updates 2 --seeds 1 --samples-per-prompt 1   # its test's sizes

The gold task's proxy scores are continuous, so groups of equal scores are rare and dynamic sampling has little to do.
A second part (`BINARY`) trains GRPO on a verifier-like binary reward, 1 when the proxy scores a response above the
SFT model's mean proxy score and 0 otherwise, without and with dynamic sampling, at the same number of generated
responses: a run with dynamic sampling stops once it has generated as many as the 48-update baseline (it then has
fewer updates, each on informative groups only). Gold is still the evaluator.

``--task verifiable`` runs the same VARIANTS on the verifiable addition task instead (`verifiable_study`: the data,
SFT model, RL settings, trainer and held-out exact-match evaluation of benchmarks/verifiable.py, imported; GRPO k=4
with the KL in the loss, 64 completions per update, 100 updates = 6400 generated completions per run, dynamic
sampling stopped at the same number of completions; VERIFIABLE_VARIANTS adds a second entropy bonus), 3 seeds:

    python benchmarks/objectives.py --task verifiable           # 8 variants x 3 seeds, 100 updates each (SFT first)
    python benchmarks/objectives.py --task verifiable --quick   # 30 updates, 1 seed

Writes benchmarks/results/objectives.json (verifiable: objectives_verifiable.json).
"""

from __future__ import annotations

import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import (RESULTS, fresh_workdir, load_average, print_table, setup_env, study_cells, study_parser,
                     study_size, train_with_curve, write_result)  # noqa: E402
from gold_reward import ProxyStudy, _mean, _slug, seed_ends  # noqa: E402

UPDATES = (48, 24)  # PPO updates per run on the gold task: the study's, --quick's (verifiable.py's on that task)
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
#: The verifiable task's variants: the same, and a larger entropy bonus (0.01 leaves this task's entropy, about 0.5
#: nats per token after SFT, where the baseline leaves it).
VERIFIABLE_VARIANTS = {**VARIANTS, "entropy bonus (0.05)": {"entropy_coef": 0.05}}
BINARY = {
    "binary reward: GRPO": {},
    "binary reward: dynamic sampling": {"dynamic_sampling": True, "max_sampling_rounds": 3},
}
LOGGED = ("objective/kl", "objective/entropy", "policy/entropy_avg", "objective/frac_groups_equal_scores",
          "sampling/completions", "policy/clipfrac_avg", "time/rollout", "time/scoring", "time/optimization")


def main(argv=None) -> int:
    p = study_parser(__doc__, "objectives", updates=UPDATES, updates_flag="--ppo-updates", unit="PPO")
    p.add_argument("--samples-per-prompt", type=int, default=4, help="evaluation samples per prompt (96 prompts)")
    p.add_argument("--skip-continuous", action="store_true", help="run the binary-reward part only")
    p.add_argument("--task", choices=("gold", "verifiable"), default="gold",
                   help="gold: the gold task (default); verifiable: the addition task of benchmarks/verifiable.py")
    p.add_argument("--sft-dir", default=None, help="verifiable: reuse this SFT model (its data folder beside it)")
    p.add_argument("--smoke", action="store_true", help="gold: tiny data, pairs, SFT/reward steps (the test's sizes)")
    a = p.parse_args(argv)
    if a.task == "verifiable":
        return verifiable_study(a)
    study = ProxyStudy(a, "objectives", *study_size(a, UPDATES))
    study.overrides.update(GRPO)

    def binary(name):  # the binary-reward variants' scoring, fresh for each of their runs
        return binary_reward(study.sft_point["proxy"], study.updates * 16) if name in BINARY else None

    def completions(logged):  # responses generated by the run (16 per update without dynamic sampling)
        per_update = logged["sampling/completions"]["value"] or [16] * len(logged["objective/kl"]["value"])
        return {"completions": sum(per_update)}

    study.run({**({} if a.skip_continuous else VARIANTS), **BINARY}, LOGGED, kept=6, context=binary, extra=completions)
    report(study.sft_point, study.runs)
    total = study.finish(K)
    print(f"total {total:.0f} s; load average now {load_average()}")
    return 0


def verifiable_study(a) -> int:
    """VERIFIABLE_VARIANTS on the verifiable task, built by benchmarks/verifiable.py (its data, SFT model, RL
    settings, trainer and held-out evaluation, imported): GRPO k=4 with the KL in the loss, 16 prompts x 4 samples = 64
    completions per update, ``--ppo-updates`` (default 100) x 64 completions per run. Dynamic sampling generates more
    per update: its run stops once it has generated that many (`completion_budget`), so it makes fewer updates."""
    import verifiable as vf
    from evaluate import accuracy, read_jsonl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    updates, seeds = study_size(a, vf.UPDATES)
    budget = updates * vf.COMPLETIONS_PER_UPDATE
    estimator = vf.ESTIMATORS[f"GRPO k={K} (KL in loss)"]
    setup_env(threads=1)
    work = Path(a.workdir if a.workdir != str(RESULTS / "objectives_runs") else RESULTS / "objectives_verifiable_runs")
    started = time.perf_counter()
    fresh_workdir(work, create=True)
    sft_dir, sft_seconds, data = vf.sft_or_reuse(work, a.sft_dir)
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    heldout, train_rows = read_jsonl(data / "heldout.jsonl"), read_jsonl(data / "train.jsonl")
    start = accuracy(AutoModelForCausalLM.from_pretrained(sft_dir), tokenizer, heldout)
    print(f"after SFT ({sft_seconds:.0f} s) {start}", flush=True)
    runs = {}
    for seed, name, overrides in study_cells(seeds, VERIFIABLE_VARIANTS, a.only):
        run = runs.setdefault(name, {"overrides": overrides, "seeds": []})
        out = work / f"{_slug(name)}-seed{seed}".translate(str.maketrans("", "", "()=,/.:"))
        trainer = vf.make_rl_trainer(sft_dir, train_rows, out, updates=updates, seed=seed, estimator=estimator,
                                     **overrides)
        seconds, curve = train_with_curve(trainer, tokenizer, heldout, start, updates, f"{out}.log",
                                          callbacks=[completion_budget(budget)])
        kl = vf.logged(trainer, "objective/kl")
        run["seeds"].append({
            "seed": seed, "seconds": seconds, "curve": curve, "updates": len(kl),
            "completions": sum(vf.logged(trainer, "sampling/completions")) or len(kl) * vf.COMPLETIONS_PER_UPDATE,
            **{key: vf.logged(trainer, key) for key in ("reward", "objective/kl", "policy/entropy_avg",
                                                        "frac_reward_zero_std", "policy/clipfrac_avg",
                                                        "sampling/rounds", "sampling/groups_dropped")}})
        print(f"{name} seed {seed}: {seconds:.0f} s, {len(kl)} updates, held-out greedy "
              f"{curve[-1]['greedy']:.3f}, sampled {curve[-1]['sampled']:.3f}, KL {kl[-1]:.2f}", flush=True)
        del trainer
        shutil.rmtree(out, ignore_errors=True)
        write_result("objectives_verifiable", {"updates": updates, "seeds": seeds}, {"sft": start, "runs": runs},
                     out=a.out)  # after every run: a partial study is kept
    total = time.perf_counter() - started
    report_verifiable(start, runs)
    settings = {"task": "verifiable", "quick": a.quick, "updates": updates, "seeds": seeds, "k": K,
                "completions_per_run": budget, "rl": {**vf.RL_SETTINGS, **estimator},
                "seconds": {"total": total, "sft": sft_seconds}}
    write_result("objectives_verifiable", settings, {"sft": start, "runs": runs}, out=a.out)
    print(f"total {total:.0f} s; load average now {load_average()}")
    return 0


def report_verifiable(start, runs) -> None:
    headers = ["variant", "seeds", "held-out greedy acc. (per seed)", "held-out sampled acc. (per seed)",
               "best greedy on the way", "KL to SFT at the end", "entropy at the end", "completions", "updates",
               "frac. groups all equal", "s per run"]
    table = [["SFT model", "-", f"{start['greedy']:.3f}", f"{start['sampled']:.3f}", "-", 0.0, "-", "-", "-", "-",
              "-"]]
    for name, run in runs.items():
        rs = run["seeds"]
        ends = [r["curve"][-1] for r in rs]
        table.append([
            name, len(rs),
            *(f"{_mean(e[key] for e in ends):.3f} ({' / '.join(f'{e[key]:.3f}' for e in ends)})"
              for key in ("greedy", "sampled")),
            _mean(max(q["greedy"] for q in r["curve"][1:]) for r in rs), _mean(r["objective/kl"][-1] for r in rs),
            _mean(r["policy/entropy_avg"][-1] for r in rs), _mean(r["completions"] for r in rs),
            _mean(r["updates"] for r in rs), _mean(_mean(r["frac_reward_zero_std"]) for r in rs),
            _mean(r["seconds"] for r in rs)])
    print_table(headers, table)


def completion_budget(budget: int):
    """A TrainerCallback that stops training once ``budget`` completions were generated (dynamic sampling's
    `sampling/completions` per update; without it every update generates ``args.batch_size``)."""
    from transformers import TrainerCallback

    class Budget(TrainerCallback):
        def __init__(self):
            self.generated = 0

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "objective/kl" in logs:
                self.generated += logs.get("sampling/completions", args.batch_size)
                if self.generated >= budget:
                    control.should_training_stop = True

    return Budget()


@contextmanager
def binary_reward(threshold: float, budget: int):
    """While active, the recipe pipeline's `trl_ext.PPOTrainer` scores 1 where the proxy reward model's score exceeds
    ``threshold`` and 0 elsewhere, and stops once ``budget`` responses were generated (dynamic sampling's
    `sampling/completions`; without it every update generates 16)."""
    import trl_ext

    class BinaryProxy(trl_ext.PPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(completion_budget(budget))

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
        ends, golds, bests, spread = seed_ends(run)
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
