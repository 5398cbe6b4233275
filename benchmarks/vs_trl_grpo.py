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
* optimizer: AdamW, the task's lr (`RL_SETTINGS`) constant, no warmup (passed through); `max_grad_norm` 0 (no
  clipping on either side);
* precision: float32 on both sides (`bf16` False). GRPOTrainer's default `bf16` autocasts its forward passes,
  sampling included, to bfloat16, on CPU too; our PPOTrainer, as TRL's PPO, computes in the loaded weights' dtype.
  ``--trl-bf16`` leaves TRL its default (the section 12 runs of November 28 were measured so);
* reward: `reward_funcs=[exact_match_reward]` in both, no reward model; the same `prompt`/`answer` dataset, which
  each trainer tokenizes itself.

Timing: the wall time between the ends of consecutive updates (a callback), the first update left out; the two
trainers run alternately (ours, TRL, TRL, ours, ...) so a drift of the machine's load hits both. On a shared
2-core machine the numbers are noisy: read the ratio, measured pairwise in one process.

Controls, to find where a difference of the two comes from (benchmarks README, section 12):

* ``--order trl``: ours trains on TRL's prompt order, the order TRL's ``RepeatSampler`` gives for the seed (a
  ``torch.randperm`` of the prompts from a generator seeded with ``seed``), in place of its own shuffled DataLoader;
  each run records the prompts its reward function saw, so the script checks that both saw the same ones.
* ``--same-draws``: before each update's ``generate`` call both trainers reseed torch's RNG alike (``seed`` and the
  call's number), so that equal models sample equal completions: what remains is the code path.

Each pair of runs (one seed) gives the paired differences ours - TRL of the held-out accuracies and of each update's
mean reward; the script prints their mean with a 95 % t interval over the seeds.

    python benchmarks/vs_trl_grpo.py             # 60 updates, 2 repeats of each trainer (seeds 0, 1)
    python benchmarks/vs_trl_grpo.py --repeats 16 --order trl [--same-draws]
    python benchmarks/vs_trl_grpo.py --quick     # 10 updates, 1 repeat

Needs TRL >= 1.13 (GRPOTrainer with the reward-function contract used here). Writes benchmarks/results/vs_trl_grpo.json.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import (RESULTS, alternate, fresh_workdir, load_average, paired_interval, print_table, quiet_timed,
                     setup_env, write_result)
from verifiable import RL_SETTINGS, sft_or_reuse

K = 4
OURS_ONLY = {"local_rollout_forward_batch_size": RL_SETTINGS["local_rollout_forward_batch_size"]}
"""Our keys GRPOConfig has no word for, given to from_grpo_config beside the GRPOConfig."""


def trl_version_ok() -> tuple[bool, str]:
    import trl
    from packaging.version import Version

    return Version(trl.__version__) >= Version("1.13"), trl.__version__


def trl_grpo_config(out: Path, updates: int, seed: int, bf16: bool = False):
    """The one GRPOConfig of both sides: the verifiable task's RL_SETTINGS in GRPO's words (module docstring);
    ``bf16`` True: GRPOConfig's default, TRL's side autocast to bfloat16."""
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
        bf16=bf16,  # module docstring, "precision"
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


def trl_prompt_order(n: int, seed: int, needed: int) -> list[int]:
    """The first ``needed`` prompts (indices) in the order TRL's RepeatSampler hands them out (trl/trainer/utils.py,
    ``RepeatSampler.__iter__``: each epoch ``torch.randperm(n)`` from one generator seeded with ``seed``)."""
    import torch

    generator, order = torch.Generator().manual_seed(seed), []
    while len(order) < needed:
        order += torch.randperm(n, generator=generator).tolist()
    return order[:needed]


class RecordedReward:
    """``exact_match_reward`` that also records, call by call (one call per update), the prompts, the mean reward
    and a digest of the completions' token ids."""

    __name__ = "exact_match_reward"

    def __init__(self):
        from arithmetic_task import exact_match_reward

        self.reward, self.prompts, self.means, self.digests = exact_match_reward, [], [], []

    def __call__(self, completions, answer, prompts=None, completion_ids=None, **kwargs):
        import hashlib

        rewards = self.reward(completions, answer, **kwargs)
        self.prompts.append(list(prompts))
        self.means.append(statistics.fmean(r or 0.0 for r in rewards))
        self.digests.append(hashlib.sha1(repr(completion_ids).encode()).hexdigest())
        return rewards


def same_draws(model, seed: int, eos_token_id: int) -> list:
    """Reseed torch's RNG before each ``model.generate`` call: call n samples under ``manual_seed(seed * 1000003 +
    n)``, in either trainer. Returns a list with, per call, a digest of the sampled tokens (each row up to its first
    ``eos_token_id``, pad tokens included); ``del model.generate`` undoes it."""
    import hashlib

    import torch

    generate, calls = model.generate, []

    def seeded(*args, **kwargs):
        torch.manual_seed(seed * 1_000_003 + len(calls))
        out = generate(*args, **kwargs)
        new = (out.sequences if hasattr(out, "sequences") else out)[:, kwargs["input_ids"].shape[1]:].tolist()
        rows = [row[:row.index(eos_token_id) + 1] if eos_token_id in row else row for row in new]
        calls.append(hashlib.sha1(repr(rows).encode()).hexdigest())
        return out

    model.generate = seeded
    return calls


def prompt_data(train_rows):
    """The training set as GRPOTrainer takes it (and ours): `prompt` text and `answer`."""
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [r["prompt"] for r in train_rows], "answer": [r["answer"] for r in train_rows]})


