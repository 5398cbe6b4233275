"""TRL's GRPOTrainer against trl_ext.PPOTrainer(advantage_estimator="grpo") on the verifiable addition task: the
same SFT model, reward function, k, completions per update, optimizer steps per update and KL-in-loss setting, in one
process; seconds per update and held-out exact-match accuracy after the same number of updates.

Both sides are built from ONE TRL 1.16 `GRPOConfig` (`trl_grpo_config`): TRL's GRPOTrainer takes it, ours is
`PPOConfig.from_grpo_config(that config)` (the key table in docs/coming-from-grpo.md), with only our rollout
chunk (`local_rollout_forward_batch_size` 64, the whole batch at once as TRL generates it) added. What the mapping
gives here (GRPOConfig -> ours):

* samples per prompt k: `num_generations` 4 -> `num_samples_per_prompt` 4, `advantage_estimator` "grpo";
* completions per update: `per_device_train_batch_size` 64, `steps_per_generation` 1, `gradient_accumulation_steps`
  1 -> the same (16 prompts x 4);
* optimizer steps per update: `num_iterations` 2 (the same batch twice) -> `num_ppo_epochs` 2; TRL counts optimizer
  steps, so its `max_steps` is 2 x updates -> our `total_episodes` = updates x 64;
* advantages: `scale_rewards` "group" -> (r - mean) / (unbiased std + 1e-4) per group (`grpo_scale_by_std`);
* KL: `beta` 0.01 (k3 in the loss) -> `kl_in` "loss", `kl_coef` 0.01, k3; `use_bias_correction_kl` TRL 1.16's True in
  both;
* policy-loss aggregation: `loss_type` "bnpo" (token mean over the local batch) -> `loss_aggregation` "token_mean".
  TRL's default "dapo" gives the same number here (one process, one step per generation), but "bnpo" is the one
  equal to ours by definition;
* clipping: `epsilon` 0.2 -> `cliprange` 0.2;
* sampling: temperature 1, no top-k, top-p 1 in both (TRL `top_k` 0, `top_p` 1.0);
* lengths: `max_completion_length` 5 -> `response_length` 5, stop at eos;
* optimizer: AdamW, lr 3e-4 constant, no warmup (passed through); `max_grad_norm` 0 (no clipping on either side);
* reward: `reward_funcs=[exact_match_reward]` in both, no reward model; the same `prompt`/`answer` dataset, which
  each trainer tokenizes itself.

Timing: the wall time between the ends of consecutive updates (a callback), the first update left out; the two
trainers run alternately (ours, TRL, TRL, ours, ...) so a drift of the machine's load hits both. On a shared
2-core machine the numbers are noisy: read the ratio, measured pairwise in one process.

    python benchmarks/vs_trl_grpo.py             # 60 updates, 2 repeats of each trainer (seeds 0, 1)
    python benchmarks/vs_trl_grpo.py --quick     # 10 updates, 1 repeat

Needs TRL >= 1.13 (GRPOTrainer with the reward-function contract used here). Writes benchmarks/results/vs_trl_grpo.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import RESULTS, alternate, fresh_workdir, load_average, print_table, quiet_timed, setup_env, write_result
from verifiable import RL_SETTINGS, sft_or_reuse

K = 4
OURS_ONLY = {"local_rollout_forward_batch_size": RL_SETTINGS["local_rollout_forward_batch_size"]}
"""Our keys GRPOConfig has no word for, given to from_grpo_config beside the GRPOConfig."""


def trl_version_ok() -> tuple[bool, str]:
    import trl
    from packaging.version import Version

    return Version(trl.__version__) >= Version("1.13"), trl.__version__


def trl_grpo_config(out: Path, updates: int, seed: int):
    """The one GRPOConfig of both sides: the verifiable task's RL_SETTINGS in GRPO's words (module docstring)."""
    from trl import GRPOConfig

    s = RL_SETTINGS
    return GRPOConfig(
        output_dir=str(out), seed=seed, use_cpu=True, report_to="none", logging_steps=1, save_strategy="no",
        disable_tqdm=True,
        num_generations=K,
        per_device_train_batch_size=s["per_device_train_batch_size"], gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=s["num_ppo_epochs"],
        max_steps=updates * s["num_ppo_epochs"],  # TRL counts optimizer steps
        scale_rewards="group", beta=s["kl_coef"], loss_type="bnpo", epsilon=0.2,
        temperature=s["temperature"], top_k=0, top_p=1.0, max_completion_length=s["response_length"],
        learning_rate=s["learning_rate"], lr_scheduler_type=s["lr_scheduler_type"], warmup_steps=0,
        max_grad_norm=0.0, mask_truncated_completions=False, log_completions=False,
    )


class UpdateClock:
    """A TrainerCallback: the time at the end of every `every`-th optimizer step (one update)."""

    def __init__(self, every: int):
        self.every, self.stamps = every, []

    def __getattr__(self, name):
        return lambda *args, **kwargs: None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.every == 0:
            self.stamps.append(time.perf_counter())

    def seconds_per_update(self) -> float:
        gaps = [b - a for a, b in zip(self.stamps, self.stamps[1:])]  # from the end of update 1 on
        return statistics.median(gaps)


def prompt_data(train_rows):
    """The training set as GRPOTrainer takes it (and ours): `prompt` text and `answer`."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [r["prompt"] for r in train_rows], "answer": [r["answer"] for r in train_rows]})


