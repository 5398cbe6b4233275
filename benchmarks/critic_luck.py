"""When a value model pays: GAE against RLOO and GRPO on a quiz whose luck is on screen before each answer.

Task (recipes/tool_use/dice_quiz_env.py): the counting quiz of quiz_env.py (each round a number 0-8, right: the
number after it), and each round a die 0-4 shown with the number; answering a round pays ``1/rounds`` if right plus
``luck * (die - 2) / 2``. The die is drawn per episode, on screen before the answer, and no answer changes it: a value
model can learn it and take it out of the round's advantage; RLOO's and GRPO's 4 samples of one quiz roll other dice,
and their group mean cannot. The SFT start (recipes/tool_use/sft_dice.yaml) is the careless player of the quiz (right
on 0-4, mostly repeating the number on 5-8), on 4- and 8-round quizzes. Every run: 30 updates of 32 episodes (GAE 32
quizzes x 1, RLOO and GRPO 8 x 4), the quiz's RL settings (benchmarks/turn_credit.py ``QUIZ_RL``, lr 1e-4), seeds
0..4. The GAE rows: the value model's settings (``CRITIC``, policy lambda 0.8) and, first, value pretraining: 128
updates that train the value model alone on the SFT policy's episodes, once per luck and horizon ("own ..., charged":
once per seed, its episodes and CPU seconds the run's). The "per turn" rows:
RLOO and GRPO with ``turn_credit: turn`` (each round's answer credited with its own return-to-go against the same
round of the quiz's other samples: per-turn credit without a value model).

Measured: the held-out quizzes greedily (the share of rounds right; dice rolled from seed 0, luck left out) after RL,
the sampled share right of every update (the learning curve; the first update at 0.9 of the optimum), and for GAE
the critic's health per turn (``critic/vf_explained_var/turn_<k>``, the mean of the last 5 updates) and its credit
gain over per-turn RLOO's baseline (``critic/credit_gain``, the mean of the last 5 updates).

    python benchmarks/critic_luck.py --sft-dir outputs/tool_use --luck 0 0.5 1     # after make_data.py, sft_dice.yaml
    python benchmarks/critic_luck.py --quick                                        # data, SFT, 3 updates, 1 seed

``--environment jackpot`` plays recipes/tool_use/jackpot_quiz_env.py instead (numbers drawn per episode, a die that
pays a jackpot: a luck environment the study never tuned on), held-out scores on the same quizzes.

Writes benchmarks/results/critic_luck.json (or --out); ``--merge`` joins result files of cells run in parallel.
"""

from __future__ import annotations

import hashlib
import json
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import (key_values, load_average, logged, paired_interval, print_table, pyplot_into,  # noqa: E402
                     quiet_timed, rl_trainer_from_sft, save_figure, seed_spread, setup_env, study_parser,
                     study_work, train_recipe, write_result)
from tool_use import K, RL_SETTINGS  # noqa: E402
from turn_credit import CRITIC, QUIZ_RL, rounds_right_callback  # noqa: E402

TASK = HERE.parent / "recipes" / "tool_use"
sys.path.insert(0, str(TASK))

