"""Run by test_engines.py (and benchmarks/engine_matrix.py) under `accelerate launch --config_file CONFIG`: the
three trainers with LoRA and the extensions on, under whatever engine CONFIG names (DDP, DeepSpeed ZeRO-2/3, FSDP).

Usage: engine_script.py TINY_MODELS_DIR OUT_DIR RUN[,RUN...] [--gpu] with runs from `reward` (ranked data + label
smoothing), `dpo` (cDPO), `ppo` (LoRA policy, adaptive KL, joint ptx; 3 updates, checkpoint at update 2) and
`ppo_resumed` (PPO resumed from that checkpoint by a fresh trainer), in that order, `ppo_reward_funcs` (GRPO with a
reward function and no reward model, as in ddp_script.py), `ppo_tools` (GAE with `tools=[add]`, the `tools` run of
tests/ppo/ppo_ddp_script.py; needs TRL_EXT_TOOL_MODELS_DIR, the folder of trl_ext.testing.tools.save_tool_models),
and `ppo_recipe` (the PPO demo recipe through trl_ext.recipe_loader.pipeline, as `trl-ext train` runs it: a full
policy, whose reference TRL copies, 2 updates, fp32; needs TRL_EXT_TINY_DIR and the repository as working
directory). The settings are those of tests/runtime/ddp_script.py, so a DDP launch of this script gives the reference
numbers. `--gpu` (used by benchmarks/engine_matrix.py) trains on the GPUs: `use_cpu=False` (on CPU the recipes'
`use_cpu: true` is kept).

Each rank writes OUT_DIR/rank{N}.json: per run, the engine it saw (accelerate's distributed type, the wrapper and
optimizer classes, the ZeRO stage, how many trainable values this rank holds), the logged losses/metrics, and a
checksum and norm of the *whole* trainable weights (gathered from the shards under ZeRO-3 and FSDP), so ranks can be
compared with each other and with the DDP run. A failing run records its error and the script goes on with the next.
"""

import hashlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # the shared helpers
sys.path.insert(0, str(TESTS / "runtime"))  # ddp_script: the same runs, under DDP

import torch  # noqa: E402

torch.set_num_threads(1)

from ddp_script import hf_args, lora, rows  # noqa: E402
from ppo_helpers import config_kwargs, left_tokenizer, load_models, prompt_dataset, ptx_dataset, seed_all  # noqa: E402

RUNS = ("reward", "dpo", "ppo", "ppo_resumed", "ppo_recipe", "ppo_reward_funcs", "ppo_tools")
ON_GPU = "--gpu" in sys.argv[4:]


def device_args(kwargs: dict) -> dict:
    """`kwargs` with `use_cpu=False` when running on GPUs (`--gpu`)."""
    return {**kwargs, "use_cpu": False} if ON_GPU else kwargs


def whole_trainable_weights(module, accelerator) -> torch.Tensor:
    """All trainable values of `module` as one fp32 vector, whole on every rank (a collective under ZeRO-3/FSDP)."""
    from trl_ext.runtime.engines import gathered_parameters

    params = [p for p in module.parameters() if p.requires_grad]
    assert params
    with gathered_parameters(module, accelerator):  # ZeRO-3
        parts = []
        for p in params:
            t = p.detach()
            if hasattr(t, "full_tensor"):  # FSDP2: a DTensor shard
                t = t.full_tensor()
            parts.append(t.float().reshape(-1).cpu())
        return torch.cat(parts)


def local_trainable_numel(module) -> int:
    """Trainable values this rank holds (smaller than the whole under ZeRO-3 and FSDP: the proof of sharding)."""
    total = 0
    for p in module.parameters():
        if p.requires_grad:
            t = p.detach()
            if hasattr(t, "to_local"):
                t = t.to_local()
            total += getattr(p, "ds_tensor", t).numel()  # ZeRO-3 keeps the shard in ds_tensor
    return total


def engine_facts(trainer, wrapped, module) -> dict:
    acc = trainer.accelerator
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    facts = {
        "distributed_type": str(acc.distributed_type).split(".")[-1],
        "world_size": acc.num_processes,
        "rank": acc.process_index,
        "wrapper": type(wrapped).__name__,
        "optimizer": type(optimizer).__name__,
        "zero_stage": wrapped.zero_optimization_stage() if hasattr(wrapped, "zero_optimization_stage") else None,
        "local_trainable_numel": local_trainable_numel(module),
    }
    weights = whole_trainable_weights(module, acc)
    facts["trainable_numel"] = weights.numel()
    facts["checksum"] = hashlib.sha256(weights.numpy().tobytes()).hexdigest()
    facts["weight_norm"] = weights.norm().item()
    return facts


def run_reward(tiny, out):
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trl_ext import RewardConfig, RewardTrainer

    trainer = RewardTrainer(
        model=AutoModelForSequenceClassification.from_pretrained(tiny.reward),
        args=RewardConfig(**device_args(hf_args(out / "reward")), label_smoothing=0.1),
        train_dataset=Dataset.from_list(rows("ranked", 12, seed=1)),
        processing_class=AutoTokenizer.from_pretrained(tiny.tokenizer), peft_config=lora("SEQ_CLS"),
    )
    trainer.train()
    return {**engine_facts(trainer, trainer.model_wrapped, trainer.model),
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "accuracy": [h["accuracy"] for h in trainer.state.log_history if "accuracy" in h]}


def run_dpo(tiny, out):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_ext import DPOConfig, DPOTrainer

    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny.policy),
        args=DPOConfig(**device_args(hf_args(out / "dpo")), label_smoothing=0.1, beta=0.5),
        train_dataset=Dataset.from_list(rows("pairs", 12, seed=2)),
        processing_class=AutoTokenizer.from_pretrained(tiny.tokenizer), peft_config=lora("CAUSAL_LM"),
    )
    trainer.train()
    return {**engine_facts(trainer, trainer.model_wrapped, trainer.model), "loss_types": trainer.loss_types,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "margins": [h["rewards/margins"] for h in trainer.state.log_history if "rewards/margins" in h]}