def our_config(out: Path, updates: int, seed: int):
    """Ours: `PPOConfig.from_grpo_config` of the GRPOConfig TRL gets."""
    import trl_ext

    return trl_ext.PPOConfig.from_grpo_config(trl_grpo_config(out, updates, seed), **OURS_ONLY)


def run_ours(sft_dir, train_rows, out, updates, seed, order="own", draws=False):
    """Our trainer, its reward function recording, and: with ``order="trl"`` TRL's prompt order for ``seed`` (the
    rows in that order, read without shuffling); with ``draws``, :func:`same_draws`."""
    import copy

    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trl_ext

    tokenizer = AutoTokenizer.from_pretrained(sft_dir, padding_side="left")
    torch.manual_seed(seed)
    policy = AutoModelForCausalLM.from_pretrained(sft_dir)
    if order == "trl":
        needed = updates * RL_SETTINGS["per_device_train_batch_size"] // K
        train_rows = [train_rows[i] for i in trl_prompt_order(len(train_rows), seed, needed)]
    reward = RecordedReward()
    trainer = trl_ext.PPOTrainer(args=our_config(out, updates, seed), processing_class=tokenizer, model=policy,
                                 ref_model=copy.deepcopy(policy), reward_funcs=[reward],
                                 train_dataset=prompt_data(train_rows))
    if order == "trl":  # the same DataLoader as the trainer's (trl_ext/ppo/base/base_trainer.py), unshuffled
        trainer.dataloader = DataLoader(trainer.train_dataset, batch_size=trainer.local_dataloader_batch_size,
                                        shuffle=False, collate_fn=trainer.data_collator, drop_last=True)
    calls = same_draws(trainer.model.policy, seed, tokenizer.eos_token_id) if draws else None
    clock = UpdateClock(1)
    trainer.add_callback(clock)
    return trainer, trainer.model.policy, clock, reward, calls


