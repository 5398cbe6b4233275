"""The verifiable task: RL from a reward function alone (no reward model) with each advantage estimator
of trl_ext.PPOTrainer, measured by held-out exact-match accuracy.

Task (recipes/verifiable/README.md): two-digit addition, ``"4 7 + 3 5 ="`` -> ``"0 8 2"``, on a word-level tokenizer
and a random tiny Llama (hidden 64, 2 layers); 4000 training problems, 500 disjoint held-out ones. The pipeline, in
this process: data and base model (recipes/verifiable/make_data.py), the SFT warm start (recipes/verifiable/sft.yaml,
3000 steps on a careless demonstrator that forgets most units carries: about 0.6 of the held-out sums right, the
carry left for RL), then RL from the SFT model with
``reward_funcs=[exact_match_reward]`` (recipes/verifiable/arithmetic_task.py) and each estimator, at the same number of
generated completions (``--updates`` x 64) and the same KL coefficient, 3 training seeds:

* GAE with a value model (initialised from the SFT model with a fresh scalar head), 64 prompts per update;
* RLOO k=4 and GRPO k=4 (KL in the loss, k3, GRPO's own choice), 16 prompts x 4 samples per update;
* REINFORCE++ (k=1, advantages whitened over the batch), 64 prompts per update.

Accuracy is measured on the 500 held-out problems (recipes/verifiable/evaluate.py): ``greedy`` (one greedy answer,
the table's number) and ``sampled`` (4 temperature-1 answers per problem: what RL samples). Before SFT, after SFT and
after RL.

    python benchmarks/verifiable.py            # 100 updates x 4 estimators x 3 seeds
    python benchmarks/verifiable.py --quick    # 30 updates, 1 seed

Writes benchmarks/results/verifiable.json and benchmarks/figures/verifiable.png.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import (REPO, fresh_workdir, key_values, load_average, logged, print_table, pyplot_into,  # noqa: E402
                     rl_trainer_from_sft, save_figure, setup_env, study_cells, study_parser, study_size, train_recipe,
                     train_with_curve, write_result)

TASK = REPO / "recipes" / "verifiable"
sys.path.insert(0, str(TASK))
FIGURES = HERE / "figures"

UPDATES = (100, 30)  # RL updates per run: the study's, --quick's
K = 4
COMPLETIONS_PER_UPDATE = 64
ESTIMATORS = {
    "GAE (value model)": {"advantage_estimator": "gae"},
    f"RLOO k={K}": {"advantage_estimator": "rloo", "num_samples_per_prompt": K},
    f"GRPO k={K} (KL in loss)": {"advantage_estimator": "grpo", "num_samples_per_prompt": K},
    "REINFORCE++": {"advantage_estimator": "reinforce_pp"},
}
#: The RL settings every estimator shares (recipes/verifiable/{gae,rloo,grpo,reinforce_pp}.yaml carry the same).
RL_SETTINGS = dict(  # noqa: C408 - keyword form: these are PPOConfig's keywords
    per_device_train_batch_size=COMPLETIONS_PER_UPDATE, gradient_accumulation_steps=1, num_mini_batches=1,
    num_ppo_epochs=2, learning_rate=1e-4, lr_scheduler_type="constant", response_length=5, stop_token="eos",
    temperature=1.0, kl_coef=0.01, local_rollout_forward_batch_size=COMPLETIONS_PER_UPDATE, max_grad_norm=0.0,
)


def sft(work: Path, max_steps: int | None = None, *, train: int | None = None, heldout: int | None = None
        ) -> tuple[Path, float]:
    """Data and base model (make_data; ``train``/``heldout`` problems, default make_data's), then SFT with
    recipes/verifiable/sft.yaml in this process; returns (SFT model folder, seconds). The recipe's console output
    goes to ``<work>/sft.log``."""
    from make_data import make_data

    make_data(work, **{k: v for k, v in (("train", train), ("heldout", heldout)) if v is not None})
    seconds = train_recipe(TASK / "sft.yaml", work / "sft.log", model_name_or_path=work / "base",
                           dataset_name=work / "data" / "train.jsonl", output_dir=work / "sft", max_steps=max_steps)
    return work / "sft", seconds


def sft_or_reuse(work: Path, sft_dir: str | None) -> tuple[Path, float, Path]:
    """(SFT model folder, seconds its SFT took, data folder): ``sft_dir``, a finished SFT model with its data folder
    beside it (0 s), or else a fresh one built by :func:`sft` in ``work``."""
    if sft_dir:
        return Path(sft_dir), 0.0, Path(sft_dir).parent / "data"
    sft_model, seconds = sft(work)
    return sft_model, seconds, work / "data"


def rl_dataset(tokenizer, rows: list[dict]):
    """The RL training set: tokenized ``input_ids`` beside the ``prompt`` and ``answer`` columns the reward function
    reads (the trainer passes every column through)."""
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": [tokenizer(r["prompt"])["input_ids"] for r in rows],
                              "prompt": [r["prompt"] for r in rows], "answer": [r["answer"] for r in rows]})


def make_rl_trainer(sft_dir: Path, train_rows: list[dict], out: Path, *, updates: int, seed: int, estimator: dict,
                    **overrides):
    """A trl_ext.PPOTrainer from the SFT model with ``reward_funcs=[exact_match_reward]`` and no reward model
    (:func:`_common.rl_trainer_from_sft`; a value model for GAE)."""
    from arithmetic_task import exact_match_reward

    return rl_trainer_from_sft(sft_dir, out, updates=updates, seed=seed,
                               settings={**RL_SETTINGS, **estimator, **overrides},
                               dataset=lambda tokenizer: rl_dataset(tokenizer, train_rows),
                               value_model=estimator.get("advantage_estimator", "gae") == "gae",
                               reward_funcs=[exact_match_reward])


def main(argv=None) -> int:
    p = study_parser(__doc__, "verifiable", updates=UPDATES, what="estimator")
    p.add_argument("--lr", type=float, default=None, help="RL learning rate (default: RL_SETTINGS)")
    p.add_argument("--kl-coef", type=float, default=None, help="KL coefficient (default: RL_SETTINGS)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="other PPOConfig overrides (YAML values)")
    p.add_argument("--sft-dir", default=None, help="reuse this SFT model (and its data folder beside it)")
    p.add_argument("--figures", default=str(FIGURES), help="where the PNG figure goes ('' for none)")
    a = p.parse_args(argv)
    updates, seeds = study_size(a, UPDATES)
    evals = 4  # accuracy measured every updates/evals updates

    setup_env(threads=1)
    from evaluate import accuracy, read_jsonl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    work = fresh_workdir(a.workdir, create=True)
    sft_dir, sft_seconds, data = sft_or_reuse(work, a.sft_dir)
    overrides = {k: v for k, v in (("learning_rate", a.lr), ("kl_coef", a.kl_coef)) if v is not None}
    overrides.update(key_values(a.set))
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    heldout = read_jsonl(data / "heldout.jsonl")
    train_rows = read_jsonl(data / "train.jsonl")
    base = accuracy(AutoModelForCausalLM.from_pretrained(data.parent / "base"), tokenizer, heldout)
    start = accuracy(AutoModelForCausalLM.from_pretrained(sft_dir), tokenizer, heldout)
    print(f"before SFT {base}; after SFT ({sft_seconds:.0f} s) {start}", flush=True)

    runs = {}
    for seed, name, estimator in study_cells(seeds, ESTIMATORS, a.only):
        run = runs.setdefault(name, {"settings": {**RL_SETTINGS, **estimator, **overrides}, "seeds": []})
        out = work / f"rl-{estimator['advantage_estimator']}-seed{seed}"
        trainer = make_rl_trainer(sft_dir, train_rows, out, updates=updates, seed=seed, estimator=estimator,
                                  **overrides)
        seconds, curve = train_with_curve(trainer, tokenizer, heldout, start, updates, f"{out}.log", evals)
        run["seeds"].append({"seed": seed, "seconds": seconds, "curve": curve,
                             "reward": logged(trainer, "reward"), "kl": logged(trainer, "objective/kl"),
                             "frac_reward_zero_std": logged(trainer, "frac_reward_zero_std")})
        print(f"{name} seed {seed}: {seconds:.0f} s, held-out greedy {start['greedy']:.3f} -> "
              f"{curve[-1]['greedy']:.3f}, sampled {start['sampled']:.3f} -> {curve[-1]['sampled']:.3f}",
              flush=True)
        del trainer
        shutil.rmtree(out, ignore_errors=True)
        write_result("verifiable", {"updates": updates, "seeds": seeds}, {"base": base, "sft": start,
                                                                          "runs": runs}, out=a.out)

    total = time.perf_counter() - started
    report(base, start, runs)
    settings = {"quick": a.quick, "updates": updates, "seeds": seeds, "k": K,
                "completions_per_update": COMPLETIONS_PER_UPDATE, "rl": RL_SETTINGS,
                "seconds": {"total": total, "sft": sft_seconds}}
    write_result("verifiable", settings, {"base": base, "sft": start, "runs": runs}, out=a.out)
    if a.figures:
        draw_figure(Path(a.figures), start, runs, updates)
    print(f"total {total:.0f} s; load average now {load_average()}")
    return 0


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs)


def report(base, start, runs) -> None:
    headers = ["model", "seeds", "held-out greedy acc. (per seed)", "held-out sampled acc.", "train reward, last 10",
               "KL to SFT at the end", "s per run"]
    table = [["random base (before SFT)", "-", f"{base['greedy']:.3f}", base["sampled"], "-", "-", "-"],
             ["SFT warm start", "-", f"{start['greedy']:.3f}", start["sampled"], "-", "-", "-"]]
    for name, run in runs.items():
        ends = [r["curve"][-1] for r in run["seeds"]]
        per_seed = " / ".join(f"{e['greedy']:.3f}" for e in ends)
        table.append([f"RL: {name}", len(ends), f"{_mean(e['greedy'] for e in ends):.3f} ({per_seed})",
                      _mean(e["sampled"] for e in ends), _mean(_mean(r["reward"][-10:]) for r in run["seeds"]),
                      _mean(r["kl"][-1] for r in run["seeds"]), _mean(r["seconds"] for r in run["seeds"])])
    print_table(headers, table)


def draw_figure(folder: Path, start, runs, updates) -> None:
    """Held-out greedy and sampled accuracy over RL updates, every seed, one colour per estimator."""
    plt = pyplot_into(folder)
    if plt is None:
        return
    colors = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for i, (name, run) in enumerate(runs.items()):
        for j, r in enumerate(run["seeds"]):
            xs = [q["update"] * COMPLETIONS_PER_UPDATE for q in r["curve"]]
            for ax, key in zip(axes, ("greedy", "sampled")):
                ax.plot(xs, [q[key] for q in r["curve"]], color=colors(i), marker="o", markersize=3, linewidth=1,
                        alpha=0.8, label=name if j == 0 else None)
    for ax, key in zip(axes, ("greedy", "sampled")):
        ax.axhline(start[key], color="grey", linewidth=0.8, linestyle=":", label="SFT start")
        ax.set_xlabel(f"generated completions ({COMPLETIONS_PER_UPDATE} per update)")
        ax.set_title(f"Held-out exact match, {key} answers (500 problems)", fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy")
    axes[0].legend(fontsize=7)
    save_figure(fig, folder / "verifiable.png", dpi=80)


if __name__ == "__main__":
    sys.exit(main())
