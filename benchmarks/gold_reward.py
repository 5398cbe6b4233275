"""Gold-reward study: does the RLHF pipeline improve what we care about, and does each extension do what its paper
says? (Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization"; InstructGPT's SFT -> reward
model -> PPO).

On the gold task of recipes/gold (a synthetic language whose true reward is a program, recipes/gold/README.md) the
script runs the whole pipeline with the shipped recipes, in this process: data and a random base model, SFT, 1000
preference pairs sampled from the SFT model and labelled by the gold reward with 20 % of the labels flipped, reward
models, then the variants:

* reward model without / with label smoothing (eps = the noise rate), several seeds: gold accuracy on 500 clean
  held-out pairs;
* PPO against the reward model with a fixed KL coefficient (three values: the gold-vs-KL frontier), with adaptive
  KL control (Ziegler et al. 2019), and with PPO-ptx (InstructGPT) on the SFT corpus;
* DPO at three betas, and cDPO (label smoothing = the noise rate) at the middle one, on the same pairs.

Every checkpoint of every run is evaluated the same way (recipes/gold/gold_eval.py): gold reward, proxy reward
(the reward model's score), KL to the SFT model (sampled sequence log-ratio, as PPO's `objective/kl`), and LM loss
on held-out SFT text (the alignment tax). It prints a table, writes the points to benchmarks/results/gold_reward.json
and draws benchmarks/figures/gold_*.png (needs matplotlib: `pip install "trl-ext[plot]"`).

    python benchmarks/gold_reward.py            # the study (about 10 minutes on 2 busy CPU cores)
    python benchmarks/gold_reward.py --quick    # fewer updates, seeds and variants (about 3-4 minutes)
    python benchmarks/gold_reward.py --smoke --ppo-updates 1 --reward-seeds 1 --seeds 1 --samples-per-prompt 1
                                                # every step and variant on tiny sizes (its test; no meaningful figure)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import (REPO, RESULTS, AnonPeakSampler, fresh_workdir, load_average, print_table, pyplot_into, quiet_timed,
                     save_figure, seconds_per_update, setup_env, study_cells, write_result)  # noqa: E402

GOLD = REPO / "recipes" / "gold"
sys.path.insert(0, str(GOLD))

NOISE = 0.2
FIGURES = HERE / "figures"


def ppo_variants(updates: int, quick: bool) -> dict[str, dict]:
    """name -> recipe overrides of recipes/gold/ppo.yaml (its own settings: fixed KL 0.05)."""
    variants = {
        "PPO kl 0.01": {"kl_coef": 0.01},
        "PPO kl 0.05": {},
        "PPO kl 0.2": {"kl_coef": 0.2},
        # Ziegler et al.'s controller, started at the fixed run's coefficient; horizon short enough to act in a
        # run of a few thousand episodes (the default 10000 is for runs of ~1e5-1e6 episodes).
        "PPO adaptive kl": {"kl_controller": "adaptive", "kl_target": 1.5, "kl_horizon": 256},
        "PPO-ptx kl 0.05": {"ptx_coef": 1.0, "ptx_dataset_name": None},  # the dataset is set in main()
    }
    if quick:
        variants = {k: v for k, v in variants.items() if k in ("PPO kl 0.01", "PPO kl 0.05", "PPO adaptive kl",
                                                              "PPO-ptx kl 0.05")}
    return variants


def dpo_variants(quick: bool) -> dict[str, dict]:
    """name -> recipe overrides of recipes/gold/dpo.yaml (its own settings: beta 0.1)."""
    variants = {
        "DPO beta 0.03": {"beta": 0.03},
        "DPO beta 0.1": {},
        "DPO beta 0.3": {"beta": 0.3},
        "cDPO beta 0.1": {"label_smoothing": NOISE},
    }
    if quick:
        variants = {k: v for k, v in variants.items() if k in ("DPO beta 0.1", "cDPO beta 0.1")}
    return variants


# ---------------------------------------------------------------------------------------------------------------
# Running recipes


def pipeline_sizes(smoke: bool) -> tuple[dict, dict, dict]:
    """(``make_data`` keywords, ``make_pairs`` keywords, SFT, reward and DPO recipe overrides): empty, the pipeline's
    own sizes; with ``smoke`` (the scripts' ``--smoke``, what their test runs) 64 SFT examples and 16 held out, 32
    training and 16 test pairs, and 2 optimizer steps of SFT, of each reward model and of each DPO run: every step of
    the pipeline runs, in seconds, and none of its figures means anything."""
    if not smoke:
        return {}, {}, {}
    return {"sft_examples": 64, "test_examples": 16}, {"n_train": 32, "n_test": 16}, {"max_steps": 2}


def proxy_setup(work: Path, samples_per_prompt: int, smoke: bool = False):
    """The start every PPO comparison on the gold task shares: the task's data and base model (``make_data``), the
    SFT model, noisy gold-labelled pairs of its samples (``NOISE``) and one proxy reward model trained on them (the
    recipe's seed 0), in ``work`` (sizes: :func:`pipeline_sizes`); returns (data folder, reward model folder, a
    ``GoldEvaluator`` against them)."""
    import gold_eval
    from make_data import make_data
    from make_pairs import make_pairs
    from transformers import AutoTokenizer

    data_sizes, pair_sizes, steps = pipeline_sizes(smoke)
    make_data(work, **data_sizes)
    data = work / "data"
    train("sft", {"model_name_or_path": work / "base", "dataset_name": data / "sft", "output_dir": work / "sft",
                  "eval_strategy": "no", "disable_tqdm": True, **steps})
    make_pairs(work / "sft", data / "pairs", noise=NOISE, **pair_sizes)
    reward_dir = work / "reward"
    train("reward", {"model_name_or_path": work / "sft", "dataset_name": data / "pairs", "output_dir": reward_dir,
                     "eval_strategy": "no", "disable_tqdm": True, **steps})
    heldout = [json.loads(line) for line in open(data / "sft" / "test.jsonl")]
    evaluator = gold_eval.GoldEvaluator(AutoTokenizer.from_pretrained(work / "sft"), sft=work / "sft",
                                        reward_model=reward_dir, heldout=heldout, samples_per_prompt=samples_per_prompt)
    return data, reward_dir, evaluator


class ProxyStudy:
    """A PPO study against the gold task's proxy reward model, seeds x variants (gold_critic_free.py, objectives.py):
    the quiet environment, ``a.workdir`` emptied, :func:`proxy_setup` in it (``a.samples_per_prompt``, ``a.smoke``)
    and the SFT model evaluated when it starts; :meth:`run` trains and evaluates the variants, :meth:`finish` writes
    the result ``benchmarks/results/<name>.json`` (or ``a.out``)."""

    def __init__(self, a, name: str, updates: int, seeds: list[int]):
        self.a, self.name, self.updates, self.seeds = a, name, updates, seeds
        setup_env(threads=1)
        self.work = fresh_workdir(a.workdir)
        self.started = time.perf_counter()
        data, reward_dir, self.evaluator = proxy_setup(self.work, a.samples_per_prompt, smoke=a.smoke)
        self.sft_point = {"step": 0, **self.evaluator.evaluate(self.work / "sft")}
        #: the recipe overrides every run shares: runs of ``updates`` updates, 4 checkpoints each
        self.overrides = ppo_overrides(self.work, data, reward_dir, updates, checkpoints=4)
        self.runs: dict[str, dict] = {}

    def run(self, variants: dict, logged_keys, kept: int, *, context=None, extra=None) -> None:
        """Every (seed, variant) of ``variants`` (name -> overrides; ``a.only`` picks) as a :func:`measured_ppo_run`
        inside ``context(name)`` (if given), recorded in :attr:`runs` with the series of the first ``kept``
        ``logged_keys`` and ``extra(logged series)``; the result is written after every run (a cut-short study is
        kept)."""
        for seed, name, overrides in study_cells(self.seeds, variants, self.a.only):
            run = self.runs.setdefault(name, {"overrides": overrides, "seeds": []})
            out = self.work / f"{_slug(name)}-seed{seed}".translate(str.maketrans("", "", "()=,/.:"))
            record, logged = measured_ppo_run({**self.overrides, **overrides, "output_dir": out, "seed": seed},
                                              self.evaluator, self.sft_point, logged_keys,
                                              context=context(name) if context else None)
            run["seeds"].append({**record, **(extra(logged) if extra else {}),
                                 "logged": {k: logged[k] for k in logged_keys[:kept]}})
            self.write({"updates": self.updates, "seeds": self.seeds})

    def finish(self, k: int) -> float:
        """Write the result with the study's settings (its sizes, the samples per prompt ``k`` of the group
        estimators, the label noise, the total seconds); returns the seconds since the study started."""
        total = time.perf_counter() - self.started
        a = self.a
        self.write({"quick": a.quick, "smoke": a.smoke, "ppo_updates": self.updates, "seeds": self.seeds, "k": k,
                    "noise": NOISE, "samples_per_prompt": a.samples_per_prompt, "seconds": {"total": total}})
        return total

    def write(self, settings: dict) -> None:
        write_result(self.name, settings, {"sft": self.sft_point, "runs": self.runs}, out=self.a.out)


def train(recipe: str, overrides: dict) -> tuple[object, float]:
    """Train ``recipes/gold/<recipe>.yaml`` with ``overrides`` in this process; returns (trainer, seconds).

    The trainer's console output goes to ``<output_dir>.log``."""
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    argv = []
    for key, value in overrides.items():
        argv += [f"--{key}", str(value)]
    recipe_obj = resolve_recipe(GOLD / f"{recipe}.yaml", argv)
    trainer, seconds = quiet_timed(lambda: run(recipe_obj), f"{recipe_obj.training_args.output_dir}.log")
    print(f"{recipe_obj.training_args.output_dir}: {seconds:.0f} s", flush=True)
    return trainer, seconds