def run_trl(sft_dir, train_rows, out, updates, seed, order="own", draws=False, bf16=False):
    """TRL's GRPOTrainer (its own order: ``order`` is ours to change), reward recording, optionally same draws;
    ``bf16``: :func:`trl_grpo_config`'s."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(sft_dir, padding_side="left")
    torch.manual_seed(seed)
    reward = RecordedReward()
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(sft_dir), reward_funcs=[reward],
                          args=trl_grpo_config(out, updates, seed, bf16), train_dataset=prompt_data(train_rows),
                          processing_class=tokenizer)
    calls = same_draws(trainer.model, seed, tokenizer.eos_token_id) if draws else None
    clock = UpdateClock(RL_SETTINGS["num_ppo_epochs"])
    trainer.add_callback(clock)
    return trainer, trainer.model, clock, reward, calls


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10 updates, one repeat")
    p.add_argument("--updates", type=int, default=None, help="updates per run (default 60, quick 10)")
    p.add_argument("--repeats", type=int, default=None, help="runs of each trainer, seeds 0.. (default 2, quick 1)")
    p.add_argument("--sft-dir", default=None, help="reuse this SFT model (its data folder beside it)")
    p.add_argument("--workdir", default=str(RESULTS / "vs_trl_grpo_runs"))
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/vs_trl_grpo.json)")
    p.add_argument("--order", choices=["own", "trl"], default="own", help="own: each trainer shuffles the prompts "
                   "its way (default); trl: ours takes TRL's RepeatSampler order for the seed")
    p.add_argument("--same-draws", action="store_true", help="both reseed torch's RNG alike before each update's "
                   "generate call (same models sample the same completions)")
    p.add_argument("--trl-bf16", action="store_true", help="leave GRPOTrainer its default bf16 (bfloat16 autocast, "
                   "on CPU too); default: float32 on both sides")
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
            trainer, policy, clock, reward, calls = build(sft_dir, train_rows, out, updates, seed, a.order,
                                                         a.same_draws)
            _, wall = quiet_timed(trainer.train, f"{out}.log")
            if calls is not None:
                del policy.generate  # the evaluation samples under its own seeds
            acc = accuracy(policy, tokenizer, heldout)
            result = {"seed": seed, "seconds_per_update": clock.seconds_per_update(), "wall_s": wall,
                      "updates": len(clock.stamps), **acc, "reward_per_update": reward.means,
                      "prompts_per_update": [group[::K] for group in reward.prompts],
                      "completions_digest": reward.digests, "sampled_digest": calls}
            print(f"{name} seed {seed}: greedy {acc['greedy']:.3f}, sampled {acc['sampled']:.3f}, "
                  f"{result['seconds_per_update']:.2f} s per update", flush=True)
            del trainer
            shutil.rmtree(out, ignore_errors=True)
            return result
        return once

    results = alternate({"trl_ext": measured("trl_ext", run_ours),
                         "trl": measured("trl", functools.partial(run_trl, bf16=a.trl_bf16))}, repeats)
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
    paired = paired_summary(results["trl_ext"], results["trl"])
    ours = our_config(work, updates, 0)
    ours_keys = {k: getattr(ours, k) for k in (*RL_SETTINGS, "advantage_estimator", "num_samples_per_prompt", "kl_in",
                                               "loss_aggregation", "use_bias_correction_kl", "total_episodes")}
    write_result("vs_trl_grpo", {"updates": updates, "repeats": repeats, "order": a.order,
                                 "same_draws": a.same_draws, "trl_bf16": a.trl_bf16, "ours": ours_keys,
                                 "trl_config": trl_grpo_config(work, updates, 0, a.trl_bf16).to_dict()},
                 {"sft": start, "runs": results, "time_ratio": ratio, "paired": paired}, out=a.out)
    print(f"load average now {load_average()}")
    return 0


def paired_summary(ours: list[dict], theirs: list[dict], block: int = 10) -> dict:
    """Paired differences ours - TRL over the seeds (printed and returned): held-out greedy and sampled accuracy, the
    mean reward of each block of ``block`` updates; and per seed whether both saw the same prompts in the same order
    and from which update on their completions differ (None: never)."""
    out = {key: paired_interval([o[key] - t[key] for o, t in zip(ours, theirs)]) for key in ("greedy", "sampled")}
    updates = min(len(r["reward_per_update"]) for r in ours + theirs)
    out["reward_blocks"] = {}
    for start in range(0, updates, block):
        stop = min(start + block, updates)
        out["reward_blocks"][f"{start + 1}-{stop}"] = paired_interval([
            statistics.fmean(o["reward_per_update"][start:stop]) - statistics.fmean(t["reward_per_update"][start:stop])
            for o, t in zip(ours, theirs)])
    out["same_prompts"] = [o["prompts_per_update"] == t["prompts_per_update"] for o, t in zip(ours, theirs)]
    for key, name in (("completions_digest", "scored"), ("sampled_digest", "sampled")):  # sampled: --same-draws
        out[f"{name}_differ_from_update"] = [
            next((i + 1 for i, (x, y) in enumerate(zip(o[key], t[key])) if x != y), None) if o[key] else None
            for o, t in zip(ours, theirs)]
    cells = [("held-out greedy accuracy", out["greedy"]), ("held-out sampled accuracy", out["sampled"])]
    cells += [(f"mean reward of updates {name}", cell) for name, cell in out["reward_blocks"].items()]
    for label, c in cells:
        print(f"ours - TRL, {label}: {c['mean']:+.4f} (95 % interval {c['low']:+.4f} to {c['high']:+.4f}; "
              f"{c['below_zero']} of {c['n']} seeds below 0)")
    print(f"same prompts in the same order, per seed: {out['same_prompts']}")
    if ours and ours[0]["sampled_digest"] is not None:
        print(f"from which update on (None: never) the sampled tokens differ, per seed: "
              f"{out['sampled_differ_from_update']}; the scored completions: {out['scored_differ_from_update']}")
    return out


if __name__ == "__main__":
    sys.exit(main())