UPDATES = (30, 3)
EPISODES = UPDATES[0] * RL_SETTINGS["per_device_train_batch_size"]  # every arm's budget: 960 generated episodes
SEEDS = 5
LUCK = (0.0, 0.5, 1.0)
#: Value pretraining (VAPO): updates of a value-only run (the policy held: ``critic_warmup`` for every update) on the
#: SFT policy's episodes, done once per luck and horizon; every GAE seed with ``value_pretraining`` starts from it.
PRETRAIN_UPDATES, PRETRAIN_SEED = 128, 1000
#: GAE's settings: the value model's (``CRITIC``) and a policy lambda of 0.8 (less of the next round's die in a round's
#: advantage). At lr 3e-4 one GAE run in five collapsed at its last update; the study runs at the quiz's 1e-4.
GAE = {"advantage_estimator": "gae", **CRITIC, "lam": 0.8}
VARIANTS = {
    "GAE, pretrained value model": {**GAE, "value_pretraining": True},  # PRETRAIN_UPDATES of it first
    # each seed pretrains its own value model (seed + PRETRAIN_SEED), its episodes and CPU seconds charged to the run
    "GAE, own value pretraining, charged": {**GAE, "value_pretraining": "own"},
    "GAE, critic settings": GAE,
    "GAE, critic warm-up 10": {**GAE, "critic_warmup": 10},  # the pretraining inside the run's 30 updates
    "GAE, TRL's settings": {"advantage_estimator": "gae"},
    "GAE, TRL's settings, lam 0.8": {"advantage_estimator": "gae", "lam": 0.8},
    f"RLOO k={K}": {"advantage_estimator": "rloo", "num_samples_per_prompt": K},
    f"GRPO k={K} (KL in loss)": {"advantage_estimator": "grpo", "num_samples_per_prompt": K, "kl_in": "loss"},
    f"RLOO k={K}, per turn": {"advantage_estimator": "rloo", "num_samples_per_prompt": K, "turn_credit": "turn"},
    f"GRPO k={K} (KL in loss), per turn": {"advantage_estimator": "grpo", "num_samples_per_prompt": K, "kl_in": "loss",
                                           "turn_credit": "turn"},
    # each later round's reward at half weight: about what GAE's lam 0.97 leaves of the next round, ~20 tokens on
    f"GRPO k={K} (KL in loss), per turn, gamma 0.5": {"advantage_estimator": "grpo", "num_samples_per_prompt": K,
                                                      "kl_in": "loss", "turn_credit": "turn", "gamma": 0.5},
    # each round its own reward alone: the reach of GAE's lam 0.8 over a round (0.8^20 = 0.01)
    f"GRPO k={K} (KL in loss), per turn, gamma 0": {"advantage_estimator": "grpo", "num_samples_per_prompt": K,
                                                    "kl_in": "loss", "turn_credit": "turn", "gamma": 0.0},
}
REACHED = 0.9
#: The environments' modules (recipes/tool_use): the study's, and one it never tuned on (the guide's settings tried).
ENVIRONMENTS = {"dice": "dice_quiz_env", "jackpot": "jackpot_quiz_env"}


def sft(work: Path, *, max_steps: int | None = None, seed: int = 0, train: int = 1000) -> float:
    """The dice quiz's data and base model (make_data.write_dice_quiz), then sft_dice.yaml into ``<work>/sft_dice``."""
    from make_data import write_dice_quiz

    write_dice_quiz(work, seed=seed, train=train)
    return train_recipe(TASK / "sft_dice.yaml", work / "sft_dice.log", model_name_or_path=work / "dice_base",
                        dataset_name=work / "data" / "dice_sft.jsonl", output_dir=work / "sft_dice",
                        max_steps=max_steps)


def run_cell(work: Path, heldout: list[dict], *, variant: dict, luck: float, rounds: int, updates: int, seed: int,
             overrides: dict, pretrain_updates: int = PRETRAIN_UPDATES, shown: bool = True,
             environment: str = "dice") -> dict:
    """One RL run from ``<work>/sft_dice`` on ``environment`` (:data:`ENVIRONMENTS`): its settings, seconds,
    per-update curves, held-out scores after (the dice quiz's held-out quizzes, luck left out), and the critic's
    health."""
    from dice_quiz_env import RESPONSE_LENGTH, DiceQuizEnv
    from evaluate import quiz_scores

    variant = dict(variant)
    how = variant.pop("value_pretraining", None)  # None, True (one per luck and horizon) or "own" (per seed)
    pretraining = pretrain_updates if how else 0
    settings = {**RL_SETTINGS, **QUIZ_RL, "response_length": RESPONSE_LENGTH[rounds],
                "max_tool_calling_iterations": rounds, **variant, **overrides}
    own = seed + PRETRAIN_SEED if how == "own" else None
    played = environment_class(environment, luck, shown)
    value_dir = (pretrained_value(work, settings, luck, rounds, pretraining, shown, environment, own) if pretraining
                 else None)
    pretraining_cpu = json.loads((value_dir / "health.json").read_text())["cpu_seconds"] if own is not None else 0.0
    pre = ("-pre" if pretraining else "") + ("-own" if own is not None else "")  # the digest keeps rows apart
    tag = screen_and_quiz(shown, environment) + ("" if updates == UPDATES[0] else f"-u{updates}")
    out = work / (f"rl-{settings['advantage_estimator']}{pre}-{digest(settings)[:6]}-luck{luck}{tag}-r{rounds}"
                  f"-seed{seed}")
    trainer = dice_trainer(work, out, settings, rounds, updates, seed, played, value_dir)
    rounds_right = rounds_right_callback(trainer)
    trainer.add_callback(rounds_right)
    cpu = time.process_time()
    _, seconds = quiet_timed(trainer.train, f"{out}.log")
    cpu = time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux; the process's peak so far
    end = quiz_scores(trainer.model.policy, trainer.processing_class, heldout, environment=DiceQuizEnv)
    health = {}
    for k in range(1, rounds + 2):
        series = logged(trainer, f"critic/vf_explained_var/turn_{k}")
        if series:
            health[str(k)] = statistics.fmean(series[-5:])
    result = {"seed": seed, "luck": luck, "luck_shown": shown, "environment": environment,
              "environment_class": f"{played.__module__}.{played.__mro__[1].__name__}", "rounds": rounds,
              "settings": settings, "value_pretraining": pretraining, "seconds": seconds,
              "cpu_seconds": cpu + pretraining_cpu, "pretraining_cpu_seconds": pretraining_cpu,
              "peak_rss_mib": peak, "end": end,
              "rounds_right": rounds_right.curve, "health": health,
              "explained_var": logged(trainer, "critic/vf_explained_var"),
              "credit_gain": logged(trainer, "critic/credit_gain"), "kl": logged(trainer, "objective/kl")}
    del trainer
    shutil.rmtree(out, ignore_errors=True)
    return result


