"""Critic-free advantage estimators on the gold task: GAE with a value model vs RLOO, GRPO and REINFORCE++
at the same number of generated responses and the same KL coefficient, several training seeds.

The pipeline of benchmarks/gold_reward.py (data, random base, SFT, 1000 noisy preference pairs, the seed-0 proxy reward
model), then PPO (recipes/gold/ppo.yaml: 16 responses per update, 4 PPO epochs, 2 mini-batches, lr 3e-4, KL coefficient
0.05) with each advantage estimator; the group estimators sample each prompt k = 4 times (4 prompts x 4 samples per
update, where GAE and plain REINFORCE++ see 16 prompts once). The KL coefficient is 0.05 everywhere: in the reward for
GAE, RLOO and REINFORCE++, for GRPO both in the loss (k3, GRPO's own choice) and in the reward. Every checkpoint is evaluated by
recipes/gold/gold_eval.py: gold reward, proxy reward, KL to the SFT model, LM loss. Also measured per run: wall time
per update (the trainer's time/rollout + time/scoring + time/optimization) and the peak anonymous RSS of the run.

    python benchmarks/gold_critic_free.py            # 48 updates x 6 variants x 3 seeds (about 9 min under load)
    python benchmarks/gold_critic_free.py --quick    # 24 updates, 1 seed
    python benchmarks/gold_critic_free.py --smoke --ppo-updates 2 --seeds 1 --samples-per-prompt 1   # its test

Writes benchmarks/results/gold_critic_free.json and benchmarks/figures/gold_critic_free.png.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import load_average, print_table, pyplot_into, save_figure, study_parser, study_size  # noqa: E402
from gold_reward import FIGURES, ProxyStudy, _mean, seed_ends  # noqa: E402

UPDATES = (48, 24)  # PPO updates per run: the study's, --quick's
K = 4
ESTIMATORS = {
    "GAE (value model)": {},
    f"RLOO k={K}": {"advantage_estimator": "rloo", "num_samples_per_prompt": K},
    f"GRPO k={K} (KL in loss)": {"advantage_estimator": "grpo", "num_samples_per_prompt": K},
    f"GRPO k={K} (KL in reward)": {"advantage_estimator": "grpo", "num_samples_per_prompt": K, "kl_in": "reward"},
    "REINFORCE++": {"advantage_estimator": "reinforce_pp"},
    f"REINFORCE++-baseline k={K}": {"advantage_estimator": "reinforce_pp_baseline", "num_samples_per_prompt": K},
}
LOGGED = ("objective/kl", "objective/scores", "objective/frac_groups_equal_scores", "time/rollout", "time/scoring",
          "time/optimization")


def main(argv=None) -> int:
    p = study_parser(__doc__, "gold_critic_free", updates=UPDATES, what="estimator", updates_flag="--ppo-updates",
                     unit="PPO")
    p.add_argument("--samples-per-prompt", type=int, default=4, help="evaluation samples per prompt (96 prompts)")
    p.add_argument("--smoke", action="store_true", help="tiny data, pairs and SFT/reward steps (the test's sizes)")
    p.add_argument("--figures", default=str(FIGURES), help="where the PNG figure goes ('' for none)")
    a = p.parse_args(argv)
    study = ProxyStudy(a, "gold_critic_free", *study_size(a, UPDATES))
    study.run(ESTIMATORS, LOGGED, kept=3)
    report(study.sft_point, study.runs)
    total = study.finish(K)
    if a.figures:
        draw_figure(Path(a.figures), study.sft_point, study.runs)
    print(f"total {total:.0f} s; load average now {load_average()}")
    return 0


def report(sft_point, runs) -> None:
    headers = ["estimator", "seeds", "gold at the end (range)", "proxy", "KL to SFT", "LM loss",
               "best gold on the way (KL there)", "gold / KL at the end", "frac. groups all equal",
               "s per update", "peak anon MB"]
    table = [["SFT model", "-", f"{sft_point['gold']:.2f}", sft_point["proxy"], 0.0, sft_point["lm_loss"], "-", "-",
              "-", "-", "-"]]
    for name, run in runs.items():
        ends, golds, bests, spread = seed_ends(run)
        frac = [v for r in run["seeds"] for v in r["logged"]["objective/frac_groups_equal_scores"]["value"]]
        gain = [(e["gold"] - sft_point["gold"]) / max(e["kl"], 1e-6) for e in ends]
        table.append([name, len(ends), f"{_mean(golds):.2f}{spread}", _mean(e["proxy"] for e in ends),
                      _mean(e["kl"] for e in ends), _mean(e["lm_loss"] for e in ends),
                      f"{_mean(b['gold'] for b in bests):.2f} ({_mean(b['kl'] for b in bests):.2f})",
                      _mean(gain), _mean(frac) if frac else "-",
                      _mean(r["seconds_per_update"] for r in run["seeds"]),
                      _mean(r["peak_anon_mb"] for r in run["seeds"])])
    print_table(headers, table)


def draw_figure(folder: Path, sft_point, runs) -> None:
    """Gold vs KL (every checkpoint of every seed) and proxy vs gold, one colour per estimator."""
    plt = pyplot_into(folder)
    if plt is None:
        return
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, (name, run) in enumerate(runs.items()):
        for j, r in enumerate(run["seeds"]):
            pts = r["points"]
            kw = dict(color=colors(i), marker="o", markersize=3, linewidth=1, alpha=0.8,
                      label=name if j == 0 else None)
            axes[0].plot([max(q["kl"], 0.0) for q in pts], [q["gold"] for q in pts], **kw)
            axes[1].plot([q["proxy"] for q in pts], [q["gold"] for q in pts], **kw)
    for ax in axes:
        ax.axhline(sft_point["gold"], color="grey", linewidth=0.8, linestyle=":", label="SFT")
        ax.set_ylabel("gold reward (max 3)")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("KL(policy || SFT) per response (nats)")
    axes[0].set_title("Gold reward vs KL (every checkpoint, every seed)", fontsize=10)
    axes[1].set_xlabel("proxy reward (reward model score)")
    axes[1].set_title("Proxy vs gold reward over training", fontsize=10)
    axes[0].legend(fontsize=7)
    save_figure(fig, folder / "gold_critic_free.png", dpi=80)


if __name__ == "__main__":
    sys.exit(main())