def our_config(out: Path, updates: int, seed: int):
    """Ours: `PPOConfig.from_grpo_config` of the GRPOConfig TRL gets."""
    import trl_ext

    return trl_ext.PPOConfig.from_grpo_config(trl_grpo_config(out, updates, seed), **OURS_ONLY)


def run_ours(sft_dir, train_rows, out, updates, seed):
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trl_ext
    from arithmetic_task import exact_match_reward

    tokenizer = AutoTokenizer.from_pretrained(sft_dir, padding_side="left")
    torch.manual_seed(seed)
    policy = AutoModelForCausalLM.from_pretrained(sft_dir)
    trainer = trl_ext.PPOTrainer(args=our_config(out, updates, seed), processing_class=tokenizer, model=policy,
                                 ref_model=copy.deepcopy(policy), reward_funcs=[exact_match_reward],
                                 train_dataset=prompt_data(train_rows))
    clock = UpdateClock(1)
    trainer.add_callback(clock)
    return trainer, trainer.model.policy, clock


def run_trl(sft_dir, train_rows, out, updates, seed):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from arithmetic_task import exact_match_reward

    tokenizer = AutoTokenizer.from_pretrained(sft_dir, padding_side="left")
    torch.manual_seed(seed)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(sft_dir), reward_funcs=[exact_match_reward],
                          args=trl_grpo_config(out, updates, seed), train_dataset=prompt_data(train_rows),
                          processing_class=tokenizer)
    clock = UpdateClock(RL_SETTINGS["num_ppo_epochs"])
    trainer.add_callback(clock)
    return trainer, trainer.model, clock


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10 updates, one repeat")
    p.add_argument("--updates", type=int, default=None, help="updates per run (default 60, quick 10)")
    p.add_argument("--repeats", type=int, default=None, help="runs of each trainer, seeds 0.. (default 2, quick 1)")
    p.add_argument("--sft-dir", default=None, help="reuse this SFT model (its data folder beside it)")
    p.add_argument("--workdir", default=str(RESULTS / "vs_trl_grpo_runs"))
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/vs_trl_grpo.json)")
    a = p.parse_args(argv)
    setup_env(threads=1)
    ok, version = trl_version_ok()
    if not ok:
        print(f"vs_trl_grpo needs TRL >= 1.13 (GRPOTrainer with reward functions); TRL {version} is installed. "
              "pip install -U 'trl>=1.13'", file=sys.stderr)
        return 2
    updates = a.updates or (10 if a.quick else 60)
    repeats = a.repeats or (1 if a.quick else 2)
    sys.path.insert(0, str(HERE.parent / "recipes" / "verifiable"))
    from evaluate import accuracy, read_jsonl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = fresh_workdir(a.workdir, create=True)
    sft_dir, _, data = sft_or_reuse(work, a.sft_dir)
    tokenizer = AutoTokenizer.from_pretrained(sft_dir)
    heldout, train_rows = read_jsonl(data / "heldout.jsonl"), read_jsonl(data / "train.jsonl")
    start = accuracy(AutoModelForCausalLM.from_pretrained(sft_dir), tokenizer, heldout)

    seeds = {"trl_ext": iter(range(repeats)), "trl": iter(range(repeats))}

    def measured(name, build):
        def once():
            seed = next(seeds[name])
            out = work / f"{name}-seed{seed}"
            trainer, policy, clock = build(sft_dir, train_rows, out, updates, seed)
            _, wall = quiet_timed(trainer.train, f"{out}.log")
            acc = accuracy(policy, tokenizer, heldout)
            result = {"seed": seed, "seconds_per_update": clock.seconds_per_update(), "wall_s": wall,
                      "updates": len(clock.stamps), **acc}
            print(f"{name} seed {seed}: {result}", flush=True)
            del trainer
            shutil.rmtree(out, ignore_errors=True)
            return result
        return once

    results = alternate({"trl_ext": measured("trl_ext", run_ours), "trl": measured("trl", run_trl)}, repeats)
    ratio = [o["seconds_per_update"] / t["seconds_per_update"] for o, t in zip(results["trl_ext"], results["trl"])]
    rows = []
    for name, label in (("trl_ext", "trl_ext PPOTrainer, grpo"), ("trl", f"TRL {version} GRPOTrainer")):
        rs = results[name]
        rows.append([label, len(rs), statistics.median(r["seconds_per_update"] for r in rs),
                     " / ".join(f"{r['greedy']:.3f}" for r in rs), " / ".join(f"{r['sampled']:.3f}" for r in rs)])
    print(f"SFT start: held-out greedy {start['greedy']:.3f}, sampled {start['sampled']:.3f}; {updates} updates of "
          f"{RL_SETTINGS['per_device_train_batch_size']} completions")
    print_table(["trainer", "runs", "s per update (median)", "held-out greedy acc. per seed",
                 "held-out sampled acc. per seed"], rows)
    print(f"time ratio trl_ext / TRL per repeat: {[round(r, 3) for r in ratio]} "
          f"(median {statistics.median(ratio):.3f})")
    ours = our_config(work, updates, 0)
    ours_keys = {k: getattr(ours, k) for k in (*RL_SETTINGS, "advantage_estimator", "num_samples_per_prompt", "kl_in",
                                               "loss_aggregation", "use_bias_correction_kl", "total_episodes")}
    write_result("vs_trl_grpo", {"updates": updates, "repeats": repeats, "ours": ours_keys,
                                 "trl_config": trl_grpo_config(work, updates, 0).to_dict()},
                 {"sft": start, "runs": results, "time_ratio": ratio}, out=a.out)
    print(f"load average now {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