def dice_trainer(work: Path, out: Path, settings: dict, rounds: int, updates: int, seed: int, played: type,
                 value_dir=None):
    """The RL trainer of one run from ``<work>/sft_dice``, its episodes played with the environment class
    ``played`` (:func:`environment_class`)."""
    from datasets import Dataset
    from evaluate import read_jsonl

    rows = read_jsonl(work / "data" / f"dice_train{rounds}.jsonl")
    return rl_trainer_from_sft(work / "sft_dice", out, updates=updates, seed=seed, settings=settings,
                               dataset=lambda tokenizer: Dataset.from_list(rows),
                               value_model=settings["advantage_estimator"] == "gae", value_dir=value_dir,
                               reward_funcs=None, environment_factory=played)


def environment_class(environment: str, luck: float, shown: bool) -> type:
    """The class a run's episodes are played with: ``with_luck`` of :data:`ENVIRONMENTS`' module."""
    import importlib

    return importlib.import_module(ENVIRONMENTS[environment]).with_luck(luck, shown)


def screen_and_quiz(shown: bool, environment: str) -> str:
    """The part of a run's or a value model's folder name that keeps the control and another quiz apart."""
    return ("" if shown else "-hidden") + ("" if environment == "dice" else f"-{environment}")


def pretrained_value(work: Path, settings: dict, luck: float, rounds: int, updates: int, shown: bool = True,
                     environment: str = "dice", seed: int | None = None) -> Path:
    """The value model after ``updates`` updates of value pretraining (:data:`PRETRAIN_UPDATES`): ``critic_warmup``
    for the whole run, the policy held at the SFT start, with the GAE row's settings; trained once per luck,
    horizon and length (with ``seed``: once per seed, from that seed) into ``<work>/value-...`` (its explained
    variance per update, seconds and CPU seconds beside it, ``health.json``)."""
    from filelock import FileLock

    kept = {k: v for k, v in settings.items()  # what the policy alone uses leaves the value model's training alone
            if k not in ("lam", "length_adaptive_lam_alpha", "learning_rate")}
    tag = screen_and_quiz(shown, environment) + ("" if seed is None else f"-seed{seed}")
    folder = work / f"value-luck{luck}{tag}-r{rounds}-{updates}-{digest(kept)[:8]}"  # other settings: another
    with FileLock(f"{folder}.lock"):  # cells run in parallel: one of them pretrains, the others wait and reuse
        if not (folder / "config.json").is_file():
            _pretrain(work, folder, settings, rounds, updates, environment_class(environment, luck, shown),
                      PRETRAIN_SEED if seed is None else seed)
    return folder


def _pretrain(work: Path, folder: Path, settings: dict, rounds: int, updates: int, played: type, seed: int) -> None:
    out = work / f"{folder.name}-run"
    trainer = dice_trainer(work, out, {**settings, "critic_warmup": updates}, rounds, updates, seed, played)
    cpu = time.process_time()  # the training alone, as run_cell's
    _, seconds = quiet_timed(trainer.train, f"{out}.log")
    cpu = time.process_time() - cpu
    trainer.model.value_model.save_pretrained(folder)
    turns = {k: logged(trainer, f"critic/vf_explained_var/turn_{k}") for k in range(1, rounds + 2)}
    (folder / "health.json").write_text(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "explained_var": turns}))
    shutil.rmtree(out, ignore_errors=True)


