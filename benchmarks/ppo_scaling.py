"""How a trl_ext PPO update's time grows with response length and batch size (1x, 2x, 4x), and where it goes.

One small Llama policy/value/reward (built in memory), trl_ext.PPOTrainer at TRL's defaults (4 PPO epochs, 2
mini-batches, micro-batches of 2). Five settings: the base (`--batch`, `--response-length`), the response length
doubled and quadrupled, the batch doubled and quadrupled. The runs alternate in one process, `--repeats` times;
each trains `--updates` updates and the first is left out. Per update the trainer logs `time/rollout` (generation
+ sampling log-probs), `time/scoring` (reference, value and reward forward passes, masks, rewards, GAE) and
`time/optimization` (PPO epochs: forward, backward, optimizer steps); "other" is the rest of the update (metrics,
logging, callbacks, the garbage collector). Growth = median over repeats of t(setting) / t(base) within a repeat;
linear growth reads 2 and 4, the exponent is log2(growth 4x) / 2 (1 = linear, 0 = constant).

    python benchmarks/ppo_scaling.py             # about 75 s on 2 busy CPU cores
    python benchmarks/ppo_scaling.py --quick     # about 30 s: 2 repeats of 3 updates

Prints a table and writes benchmarks/results/ppo_scaling.json.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import GcTimer, alternate, freeze_gc, median, print_table, ratios, setup_env, write_result  # noqa: E402

PHASES = ("rollout", "scoring", "optimization")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 repeats of 3 updates")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--updates", type=int, default=4, help="PPO updates per run (the first is not timed)")
    p.add_argument("--batch", type=int, default=4, help="base episodes per update (multiple of 4)")
    p.add_argument("--response-length", type=int, default=16, help="base response length (tokens)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-gc-freeze", action="store_true", help="see ppo_overhead.py")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.updates = 2, 3
    setup_env(a.threads)
    from _ppo_setup import Models, UpdateTimer, config_kwargs, make_trainer, prompts, update_logs

    models = Models(a.hidden, a.layers)
    data = prompts(models.tokenizer, n=8 * a.batch)
    gc_info = {} if a.no_gc_freeze else freeze_gc()
    settings = {"base": (1, 1), "response x2": (1, 2), "response x4": (1, 4), "batch x2": (2, 1), "batch x4": (4, 1)}

    def run(batch_factor, length_factor):
        def go():
            timer = UpdateTimer()
            trainer = make_trainer("ext", models, data, callbacks=[timer], **config_kwargs(
                batch=a.batch * batch_factor, response_length=a.response_length * length_factor, updates=a.updates))
            with GcTimer() as gc_timer:
                trainer.train()
            logs = update_logs(trainer)[1:]
            n = len(logs)
            out = {"update": sum(timer.seconds[1:]) / n, "gc_per_update": gc_timer.seconds / (n + 1)}
            for phase in PHASES:
                out[phase] = sum(entry[f"time/{phase}"] for entry in logs) / n
            out["other"] = out["update"] - sum(out[phase] for phase in PHASES)
            return out

        return go

    make_trainer("ext", models, data, **config_kwargs(batch=a.batch, response_length=a.response_length,
                                                      updates=1)).train()  # warm-up, untimed
    runs = alternate({name: run(*factors) for name, factors in settings.items()}, a.repeats)

    results = []
    for name, (bf, lf) in settings.items():
        row = {"setting": name, "batch": a.batch * bf, "response_length": a.response_length * lf}
        for key in ("update", *PHASES, "other", "gc_per_update"):
            row[f"{key}_s"] = median([r[key] for r in runs[name]])
        for key in ("update", *PHASES):
            row[f"{key}_growth"] = median(ratios([r[key] for r in runs[name]], [r[key] for r in runs["base"]]))
        factor = bf * lf
        row["update_exponent"] = math.log(row["update_growth"]) / math.log(factor) if factor > 1 else None
        row["runs"] = runs[name]
        results.append(row)

    print(f"\nPPO update time vs size: trl_ext.PPOTrainer, policy {models.policy_parameters / 1e6:.2f}M parameters, "
          f"{a.repeats} repeats x {a.updates - 1} timed updates; seconds per update (median), growth vs base")
    print_table(
        ["setting", "batch", "response", "s/update", "growth", "exponent", "rollout s (growth)", "scoring s (growth)",
         "optimization s (growth)", "other s"],
        [[r["setting"], r["batch"], r["response_length"], r["update_s"], r["update_growth"],
          "-" if r["update_exponent"] is None else f"{r['update_exponent']:.2f}",
          f"{r['rollout_s']:.3f} ({r['rollout_growth']:.2f})", f"{r['scoring_s']:.3f} ({r['scoring_growth']:.2f})",
          f"{r['optimization_s']:.3f} ({r['optimization_growth']:.2f})", r["other_s"]] for r in results],
    )
    shares = {r["setting"]: {k: r[f"{k}_s"] / r["update_s"] for k in (*PHASES, "other")} for r in results}
    print("share of the update: " + "; ".join(
        f"{name}: " + ", ".join(f"{k} {v:.0%}" for k, v in s.items()) for name, s in shares.items()))
    write_result("ppo_scaling", vars(a), results, out=a.out, shares=shares, gc=gc_info,
                 policy_parameters=models.policy_parameters)


if __name__ == "__main__":
    main()
