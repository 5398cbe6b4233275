"""The critic across turns: GAE with a value model against RLOO and GRPO on a quiz whose every round is rewarded.

Task (recipes/tool_use/quiz_env.py): an episode is 4 rounds; each round the environment shows a number 0-8 and the
model answers it with the ``answer`` tool (right: the number after it). The SFT start (recipes/tool_use/sft_quiz.yaml)
imitates a careless player, right on 0-4 and mostly repeating the number on 5-8: 0.566 held-out, optimum 1.0. RL
(``environment_factory``, no reward function) has to flip the four large numbers' answers; a prize drawn at the end
(1.0 with chance 0.5) adds to every return what no answer changes:

* GAE, per-turn rewards: ``QuizTurnEnv``, each round's reward (``get_turn_reward``) on the last token of the turn
  that answered it; a value model from the SFT model with a fresh scalar head;
* GAE, per-turn rewards, critic warm-up 3: the same after 3 updates that train the value model alone;
* GAE, end reward only: ``QuizEnv``, the share of rounds right and the prize at the end;
* RLOO k=4 and GRPO k=4 (KL in the loss, k3): ``QuizTurnEnv``, whose per-turn rewards critic-free estimators add up
  into the episode's score: ``QuizEnv``'s end reward, the same numbers.

Every run: 32 episodes per update (8 quizzes x 4 for RLOO and GRPO), the tool task's RL settings
(benchmarks/tool_use.py ``RL_SETTINGS``) at lr 1e-4 (``QUIZ_RL``), seeds 0..2. Measured: the held-out quizzes
greedily (evaluate.py ``quiz_scores``) before and after RL, the share of rounds right of every update (the learning
curve), and for GAE the value model's error per turn (:func:`critic_errors`).

    python benchmarks/turn_credit.py --sft-dir outputs/tool_use     # after make_data.py and sft_quiz.yaml
    python benchmarks/turn_credit.py --quick                         # data, SFT, 3 updates, 1 seed

Writes benchmarks/results/turn_credit.json (or --out).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import (REPO, key_values, load_average, logged, print_table, pyplot_into, quiet_timed,  # noqa: E402
                     rl_trainer_from_sft, save_figure, seed_spread, setup_env, study_cells, study_parser, study_size,
                     study_work, train_recipe, write_result)
from tool_use import K, RL_SETTINGS  # noqa: E402

TASK = REPO / "recipes" / "tool_use"
sys.path.insert(0, str(TASK))

UPDATES = (30, 3)
#: The quiz's RL settings over the tool task's: its episode's budget and rounds, and lr 1e-4 (at the tool task's 3e-4,
#: 3 of 12 GAE runs on per-turn rewards collapsed, none of RLOO's or GRPO's: benchmarks/README.md section 17).
QUIZ_RL = {"response_length": 224, "max_tool_calling_iterations": 4, "learning_rate": 1e-4}
#: The value model's own settings (docs/critic-guide.md; benchmarks/critic_luck.py uses them too): its own learning rate,
#: Monte-Carlo targets (VAPO's decoupled lambda), a policy lambda that reaches less far.
CRITIC = {"critic_learning_rate": 1e-3, "critic_lam": 1.0, "lam": 0.9}
VARIANTS = {
    "GAE, per-turn rewards, critic settings": {"advantage_estimator": "gae", **CRITIC, "critic_warmup": 5,
                                               "environment": "QuizTurnEnv"},
    "GAE, per-turn rewards": {"advantage_estimator": "gae", "environment": "QuizTurnEnv"},
    "GAE, per-turn rewards, critic warm-up 3": {"advantage_estimator": "gae", "critic_warmup": 3,
                                                "environment": "QuizTurnEnv"},
    "GAE, end reward only": {"advantage_estimator": "gae", "environment": "QuizEnv"},
    f"RLOO k={K}": {"advantage_estimator": "rloo", "num_samples_per_prompt": K, "environment": "QuizTurnEnv"},
    f"GRPO k={K} (KL in loss)": {"advantage_estimator": "grpo", "num_samples_per_prompt": K, "kl_in": "loss",
                                 "environment": "QuizTurnEnv"},
}


def sft(work: Path, *, max_steps: int | None = None, seed: int = 0, train: int = 1000) -> float:
    """The quiz's data and base model (make_data.write_quiz, ``train`` quizzes), then sft_quiz.yaml into
    ``<work>/sft_quiz``."""
    from make_data import write_quiz

    write_quiz(work, seed=seed, train=train)
    return train_recipe(TASK / "sft_quiz.yaml", work / "sft_quiz.log", model_name_or_path=work / "quiz_base",
                        dataset_name=work / "data" / "quiz_sft.jsonl", output_dir=work / "sft_quiz",
                        max_steps=max_steps)


def run_cell(work: Path, heldout: list[dict], *, variant: dict, updates: int, seed: int, overrides: dict,
             keep: bool = False) -> dict:
    """One RL run from ``<work>/sft_quiz``: the settings, seconds, per-update curves and held-out scores after."""
    import quiz_env
    from datasets import Dataset
    from evaluate import quiz_scores, read_jsonl

    variant = dict(variant)
    environment = getattr(quiz_env, variant.pop("environment"))
    settings = {**RL_SETTINGS, **QUIZ_RL, **variant, **overrides}
    rows = read_jsonl(work / "data" / "quiz_train.jsonl")
    warmup = f"-warmup{settings['critic_warmup']}" if settings.get("critic_warmup") else ""
    out = work / f"rl-{settings['advantage_estimator']}-{environment.__name__}{warmup}-seed{seed}"
    trainer = rl_trainer_from_sft(work / "sft_quiz", out, updates=updates, seed=seed, settings=settings,
                                  dataset=lambda tokenizer: Dataset.from_list(rows),
                                  value_model=settings["advantage_estimator"] == "gae", reward_funcs=None,
                                  environment_factory=environment)
    rounds_right = rounds_right_callback(trainer)
    trainer.add_callback(rounds_right)
    _, seconds = quiet_timed(trainer.train, f"{out}.log")
    end = quiz_scores(trainer.model.policy, trainer.processing_class, heldout)
    critic = critic_errors(trainer, heldout[:64], settings["temperature"]) if trainer.args.has_value_model else None
    if keep:
        trainer.model.policy.save_pretrained(f"{out}-policy")
        trainer.processing_class.save_pretrained(f"{out}-policy")
    turn = logged(trainer, "episodes/turn_reward_mean")
    end_reward = logged(trainer, f"rewards/{environment.__name__}/mean")
    reward = [a + b for a, b in zip(turn, end_reward)] if turn else end_reward
    result = {"seed": seed, "settings": settings, "seconds": seconds, "end": end, "reward": reward,
              "rounds_right": rounds_right.curve, "critic": critic,
              "kl": logged(trainer, "objective/kl"), "value_loss": logged(trainer, "loss/value_avg")}
    del trainer
    shutil.rmtree(out, ignore_errors=True)
    return result


def critic_errors(trainer, rows: list[dict], temperature: float) -> dict:
    """What the value model learned: the trained policy plays ``rows`` (sampled at ``temperature``, as RL plays,
    ``QuizTurnEnv``: per-turn rewards and the prize), and at the first token of each turn (the 4 answers, then the
    final message) the value model's prediction is compared with the return that followed (the turn rewards from
    that token on and the prize; the KL penalty left out). Returns, per turn, the value's root-mean-square error and
    the returns' standard deviation (the error of the best constant: what a critic must beat to help)."""
    import quiz_env
    import torch
    from evaluate import play

    policy, value_model, tok = trainer.model.policy, trainer.model.value_model, trainer.processing_class
    batch, envs = play(policy, tok, [r["prompt"] for r in rows], environment_factory=quiz_env.QuizTurnEnv, rows=rows,
                       greedy=False, temperature=temperature, max_tool_calling_iterations=quiz_env.ROUNDS,
                       response_length=quiz_env.RESPONSE_LENGTH)
    per_turn = {}
    with torch.no_grad():
        for episode, env in zip(batch.episodes, envs):
            ids = torch.tensor([episode.prompt_ids + episode.ids])  # the trainer's values: before each response token
            values = trainer.critic.values(value_model, ids, tok.pad_token_id, len(episode.prompt_ids))[0]
            starts = [t for t, a in enumerate(episode.action) if a and (t == 0 or not episode.action[t - 1])]
            for k, t in enumerate(starts):
                ret = sum(r for p, r in episode.turn_rewards if p >= t) + env.get_reward()
                per_turn.setdefault(k, []).append((values[t].item(), ret))
    out = {}
    for k, pairs in sorted(per_turn.items()):
        rets = [g for _, g in pairs]
        mean = sum(rets) / len(rets)
        out[str(k + 1)] = {"rmse": (sum((v - g) ** 2 for v, g in pairs) / len(pairs)) ** 0.5,
                           "return_sd": (sum((g - mean) ** 2 for g in rets) / len(rets)) ** 0.5, "n": len(pairs)}
    return out