def digest(settings: dict) -> str:
    """The settings' SHA-1 (hex): the name of what was trained with them."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def first_reached(curve: list[float], per_update: int) -> int | None:
    """Episodes until the first update whose sampled share right reached :data:`REACHED` (None: never)."""
    return next(((u + 1) * per_update for u, v in enumerate(curve) if v >= REACHED), None)


def parse_args(argv):
    p = study_parser(__doc__, "critic_luck", updates=UPDATES, seeds=SEEDS)
    p.add_argument("--luck", type=float, nargs="*", default=list(LUCK), help="luck sizes (default: 0 0.5 1)")
    p.add_argument("--rounds", type=int, default=4, choices=(4, 8), help="rounds per quiz (default 4)")
    p.add_argument("--luck-not-shown", action="store_true",
                   help="the control: the luck paid by a die the screen never shows (dice_quiz_env.with_luck)")
    p.add_argument("--environment", default="dice", choices=sorted(ENVIRONMENTS),
                   help="dice (the study's quiz) or jackpot (jackpot_quiz_env.py: numbers drawn per episode, a die "
                        "that pays a jackpot; the guide's settings on a quiz never tuned on)")
    p.add_argument("--heldout", type=int, default=None, help="the first N held-out quizzes (default: all 200)")
    p.add_argument("--pretrain-updates", type=int, default=PRETRAIN_UPDATES,
                   help=f"updates of value pretraining (default {PRETRAIN_UPDATES})")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="PPOConfig overrides (YAML values)")
    p.add_argument("--sft-dir", default=None, help="reuse a folder with data/ and sft_dice/ (make_data, sft_dice)")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: sft_dice.yaml's)")
    p.add_argument("--seed-list", type=int, nargs="*", default=None, help="these training seeds instead of 0..N-1")
    p.add_argument("--merge", nargs="*", default=None, metavar="JSON",
                   help="no training: merge these result files (cells run in parallel) into one, table and figure")
    p.add_argument("--figures", default=str(HERE / "figures"), help="where the PNG figure goes ('' for none)")
    return p.parse_args(argv)


def cell_key(name: str, luck: float, rounds: int, shown: bool = True, environment: str = "dice",
             episodes: int = EPISODES) -> str:
    """A cell's name in the results: arms at another budget of generated episodes (value pretraining counted) are
    cells of their own, so that a merge keeps budgets apart and compares arms at equal episodes."""
    quiz = "" if environment == "dice" else f", {environment} quiz"
    budget = "" if episodes == EPISODES else f", {episodes} episodes"
    return f"{name} | luck {luck:g}{'' if shown else ' not shown'}{quiz} | {rounds} rounds{budget}"


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.merge:
        return merge(a.merge, a.out, a.figures)
    updates = a.updates or (UPDATES[1] if a.quick else UPDATES[0])
    seeds = a.seed_list if a.seed_list is not None else list(range(a.seeds or (1 if a.quick else SEEDS)))
    setup_env(threads=1)
    from evaluate import quiz_scores, read_jsonl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    work, sft_seconds = study_work(a, lambda w: sft(w, max_steps=60 if a.quick else a.sft_steps,
                                                    train=64 if a.quick else 1000))
    from dice_quiz_env import DiceQuizEnv

    heldout = read_jsonl(work / "data" / f"dice_heldout{a.rounds}.jsonl")[:a.heldout or (16 if a.quick else None)]
    cached = work / f"sft_dice-heldout{a.rounds}-{len(heldout)}.json"  # the start's score, once per work folder
    if cached.is_file():
        start = json.loads(cached.read_text())
    else:
        start = quiz_scores(AutoModelForCausalLM.from_pretrained(work / "sft_dice"),
                            AutoTokenizer.from_pretrained(work / "sft_dice"), heldout, environment=DiceQuizEnv)
        cached.write_text(json.dumps(start))
    print(f"after SFT ({sft_seconds:.0f} s), {a.rounds} rounds: {start}", flush=True)
    overrides, runs = key_values(a.set), {}
    for seed in seeds:
        for luck in a.luck:
            for name, variant in VARIANTS.items():
                if a.only is not None and name not in a.only:
                    continue
                cell = run_cell(work, heldout, variant=variant, luck=luck, rounds=a.rounds, updates=updates,
                                seed=seed, overrides=overrides, pretrain_updates=a.pretrain_updates,
                                shown=not a.luck_not_shown, environment=a.environment)
                key = cell_key(name, luck, a.rounds, shown=not a.luck_not_shown, environment=a.environment,
                               episodes=episodes_generated(cell))
                runs.setdefault(key, {"seeds": []})["seeds"].append(cell)
                print(f"{key} seed {seed}: {cell['seconds']:.0f} s, held-out "
                      f"{start['reward']:.3f} -> {cell['end']['reward']:.3f}, 0.9 after "
                      f"{first_reached(cell['rounds_right'], cell['settings']['per_device_train_batch_size'])} "
                      f"episodes; critic {cell['health']}", flush=True)
                write_result("critic_luck", {"updates": updates, "seeds": seeds}, {"sft": start, "runs": runs},
                             out=a.out)
    report(start, runs)
    if a.figures:
        draw_figure(Path(a.figures), runs)
    settings = {"quick": a.quick, "updates": updates, "seeds": seeds, "luck": a.luck, "rounds": a.rounds,
                "luck_shown": not a.luck_not_shown, "environment": a.environment,
                "heldout": len(heldout), "k": K, "rl": {**RL_SETTINGS, **QUIZ_RL}, "overrides": overrides,
                "seconds": {"total": time.perf_counter() - started, "sft": sft_seconds}}
    write_result("critic_luck", settings, {"sft": start, "runs": runs}, out=a.out)
    print(f"load average now {load_average()}")
    return 0


def merge(paths, out, figures) -> int:
    """Merge result files of the same study and SFT start (cells run in parallel) into ``out``: each cell's seeds in
    seed order, the table and the figure."""
    parts = [json.loads(Path(p).read_text()) for p in paths]
    starts, runs = {}, {}
    for part in parts:
        for name, run in part["results"]["runs"].items():
            rounds = run["seeds"][0]["rounds"]
            if starts.setdefault(rounds, part["results"]["sft"]) != part["results"]["sft"]:
                raise SystemExit(f"{part['meta']['argv']}: another SFT start than the first file's; not merged")
            runs.setdefault(name, {"seeds": []})["seeds"] += run["seeds"]
    runs = {name: {"seeds": sorted(run["seeds"], key=lambda r: r["seed"])} for name, run in sorted(runs.items())}
    for rounds, start in sorted(starts.items()):
        report(start, {n: r for n, r in runs.items() if r["seeds"][0]["rounds"] == rounds})
    write_result("critic_luck", {"merged": [str(p) for p in paths]}, {"sft": starts, "runs": runs}, out=out)
    if figures:
        draw_figure(Path(figures), runs)
    return 0


def _mean(xs) -> float:
    xs = list(xs)
    return statistics.fmean(xs) if xs else float("nan")


def report(start, runs) -> None:
    headers = ["start -> RL", "seeds", "held-out share right: mean ± sd (per seed)", "large rounds right",
               f"episodes to {REACHED} (per seed)", "explained var., last 5 (rounds)", "credit gain, last 5",
               "s per run"]
    table = [["SFT", "-", f"{start['reward']:.3f}", f"{start['large']:.3f}", "-", "-", "-", "-"]]
    for name, run in runs.items():
        seeds = run["seeds"]
        reached = [first_reached(r["rounds_right"], r["settings"]["per_device_train_batch_size"]) for r in seeds]
        answers = [k for k in seeds[0]["health"] if int(k) <= seeds[0]["rounds"]]  # not the final message's turn
        health = " / ".join(f"{_mean(r['health'][k] for r in seeds):.2f}" for k in answers) or "-"
        gains = [statistics.fmean(r["credit_gain"][-5:]) for r in seeds if r.get("credit_gain")]
        table.append([name, len(seeds), seed_spread(r["end"]["reward"] for r in seeds),
                      f"{_mean(r['end']['large'] for r in seeds):.3f}",
                      " / ".join("-" if e is None else str(e) for e in reached), health,
                      f"{_mean(gains):.2f}" if gains else "-", _mean(r["seconds"] for r in seeds)])
    print_table(headers, table)
    compare(runs)


def episodes_generated(run: dict) -> int:
    """Every episode a run generated: its RL updates' and its value pretraining's (the same batch each update)."""
    batch = run["settings"]["per_device_train_batch_size"]
    return (len(run["rounds_right"]) + run["value_pretraining"]) * batch


def compare(runs, baseline: str = f"GRPO k={K} (KL in loss)") -> None:
    """Each arm against ``baseline`` at the same luck, horizon and screen, seed by seed (the same SFT start, data order
    and dice): what each arm spent (episodes, CPU seconds, and the peak RSS of a process that ran one of its seeds
    first: the smallest of its runs', as a process's peak only grows), and two paired differences with their 95 % t
    intervals: the held-out score at the end (near the ceiling of 0.881 on most runs) and the learning curve's area
    (the sampled share right of every update, averaged: how soon the arm learned; no ceiling)."""
    headers = ["arm", "episodes generated", "CPU s per run", "peak RSS, MiB (a process's first run)",
               "sampled share right, mean over updates",
               f"held-out - {baseline}'s, paired (95 % t interval)", "seeds below",
               "curve's mean - its, paired (95 % t interval)"]
    table = []
    for key, run in runs.items():
        name, luck, rounds = key.split(" | ")
        base = runs.get(" | ".join((baseline, luck, rounds)))
        seeds = run["seeds"]
        cpu = [r["cpu_seconds"] for r in seeds if "cpu_seconds" in r]
        row = [key, " / ".join(sorted({str(episodes_generated(r)) for r in seeds})),
               f"{_mean(cpu):.0f} ({len(cpu)} runs)" if cpu else "-",
               f"{min(r['peak_rss_mib'] for r in seeds if 'peak_rss_mib' in r):.0f}" if any(
                   "peak_rss_mib" in r for r in seeds) else "-",
               f"{_mean(statistics.fmean(r['rounds_right']) for r in seeds):.3f}", "-", "-", "-"]
        theirs = {r["seed"]: r for r in base["seeds"]} if base is not None and name != baseline else {}
        paired = [(r, theirs[r["seed"]]) for r in seeds if r["seed"] in theirs]
        if len(paired) > 1:
            end = paired_interval([r["end"]["reward"] - t["end"]["reward"] for r, t in paired])
            curve = paired_interval([statistics.fmean(r["rounds_right"]) - statistics.fmean(t["rounds_right"])
                                     for r, t in paired])
            row[5:] = [f"{end['mean']:+.3f} ({end['low']:+.3f} to {end['high']:+.3f}), {end['n']} seeds",
                       str(end["below_zero"]), f"{curve['mean']:+.3f} ({curve['low']:+.3f} to {curve['high']:+.3f})"]
        table.append(row)
    print_table(headers, table)


def draw_figure(folder: Path, runs) -> None:
    """Held-out share right against the luck's size, one line per estimator (mean over seeds, each seed a dot), one
    panel per number of rounds."""
    plt = pyplot_into(folder)
    if plt is None:
        return
    by_rounds: dict[int, dict[str, dict[float, list[float]]]] = {}
    for key, run in runs.items():
        first = run["seeds"][0]
        budget = key.split(" | ")[2].partition(", ")[2]  # another budget than EPISODES: its own line
        name = (key.split(" | ")[0] + ("" if first.get("luck_shown", True) else ", luck not shown")
                + ("" if first.get("environment", "dice") == "dice" else f", {first['environment']} quiz")
                + (f", {budget}" if budget else ""))
        for r in run["seeds"]:
            by_rounds.setdefault(r["rounds"], {}).setdefault(name, {}).setdefault(r["luck"], []).append(
                r["end"]["reward"])
    fig, axes = plt.subplots(1, len(by_rounds), figsize=(6.5 * len(by_rounds), 4.2), squeeze=False)
    colors = plt.get_cmap("tab10")
    for ax, (rounds, names) in zip(axes[0], sorted(by_rounds.items())):
        for i, (name, lucks) in enumerate(sorted(names.items())):
            xs = sorted(lucks)
            ax.plot(xs, [_mean(lucks[x]) for x in xs], color=colors(i), marker="o", label=name)
            for x in xs:
                ax.scatter([x] * len(lucks[x]), lucks[x], color=colors(i), s=8, alpha=0.5)
        ax.set_xlabel("luck: the die's reward per round is luck * (die - 2) / 2")
        ax.set_ylabel("held-out share of rounds right (greedy)")
        ax.set_title(f"{rounds} rounds, equal episodes per update", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, folder / "critic_luck.png", dpi=80)


if __name__ == "__main__":
    sys.exit(main())