def ppo_overrides(work: Path, data: Path, reward_dir: Path, updates: int, checkpoints: int) -> dict:
    """The recipes/gold/ppo.yaml overrides every PPO run of a gold study shares: from the SFT model in ``work``
    against the proxy reward model ``reward_dir`` (as :func:`proxy_setup` built them), ``updates`` updates of 16
    responses (the recipe's batch), a checkpoint (each is evaluated) every ``updates // checkpoints`` updates."""
    return {"model_name_or_path": work / "sft", "reward_model_path": reward_dir,
            "dataset_name": data / "prompts.jsonl", "total_episodes": updates * 16, "save_strategy": "steps",
            "save_steps": max(1, updates // checkpoints), "disable_tqdm": True}


def measured_ppo_run(overrides: dict, evaluator, sft_point: dict, logged_keys, context=None) -> tuple[dict, dict]:
    """One PPO run (recipes/gold/ppo.yaml with ``overrides``, which name ``output_dir`` and ``seed``) of a gold study,
    inside ``context`` (if any): trained with its peak anonymous RSS sampled, every checkpoint evaluated, then its
    folder removed. Returns (the seed's record: seed, seconds, seconds per update, peak anonymous MB, points from
    ``sft_point`` on; the logged series of ``logged_keys``)."""
    from contextlib import nullcontext

    out = overrides["output_dir"]
    with AnonPeakSampler(interval=0.02) as peak, context or nullcontext():
        trainer, secs = train("ppo", overrides)
    logged = log_series(trainer, *logged_keys)
    record = {"seed": overrides["seed"], "seconds": secs, "seconds_per_update": seconds_per_update(logged),
              "peak_anon_mb": peak.peak_mb, "points": [sft_point] + evaluator.evaluate_run(out)}
    del trainer
    _cleanup(out, False)
    return record, logged


def log_series(trainer, *keys) -> dict[str, list]:
    """The trainer's logged values of ``keys`` with their steps (from ``state.log_history``)."""
    out = {}
    for key in keys:
        points = [(h["step"], h[key]) for h in trainer.state.log_history if key in h]
        out[key] = {"step": [p[0] for p in points], "value": [p[1] for p in points]}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer updates, seeds and variants")
    p.add_argument("--ppo-updates", type=int, default=None, help="PPO updates per run (default 96, quick 48)")
    p.add_argument("--reward-seeds", type=int, default=None, help="reward-model seeds per variant (default 3, quick 1)")
    p.add_argument("--samples-per-prompt", type=int, default=8, help="evaluation samples per prompt (96 prompts)")
    p.add_argument("--seeds", type=int, default=None, help="training seeds of each PPO and DPO variant (default 2, "
                   "quick 1); data, SFT model and the proxy keep seed 0")
    p.add_argument("--only", nargs="*", default=None, help="run only the PPO/DPO variants with these names")
    p.add_argument("--workdir", default=str(RESULTS / "gold_reward_runs"), help="where the runs are written")
    p.add_argument("--keep-runs", action="store_true", help="keep every run's checkpoints in --workdir")
    p.add_argument("--smoke", action="store_true", help="tiny data, pairs and SFT/reward steps (the test's sizes)")
    p.add_argument("--figures", default=str(FIGURES), help="where the PNG figures go ('' for none)")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/gold_reward.json)")
    a = p.parse_args(argv)
    updates = a.ppo_updates or (48 if a.quick else 96)
    reward_seeds = a.reward_seeds or (1 if a.quick else 3)
    seeds = list(range(a.seeds or (1 if a.quick else 2)))

    setup_env(threads=1)
    import gold_eval
    from make_data import make_data
    from make_pairs import make_pairs
    from transformers import AutoTokenizer

    work = fresh_workdir(a.workdir)
    started = time.perf_counter()
    seconds: dict[str, float] = {}

    # 1. data and base model; 2. SFT; 3. pairs
    data_sizes, pair_sizes, steps = pipeline_sizes(a.smoke)
    make_data(work, **data_sizes)
    data = work / "data"
    _, seconds["sft"] = train("sft", {"model_name_or_path": work / "base", "dataset_name": data / "sft",
                                      "output_dir": work / "sft", "eval_strategy": "no", "disable_tqdm": True,
                                      **steps})
    pair_stats = make_pairs(work / "sft", data / "pairs", noise=NOISE, **pair_sizes)
    tokenizer = AutoTokenizer.from_pretrained(work / "sft")
    heldout = [json.loads(line) for line in open(data / "sft" / "test.jsonl")]
    test_pairs = [json.loads(line) for line in open(data / "pairs" / "test.jsonl")]
    train_pairs = [json.loads(line) for line in open(data / "pairs" / "train.jsonl")]

    # 4. reward models: gold accuracy on clean held-out pairs, with and without label smoothing
    reward_rows = []
    for eps in (0.0, NOISE):
        for seed in range(reward_seeds):
            out = work / f"reward-ls{eps}-seed{seed}"
            trainer, secs = train("reward", {"model_name_or_path": work / "sft", "dataset_name": data / "pairs",
                                             "output_dir": out, "label_smoothing": eps, "seed": seed,
                                             "eval_strategy": "no", "disable_tqdm": True, **steps})
            reward_rows.append({"label_smoothing": eps, "seed": seed, "seconds": secs,
                                "gold_accuracy": gold_eval.pair_accuracy(trainer.model, tokenizer, test_pairs),
                                "noisy_train_accuracy": gold_eval.pair_accuracy(trainer.model, tokenizer,
                                                                                _as_labelled(train_pairs))})
    reward_dir = work / "reward-ls0.0-seed0"  # the proxy PPO optimises
    evaluator = gold_eval.GoldEvaluator(tokenizer, sft=work / "sft", reward_model=reward_dir, heldout=heldout,
                                        samples_per_prompt=a.samples_per_prompt)
    sft_point = {"step": 0, **evaluator.evaluate(work / "sft")}

    # 5. PPO and DPO variants, each checkpoint evaluated
    runs = {}

    def run_variant(kind, name, overrides, common, logged_keys):
        runs[name] = {"kind": kind, "overrides": _plain(overrides), "seeds": []}
        for seed in seeds:
            out = work / f"{_slug(name)}-seed{seed}"
            trainer, secs = train(kind, {**common, **overrides, "output_dir": out, "seed": seed})
            runs[name]["seeds"].append({"seed": seed, "seconds": secs,
                                        "points": [sft_point] + evaluator.evaluate_run(out),
                                        "logged": log_series(trainer, *logged_keys)})
            _cleanup(out, a.keep_runs)

    ppo_common = ppo_overrides(work, data, reward_dir, updates, checkpoints=8)
    for name, overrides in ppo_variants(updates, a.quick).items():
        if a.only is not None and name not in a.only:
            continue
        if "ptx_coef" in overrides:
            overrides = {**overrides, "ptx_dataset_name": data / "ptx.jsonl"}
        run_variant("ppo", name, overrides, ppo_common, ("objective/kl", "objective/kl_coef", "objective/scores"))
    dpo_steps = 3 * len(train_pairs) // 32  # recipes/gold/dpo.yaml: 3 epochs of batches of 32
    dpo_common = {"model_name_or_path": work / "sft", "dataset_name": data / "pairs", "save_strategy": "steps",
                  "save_steps": max(1, dpo_steps // 6), "disable_tqdm": True, **steps}
    for name, overrides in dpo_variants(a.quick).items():
        if a.only is not None and name not in a.only:
            continue
        run_variant("dpo", name, overrides, dpo_common, ("rewards/margins", "rewards/accuracies"))

    total = time.perf_counter() - started
    report(sft_point, reward_rows, runs, pair_stats)
    settings = {"quick": a.quick, "smoke": a.smoke, "ppo_updates": updates, "reward_seeds": reward_seeds,
                "noise": NOISE, "seeds": seeds,
                "samples_per_prompt": a.samples_per_prompt, "seconds": {**seconds, "total": total}}
    write_result("gold_reward", settings, {"sft": sft_point, "pairs": pair_stats, "reward_models": reward_rows,
                                           "runs": runs}, out=a.out)
    if a.figures:
        draw_figures(Path(a.figures), sft_point, runs)
    print(f"total {total:.0f} s; load average now {load_average()}")
    return 0


def _as_labelled(rows):
    """Training pairs as labelled (noise included): the label is the truth for this accuracy."""
    return [{**r, "gold_chosen": 1.0, "gold_rejected": 0.0} for r in rows]


def _slug(name: str) -> str:
    return name.lower().replace(" ", "-").replace(".", "")


def _plain(overrides: dict) -> dict:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in overrides.items()}


def _cleanup(out: Path, keep: bool) -> None:
    if not keep:
        shutil.rmtree(out, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# Report


def report(sft_point, reward_rows, runs, pair_stats) -> None:
    import statistics

    print(f"\npairs: {json.dumps(pair_stats)}\n")
    rows = []
    for eps in sorted({r["label_smoothing"] for r in reward_rows}):
        accs = [r["gold_accuracy"] for r in reward_rows if r["label_smoothing"] == eps]
        noisy = [r["noisy_train_accuracy"] for r in reward_rows if r["label_smoothing"] == eps]
        rows.append([f"label_smoothing {eps}", len(accs), statistics.mean(accs), f"{min(accs):.3f}-{max(accs):.3f}",
                     statistics.mean(noisy)])
    print_table(["reward model", "seeds", "gold accuracy (clean held-out pairs)", "range",
                 "accuracy on its own (noisy) training labels"], rows)
    print()
    headers = ["variant", "seeds", "gold (range)", "proxy", "KL to SFT", "LM loss", "best gold on the way (KL there)",
               "words", "repeats", "s per run"]
    table = [["SFT", "-", f"{sft_point['gold']:.2f}", sft_point["proxy"], 0.0, sft_point["lm_loss"], "-",
              sft_point["length"], sft_point["gold/repeats"], "-"]]
    for name, run in runs.items():
        ends, golds, bests, spread = seed_ends(run)
        table.append([name, len(ends), f"{_mean(golds):.2f}{spread}", _mean(e["proxy"] for e in ends),
                      _mean(e["kl"] for e in ends), _mean(e["lm_loss"] for e in ends),
                      f"{_mean(b['gold'] for b in bests):.2f} ({_mean(b['kl'] for b in bests):.2f})",
                      _mean(e["length"] for e in ends), _mean(e["gold/repeats"] for e in ends),
                      _mean(r["seconds"] for r in run["seeds"])])
    print_table(headers, table)
    print()
    print_table(["DPO run (end)", "KL", "gold", "LM loss", "PPO checkpoints with KL within 25 %", "their gold",
                 "their LM loss"], similar_kl_rows(runs))


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def seed_ends(run: dict) -> tuple[list, list, list, str]:
    """A run's seeds at a glance: their last points, those points' gold rewards, each seed's best-gold point on the
    way, and the gold range as the tables print it (" (min-max)"; empty for one seed)."""
    ends = [r["points"][-1] for r in run["seeds"]]
    golds = [e["gold"] for e in ends]
    bests = [max(r["points"], key=lambda q: q["gold"]) for r in run["seeds"]]
    spread = f" ({min(golds):.2f}-{max(golds):.2f})" if len(golds) > 1 else ""
    return ends, golds, bests, spread


def similar_kl_rows(runs) -> list[list]:
    """Each DPO run's end (mean over seeds) next to the PPO checkpoints (no ptx; every KL setting, seed and point
    of training) whose KL is within 25 % of it: mean (min-max) of their gold reward."""
    ppo = [(name, q) for name, run in runs.items() if run["kind"] == "ppo" and "ptx" not in name
           for r in run["seeds"] for q in r["points"][1:]]
    rows = []
    for name, run in runs.items():
        if run["kind"] != "dpo":
            continue
        ends = [r["points"][-1] for r in run["seeds"]]
        kl = _mean(e["kl"] for e in ends)
        near = [q for _, q in ppo if abs(q["kl"] - kl) <= 0.25 * kl]
        golds = [q["gold"] for q in near]
        rows.append([name, kl, _mean(e["gold"] for e in ends), _mean(e["lm_loss"] for e in ends), len(near),
                     f"{_mean(golds):.2f} ({min(golds):.2f}-{max(golds):.2f})" if near else "-",
                     _mean(q["lm_loss"] for q in near) if near else "-"])
    return rows


def draw_figures(folder: Path, sft_point, runs) -> None:
    """Gold vs KL (every checkpoint of every run), proxy vs gold (PPO), and the curves over training; the runs of
    the first training seed."""
    plt = pyplot_into(folder, "figures")
    if plt is None:
        return
    colors = plt.get_cmap("tab10")
    style = {name: dict(color=colors(i % 10), marker="o" if run["kind"] == "ppo" else "s",
                        linestyle="-" if run["kind"] == "ppo" else "--", markersize=3.5, linewidth=1.3)
             for i, (name, run) in enumerate(runs.items())}

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, run in runs.items():
        pts = run["seeds"][0]["points"]
        ax.plot([max(q["kl"], 0.0) for q in pts], [q["gold"] for q in pts], label=name, alpha=0.85, **style[name])
        ax.plot([pts[-1]["kl"]], [pts[-1]["gold"]], color=style[name]["color"], marker=style[name]["marker"],
                markersize=9, markeredgecolor="black", linestyle="none")  # the end of the run
    ax.axhline(sft_point["gold"], color="grey", linewidth=0.8, linestyle=":", label="SFT")
    ax.set_xlabel("KL(policy || SFT) per response (nats)")
    ax.set_ylabel("gold reward (max 3)")
    ax.set_title("Gold reward vs KL to the SFT model (every checkpoint; large: end)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    save_figure(fig, folder / "gold_vs_kl.png", dpi=110, announce=False)

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, run in runs.items():
        if run["kind"] == "ppo":
            pts = run["seeds"][0]["points"]
            ax.plot([q["proxy"] for q in pts], [q["gold"] for q in pts], label=name, **style[name])
    ax.set_xlabel("proxy reward (reward model score)")
    ax.set_ylabel("gold reward (max 3)")
    ax.set_title("PPO: proxy vs gold reward over training")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    save_figure(fig, folder / "gold_proxy_vs_gold.png", dpi=110, announce=False)

    fig, axes = plt.subplots(2, 3, figsize=(13.5, 6.6))
    for (key, label), ax in zip((("gold", "gold reward (max 3)"), ("proxy", "proxy reward"),
                                 ("kl", "KL(policy || SFT), nats"), ("lm_loss", "LM loss on held-out SFT text")),
                                axes.flat):
        for name, run in runs.items():
            pts = run["seeds"][0]["points"]
            last = max(pts[-1]["step"], 1)
            ax.plot([q["step"] / last for q in pts], [q[key] for q in pts], label=name, **style[name])
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("fraction of training", fontsize=8)
        ax.grid(alpha=0.3)
    for (key, label, log), ax in zip((("objective/kl", "PPO's objective/kl per update (EMA 0.8)", False),
                                      ("objective/kl_coef", "PPO's KL coefficient", True)), axes.flat[4:]):
        for name, run in runs.items():
            if run["kind"] == "ppo":
                logged = run["seeds"][0]["logged"][key]
                steps, values = logged["step"], logged["value"]
                smooth, last = [], values[0] if values else 0.0
                for v in values:
                    last = 0.8 * last + 0.2 * v
                    smooth.append(last)
                ax.plot(steps, smooth if key == "objective/kl" else values, color=style[name]["color"],
                        linewidth=1.3, label=name)
                target = run["overrides"].get("kl_target")
                if target is not None and key == "objective/kl":
                    ax.axhline(target, color=style[name]["color"], linestyle=":", linewidth=1,
                               label=f"kl_target {target}")
        if log:
            ax.set_yscale("log")
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("PPO update", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    axes.flat[0].legend(fontsize=6, ncol=2)
    save_figure(fig, folder / "gold_training_curves.png", dpi=90, announce=False)
    names = ("gold_vs_kl.png", "gold_proxy_vs_gold.png", "gold_training_curves.png")
    print(f"figures: {', '.join(str(folder / n) for n in names)}")


if __name__ == "__main__":
    sys.exit(main())