def rounds_right_callback(trainer):
    """A trainer callback whose ``curve`` gets, after each update, the share of rounds the update's episodes
    answered right (quiz_env.share_right of its environments, the prize left out): the learning curve, measured the
    same way for every variant."""
    from quiz_env import share_right
    from transformers import TrainerCallback

    class RoundsRight(TrainerCallback):
        def __init__(self):
            self.curve = []

        def on_step_end(self, args, state, control, **kwargs):
            environments = trainer.multi_turn.toolbox.environments
            self.curve.append(sum(share_right(e) for e in environments) / len(environments))
            return control

    return RoundsRight()


def parse_args(argv):
    p = study_parser(__doc__, "turn_credit", updates=UPDATES)
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="PPOConfig overrides (YAML values)")
    p.add_argument("--sft-dir", default=None, help="reuse a folder with data/ and sft_quiz/ (make_data, sft_quiz)")
    p.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: sft_quiz.yaml's)")
    p.add_argument("--merge", nargs="*", default=None, metavar="JSON",
                   help="no training: merge these result files (cells run in parallel) into one, table and figure")
    p.add_argument("--figures", default=str(HERE / "figures"), help="where the PNG figure goes ('' for none)")
    p.add_argument("--keep", action="store_true", help="save each run's policy to <workdir>/rl-...-policy")
    p.add_argument("--seed-list", type=int, nargs="*", default=None, help="these training seeds instead of 0..N-1")
    return p.parse_args(argv)


