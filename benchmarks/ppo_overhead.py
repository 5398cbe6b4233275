"""What trl_ext's PPO extensions cost: update time and peak memory against trl.experimental.ppo.PPOTrainer.

Same tiny Llama policy/value/reward models (built in memory), same prompts, same seed. Three configurations of
trl_ext.PPOTrainer, each against the baseline: TRL's own trainer at its defaults where the installed TRL ships one
(1.10-1.12). TRL 1.13 and later have no PPOTrainer; there the baseline is trl_ext.PPOTrainer with every extension at
its default (on trl-ext's own PPO base), so (a) measures run-to-run noise and (b), (c) the extensions' cost. The
output says which baseline ran.

  (a) every extension at its default (must log exactly TRL's numbers: checked here too),
  (b) adaptive KL controller + value_clip="mean",
  (c) PPO-ptx, joint mode (ptx_coef 0.05); its ptx share is reported separately.

Time: the runs alternate in one process (TRL, a, b, c, then rotated), `--repeats` times; each run trains
`--updates` PPO updates and is timed per update (callback), the first update left out (warm-up). Reported: the
median over repeats of the per-repeat ratio trl_ext / TRL, the target being <= 1.05 for (a) and (b). The ptx share
of (c) is the median per-repeat (t_c - t_a) / t_c and, separately, the time of the ptx forward passes alone.

The garbage collector: both trainers run gc.collect() twice per update; with torch/transformers/TRL imported that
scans ~500k objects (~0.3 s each here), a constant that would dilute the ratios. So the script first moves the
objects alive after setup to the permanent generation (gc.freeze(); `--no-gc-freeze` to measure without).

Memory: each configuration runs once more in a fresh child process (`--child`), where the peak RSS (VmHWM) is reset
right before train() and read after it; reported: that train-time peak growth and the process's whole peak.

    python benchmarks/ppo_overhead.py            # about 75 s on 2 busy CPU cores
    python benchmarks/ppo_overhead.py --quick    # about 20 s: 3 repeats of 4 updates, no memory children

Prints a table and writes benchmarks/results/ppo_overhead.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (alternate, child_result, freeze_gc, median, peak_rss_mb, print_table, ratios, reset_peak_rss,
                     rss_mb, run_child, setup_env, write_result)  # noqa: E402

CONFIGS = {
    "trl": ("trl", {}),
    "a_defaults": ("ext", {}),
    "b_adaptive_kl_value_mean": ("ext", {"kl_controller": "adaptive", "kl_coef": 0.2, "value_clip": "mean"}),
    "c_ptx_joint": ("ext", {"ptx_coef": 0.05}),
}
LABELS = {
    "a_defaults": "(a) all extensions at defaults",
    "b_adaptive_kl_value_mean": "(b) adaptive KL + value_clip mean",
    "c_ptx_joint": "(c) ptx joint, ptx_coef 0.05",
}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repeats of 4 updates, no memory children")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--updates", type=int, default=6, help="PPO updates per run (the first is not timed)")
    p.add_argument("--batch", type=int, default=8, help="episodes per update")
    p.add_argument("--response-length", type=int, default=16)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--no-gc-freeze", action="store_true",
                   help="leave the imported libraries' objects to the collector: every gc.collect() of the PPO loop "
                        "(2 per update, same in both trainers) then costs ~0.3 s here and dominates tiny updates")
    p.add_argument("--child", choices=list(CONFIGS), help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.repeats, a.updates, a.no_memory = 3, 4, True
    return a


def build(a):
    from _ppo_setup import Models, config_kwargs, prompts, ptx_texts

    models = Models(a.hidden, a.layers)
    # more prompts than one run takes: no update takes an epoch's last prompt batch, where TRL 1.12 steps on every
    # micro-batch and trl-ext once per mini-batch (docs/ppo.md, "Where TRL 1.12's PPO counts differently")
    data = prompts(models.tokenizer, n=a.batch * (a.updates + 1))
    base = config_kwargs(batch=a.batch, response_length=a.response_length, updates=a.updates)
    return models, data, ptx_texts(), base


def trainer_for(name, models, data, ptx, base, callbacks=(), trainer_cls=None):
    from _ppo_setup import make_trainer

    kind, extra = CONFIGS[name]
    return make_trainer(kind, models, data, ptx_data=ptx if extra.get("ptx_coef") else None, callbacks=callbacks,
                        trainer_cls=trainer_cls, **base, **extra)


def child(a):
    """One configuration, one run, in this fresh process: peak RSS growth during train()."""
    setup_env(a.threads)
    models, data, ptx, base = build(a)
    if not a.no_gc_freeze:
        freeze_gc()
    trainer = trainer_for(a.child, models, data, ptx, base)
    before = rss_mb()
    reset = reset_peak_rss()
    trainer.train()
    child_result({"config": a.child, "rss_before_train_mb": before, "peak_rss_mb": peak_rss_mb(),
                  "train_peak_growth_mb": peak_rss_mb() - before, "peak_reset": reset})


def main(argv=None):
    a = parse(argv)
    if a.child:
        return child(a)
    setup_env(a.threads)
    from _ppo_setup import UpdateTimer, baseline, update_logs

    from trl_ext import PPOTrainer

    models, data, ptx, base = build(a)
    gc_info = {} if a.no_gc_freeze else freeze_gc()

    class PtxTimed(PPOTrainer):
        """trl_ext.PPOTrainer that adds up the time of its ptx forward passes (loss included, backward not)."""

        ptx_seconds = 0.0

        def compute_ptx_loss(self, batch):
            t = time.perf_counter()
            try:
                return super().compute_ptx_loss(batch)
            finally:
                self.ptx_seconds += time.perf_counter() - t

    logs, ptx_forward = {}, []

    def timed(name):
        def run():
            timer = UpdateTimer()
            cls = PtxTimed if name == "c_ptx_joint" else None
            trainer = trainer_for(name, models, data, ptx, base, callbacks=[timer], trainer_cls=cls)
            trainer.train()
            logs[name] = update_logs(trainer)
            if cls is not None:
                ptx_forward.append(trainer.ptx_seconds * (a.updates - 1) / a.updates)  # ~ timed updates only
            return sum(timer.seconds[1:])

        return run

    # warm-up: one short run of each trainer class, untimed (first-call costs of torch, generate, optimizers)
    for name in ("trl", "c_ptx_joint"):
        trainer_for(name, models, data, ptx, {**base, "total_episodes": a.batch}).train()

    times = alternate({name: timed(name) for name in CONFIGS}, a.repeats)
    identical = all(
        all(abs(child[k] - parent[k]) <= 1e-6 * max(1.0, abs(parent[k])) for k in parent
            if k not in ("eps", "step") and not k.startswith("time/"))  # wall clock
        for parent, child in zip(logs["trl"], logs["a_defaults"])
    )
    per_update_trl = median(times["trl"]) / (a.updates - 1)
    results = []
    for name in ("a_defaults", "b_adaptive_kl_value_mean", "c_ptx_joint"):
        r = ratios(times[name], times["trl"])
        results.append({
            "config": name, "label": LABELS[name], "ext_update_s": median(times[name]) / (a.updates - 1),
            "trl_update_s": per_update_trl, "ratio_median": median(r), "ratios": r,
            "ext_total_s": times[name], "trl_total_s": times["trl"],
        })
    ptx_share = ratios([c - d for c, d in zip(times["c_ptx_joint"], times["a_defaults"])], times["c_ptx_joint"])
    ptx = {"share_of_update_median": median(ptx_share), "shares": ptx_share,
           "ptx_forward_share_median": median(ratios(ptx_forward, times["c_ptx_joint"]))}

    memory = []
    if not a.no_memory:
        passthrough = (["--no-gc-freeze"] if a.no_gc_freeze else []) + ["--batch", str(a.batch), "--response-length", str(a.response_length), "--updates",
                       str(a.updates), "--hidden", str(a.hidden), "--layers", str(a.layers), "--threads",
                       str(a.threads)]
        for name in CONFIGS:
            memory.append(run_child(Path(__file__), ["--child", name, *passthrough]))
        trl_growth = memory[0]["train_peak_growth_mb"]
        for m in memory:  # no ratio where the baseline's training raised no peak (tiny models: freed heap reused)
            m["growth_ratio_vs_trl"] = m["train_peak_growth_mb"] / trl_growth if trl_growth > 0 else None

    print(f"\nPPO update, trl_ext vs the baseline: policy {models.policy_parameters / 1e6:.2f}M parameters, batch "
          f"{a.batch}, response {a.response_length}, {a.repeats} repeats x {a.updates - 1} timed updates; "
          f"(a) logs identical to the baseline's: {identical}")
    print(f"baseline (TRL columns): {baseline()}")
    mem = {m["config"]: m for m in memory}
    rows = []
    for r in results:
        m = mem.get(r["config"], {})
        rows.append([r["label"], r["ext_update_s"], r["trl_update_s"], r["ratio_median"],
                     f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}",
                     m.get("train_peak_growth_mb", float("nan")), mem.get("trl", {}).get("train_peak_growth_mb",
                                                                                          float("nan"))])
    print_table(["config", "ext s/update", "TRL s/update", "time ratio (median)", "ratio range",
                 "ext train peak +MiB", "TRL train peak +MiB"], rows)
    print(f"ptx share of the (c) update: {ptx['share_of_update_median']:.1%} (median of (t_c - t_a)/t_c); ptx forward "
          f"passes alone: {ptx['ptx_forward_share_median']:.1%}")
    if memory:
        print("whole-process peak RSS (MiB): " + ", ".join(f"{m['config']} {m['peak_rss_mb']:.0f}" for m in memory))
    write_result("ppo_overhead", vars(a), results, out=a.out, ptx=ptx, memory=memory, a_logs_identical=identical,
                 policy_parameters=models.policy_parameters, gc=gc_info, baseline=baseline())


if __name__ == "__main__":
    main()
