"""Does a bfloat16 residual stream (`upcast_non_quantized: false`) learn as well as peft's float32 upcast? (issue 18,
section 3: the default is chosen by this evidence.)

On the gold task of recipes/gold (recipes/gold/README.md) the script builds the data, the SFT model and the proxy
reward model as benchmarks/gold_reward.py does, then runs PPO (recipes/gold/ppo.yaml) with a **4-bit nf4 LoRA
policy** computing in bfloat16 (`dtype: bfloat16`, no autocast: `bf16: false` on CPU), once with
`upcast_non_quantized: true` (embeddings, LM head and norms float32: a float32 residual stream) and once with `false`
(all of them bfloat16), with the same seeds. The reward and value models are the gold recipe's (float32). The
trained policy is evaluated as it is (4-bit base + adapter, recipes/gold/gold_eval.py): gold reward, proxy reward
and KL to the SFT model over the 96 prompts x `--samples-per-prompt`.

    python benchmarks/gold_upcast.py      # 2 seeds x 2 settings, 96 updates each (~11 minutes on 2 CPU cores)
    python benchmarks/gold_upcast.py --updates 8 --seeds 1   # one seed, short runs
    python benchmarks/gold_upcast.py --smoke --updates 2 --seeds 1 --samples-per-prompt 1   # tiny sizes (its test)
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
from _common import RESULTS, fresh_workdir, load_average, print_table, setup_env, write_result  # noqa: E402
from gold_reward import GOLD, log_series, proxy_setup, train  # noqa: E402

sys.path.insert(0, str(GOLD))

# The policy: 4-bit nf4 base, LoRA on every linear layer, bfloat16 compute; larger steps than the full-model recipe
# (3e-4), as LoRA needs (recipes/demo/ppo_shared.yaml uses 1e-2 on the random tiny base).
QLORA_POLICY = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "dtype": "bfloat16", "use_peft": True,
                "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "lora_target_modules": "all-linear",
                "learning_rate": 1e-3, "bf16": False, "reward_dtype": "float32", "value_dtype": "float32"}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=96, help="PPO updates per run (16 episodes each)")
    p.add_argument("--seeds", type=int, default=2, help="training seeds per setting")
    p.add_argument("--samples-per-prompt", type=int, default=8, help="evaluation samples per prompt (96 prompts)")
    p.add_argument("--workdir", default=str(RESULTS / "gold_upcast_runs"), help="where the runs are written")
    p.add_argument("--smoke", action="store_true", help="tiny data, pairs and SFT/reward steps (the test's sizes)")
    p.add_argument("--out", default=None, help="result JSON (default benchmarks/results/gold_upcast.json)")
    a = p.parse_args(argv)

    setup_env(threads=1)
    work = fresh_workdir(a.workdir)
    started = time.perf_counter()
    data, reward_dir, evaluator = proxy_setup(work, a.samples_per_prompt, smoke=a.smoke)
    sft_point = evaluator.evaluate(work / "sft")
    # where PPO starts: the SFT model loaded as the policy is (4-bit, each setting; LoRA B = 0 adds nothing)
    from trl import ModelConfig

    from trl_ext.models import load_policy

    start_points = {}
    for upcast in (True, False):
        keys = {k: v for k, v in QLORA_POLICY.items() if k in ModelConfig.__dataclass_fields__}
        start_points[upcast] = evaluator.evaluate(load_policy(ModelConfig(model_name_or_path=str(work / "sft"), **keys),
                                                              upcast_non_quantized=upcast))

    runs = []
    for seed in range(a.seeds):
        for upcast in (True, False):  # alternated: the machine's load drifts alike for both
            out = work / f"ppo-upcast{upcast}-seed{seed}"
            trainer, secs = train("ppo", {**QLORA_POLICY, "upcast_non_quantized": upcast, "seed": seed,
                                          "model_name_or_path": work / "sft", "reward_model_path": reward_dir,
                                          "dataset_name": data / "prompts.jsonl", "output_dir": out,
                                          "total_episodes": 16 * a.updates, "disable_tqdm": True})
            policy = trainer.accelerator.unwrap_model(trainer.model).policy
            embed = policy.get_base_model().get_input_embeddings().weight.dtype
            point = evaluator.evaluate(policy)
            logged = log_series(trainer, "objective/kl", "objective/scores")
            runs.append({"upcast_non_quantized": upcast, "seed": seed, "seconds": secs, "embedding_dtype": str(embed),
                         "end": point, "logged": logged})
            del trainer, policy
            shutil.rmtree(out, ignore_errors=True)

    report(sft_point, start_points, runs)
    total = time.perf_counter() - started
    write_result("gold_upcast", {"updates": a.updates, "seeds": a.seeds, "smoke": a.smoke,
                                 "samples_per_prompt": a.samples_per_prompt, "policy": QLORA_POLICY,
                                 "seconds_total": total},
                 {"sft": sft_point, "start": {str(k): v for k, v in start_points.items()}, "runs": runs}, out=a.out)
    print(f"total {total:.0f} s; load average now {load_average()}")
    return 0


def report(sft_point, start_points, runs) -> None:
    rows = [["SFT", "float32", sft_point["gold"], sft_point["proxy"], 0.0, sft_point["lm_loss"], "-", "-"]]
    for upcast in (True, False):
        point = start_points[upcast]
        rows.append([f"SFT in 4-bit, upcast {upcast} (PPO's start)", "", point["gold"], point["proxy"], point["kl"],
                     point["lm_loss"], "-", "-"])
    for upcast in (True, False):
        mine = [r for r in runs if r["upcast_non_quantized"] is upcast]
        for r in mine:
            last = r["logged"]["objective/scores"]["value"][-8:]
            rows.append([f"upcast {upcast} seed {r['seed']}", r["embedding_dtype"].removeprefix("torch."),
                         r["end"]["gold"], r["end"]["proxy"], r["end"]["kl"], r["end"]["lm_loss"],
                         statistics.mean(last), r["seconds"]])
        golds, kls = [r["end"]["gold"] for r in mine], [r["end"]["kl"] for r in mine]
        rows.append([f"upcast {upcast} mean", "", statistics.mean(golds), statistics.mean(r["end"]["proxy"]
                                                                                      for r in mine),
                     statistics.mean(kls), statistics.mean(r["end"]["lm_loss"] for r in mine), "", ""])
    print_table(["run", "embeddings", "gold", "proxy", "KL to SFT", "LM loss", "objective/scores (last 8)",
                 "s per run"], rows)


if __name__ == "__main__":
    sys.exit(main())