def merge(paths, out, figures) -> int:
    """Merge result files of the same study (each from some cells: ``--only``/``--seed-list`` run in parallel) into
    ``out``: every variant's seeds in seed order, the table and the figure."""
    import json

    parts = [json.loads(Path(p).read_text()) for p in paths]
    start, runs = parts[0]["results"]["sft"], {}
    for part in parts:
        if part["results"]["sft"] != start:
            raise SystemExit(f"{part['meta']['argv']}: another SFT start than the first file's; not merged")
        for name, run in part["results"]["runs"].items():
            runs.setdefault(name, {"seeds": []})["seeds"] += run["seeds"]
    runs = {name: {"seeds": sorted(runs[name]["seeds"], key=lambda r: r["seed"])} for name in VARIANTS if name in runs}
    report(start, runs)
    write_result("turn_credit", {"merged": [str(p) for p in paths]}, {"sft": start, "runs": runs}, out=out)
    if figures:
        draw_figure(Path(figures), start, runs)
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.merge:
        return merge(a.merge, a.out, a.figures)
    updates, seeds = study_size(a, UPDATES)
    seeds = a.seed_list if a.seed_list is not None else seeds
    setup_env(threads=1)
    from evaluate import quiz_scores, read_jsonl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    work, sft_seconds = study_work(a, lambda w: sft(w, max_steps=60 if a.quick else a.sft_steps))
    overrides = key_values(a.set)
    heldout = read_jsonl(work / "data" / "quiz_heldout.jsonl")
    start = quiz_scores(AutoModelForCausalLM.from_pretrained(work / "sft_quiz"),
                        AutoTokenizer.from_pretrained(work / "sft_quiz"), heldout)
    print(f"after SFT ({sft_seconds:.0f} s): {start}", flush=True)
    runs = {}
    for seed, name, variant in study_cells(seeds, VARIANTS, a.only):
        run = runs.setdefault(name, {"seeds": []})
        cell = run_cell(work, heldout, variant=variant, updates=updates, seed=seed, overrides=overrides, keep=a.keep)
        run["seeds"].append(cell)
        print(f"{name} seed {seed}: {cell['seconds']:.0f} s, held-out {start['reward']:.3f} -> "
              f"{cell['end']['reward']:.3f}; sampled reward {_mean(cell['reward'][:3]):.3f} (first 3) -> "
              f"{_mean(cell['reward'][-3:]):.3f} (last 3)", flush=True)
        write_result("turn_credit", {"updates": updates, "seeds": seeds}, {"sft": start, "runs": runs}, out=a.out)
    report(start, runs)
    if a.figures:
        draw_figure(Path(a.figures), start, runs)
    settings = {"quick": a.quick, "updates": updates, "seeds": seeds, "heldout": len(heldout), "k": K,
                "rl": {**RL_SETTINGS, **QUIZ_RL}, "overrides": overrides,
                "seconds": {"total": time.perf_counter() - started, "sft": sft_seconds}}
    write_result("turn_credit", settings, {"sft": start, "runs": runs}, out=a.out)
    print(f"load average now {load_average()}")
    return 0