def run_ppo(tiny, out, resume=None):
    from trl_ext import PPOConfig, PPOTrainer

    tok = left_tokenizer(tiny)
    seed_all(0)
    policy, value, reward = load_models(tiny)
    kwargs = config_kwargs(out / "ppo", gradient_accumulation_steps=1, total_episodes=12, num_sample_generations=0,
                           kl_controller="adaptive", kl_target=0.01, kl_horizon=8, ptx_coef=0.5, ptx_max_length=16,
                           save_strategy="steps", save_steps=2)
    trainer = PPOTrainer(
        args=PPOConfig(**device_args(kwargs)), processing_class=tok, model=policy, ref_model=None, reward_model=reward,
        train_dataset=prompt_dataset(tok), value_model=value, peft_config=lora(None), ptx_dataset=ptx_dataset(),
    )
    trainer.train(resume_from_checkpoint=resume)
    logs = [e for e in trainer.state.log_history if "objective/kl" in e]
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    checkpoint = out / "ppo" / "checkpoint-2"
    return {
        **engine_facts(trainer, trainer.model, unwrapped),
        "policy_checksum": engine_facts(trainer, trainer.model, unwrapped.policy)["checksum"],
        "kl": [e["objective/kl"] for e in logs],
        "kl_coef": [e["objective/kl_coef"] for e in logs],
        "scores": [e["objective/scores"] for e in logs],
        "loss_policy": [e["loss/policy_avg"] for e in logs],
        "loss_value": [e["loss/value_avg"] for e in logs],
        "ptx": [e["loss/ptx_avg"] for e in logs],
        "final_kl_coef": trainer.kl_ctl.value,
        "checkpoint_files": sorted(os.listdir(checkpoint)) if checkpoint.is_dir() else [],
        # values in the checkpoint's adapter and value model files: whole tensors, not ZeRO-3 shards
        "saved_adapter_numel": saved_numel(checkpoint / "adapter_model.safetensors"),
        "saved_value_numel": saved_numel(checkpoint / "value_model" / "model.safetensors"),
    }


def run_ppo_recipe(out):
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.pipeline import run

    overrides = ["--output_dir", str(out / "ppo_recipe"), "--reward_model_path", "tiny://reward",
                 "--total_episodes", "32", "--bf16", "false", *(["--use_cpu", "false"] if ON_GPU else []),
                 "--max_grad_norm", "1.0"]  # the demo sets 0.0; HF's default, which the engine must clip at
    trainer = run(resolve_recipe(str(TESTS.parent / "recipes" / "demo" / "ppo.yaml"), overrides))
    logs = [e for e in trainer.state.log_history if "objective/kl" in e]
    return {**engine_facts(trainer, trainer.model, trainer.accelerator.unwrap_model(trainer.model)),
            "kl": [e["objective/kl"] for e in logs], "scores": [e["objective/scores"] for e in logs],
            "episodes": [e["episode"] for e in logs], "ref_model": type(trainer.ref_model).__name__,
            "grad_norm": [e.get("policy/grad_norm") for e in logs],
            "gradient_clipping": trainer.model.gradient_clipping() if trainer.is_deepspeed_enabled else None}


def saved_numel(path: Path) -> int | None:
    from safetensors import safe_open

    if not path.is_file():
        return None
    with safe_open(str(path), framework="pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())


def main():
    from trl_ext.testing import TinyModels

    root, out, runs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3].split(",")
    tiny = TinyModels(root, root / "tokenizer", root / "policy", root / "reward")
    result = {"rank": int(os.environ.get("RANK", "0"))}
    out.mkdir(parents=True, exist_ok=True)
    for run in runs:
        start = time.perf_counter()
        try:
            if run == "reward":
                result[run] = run_reward(tiny, out)
            elif run == "dpo":
                result[run] = run_dpo(tiny, out)
            elif run == "ppo":
                result[run] = run_ppo(tiny, out)
            elif run == "ppo_resumed":
                result[run] = run_ppo(tiny, out, resume=str(out / "ppo" / "checkpoint-2"))
            elif run == "ppo_recipe":
                result[run] = run_ppo_recipe(out)
            elif run == "ppo_reward_funcs":
                from ddp_script import run_ppo_reward_funcs

                result[run] = run_ppo_reward_funcs(
                    tiny, left_tokenizer(tiny), out, use_cpu=not ON_GPU,
                    facts=lambda t: engine_facts(t, t.model, t.accelerator.unwrap_model(t.model)))
            elif run == "ppo_tools":
                sys.path.insert(0, str(TESTS / "ppo"))
                from ppo_ddp_script import run_tools

                result[run] = run_tools(
                    Path(os.environ["TRL_EXT_TOOL_MODELS_DIR"]), out / run, use_cpu=not ON_GPU,
                    facts=lambda t: engine_facts(t, t.model, t.accelerator.unwrap_model(t.model)))
            else:
                raise ValueError(f"unknown run {run!r}; use {RUNS}")
        except Exception as err:  # recorded for the matrix; the test fails on it
            result[run] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-4000:]}
            print(result[run]["traceback"], file=sys.stderr, flush=True)
        result[run]["seconds"] = time.perf_counter() - start  # what each run adds to the launch
        (out / f"rank{result['rank']}.json").write_text(json.dumps(result))  # after each run: a hang keeps it
        if "error" in result[run]:
            break  # the other rank may be waiting in a collective of this run


if __name__ == "__main__":
    main()