def _mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


def report(start, runs) -> None:
    headers = ["start -> RL", "seeds", "held-out reward: mean ± sd (per seed)", "large rounds right",
               "sampled reward, last 5", "s per run"]
    table = [["SFT", "-", f"{start['reward']:.3f}", f"{start['large']:.3f}", "-", "-"]]
    for name, run in runs.items():
        ends = [r["end"]["reward"] for r in run["seeds"]]
        table.append([f"RL: {name}", len(ends), seed_spread(ends),
                      f"{_mean(r['end']['large'] for r in run['seeds']):.3f}",
                      _mean(_mean(r["reward"][-5:]) for r in run["seeds"]), _mean(r["seconds"] for r in run["seeds"])])
    print_table(headers, table)


def draw_figure(folder: Path, start, runs) -> None:
    """The learning curves: each update's sampled share of rounds right (the prize left out), every seed, one colour
    per variant; the SFT start's greedy held-out score and the optimum as lines."""
    plt = pyplot_into(folder)
    if plt is None:
        return
    colors = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (name, run) in enumerate(runs.items()):
        for j, r in enumerate(run["seeds"]):
            xs = [(u + 1) * r["settings"]["per_device_train_batch_size"] for u in range(len(r["rounds_right"]))]
            ax.plot(xs, r["rounds_right"], color=colors(i), linewidth=1, alpha=0.8, label=name if j == 0 else None)
    ax.axhline(start["reward"], color="grey", linewidth=0.8, linestyle=":", label="SFT start (greedy, held-out)")
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--", label="optimum")
    ax.set_xlabel("episodes")
    ax.set_ylabel("share of rounds right (sampled, training quizzes)")
    ax.set_title("The counting quiz with a prize draw: per-turn credit against one episode score", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    save_figure(fig, folder / "turn_credit.png", dpi=80)


if __name__ == "__main__":
    sys.exit(main())
