"""Run by test_ddp.py under `torchrun --nproc_per_node 2`: the three trainers with LoRA and the extensions on.

Usage: ddp_script.py TINY_MODELS_DIR OUT_DIR [REWARD_ADAPTER [TOOL_MODELS_DIR]]. In order: a reward model (ranked
data, label smoothing), DPO (cDPO), PPO (adaptive KL + joint ptx) for 3 updates with a checkpoint at update 2, PPO
resumed from that checkpoint, GRPO with a reward function (no reward model) that records the columns each rank sees,
and RLOO with `rollout_engine: continuous_batching` (responses of uneven length) that records the responses each rank
generates.
Each rank writes OUT_DIR/rank{N}.json: per run, a checksum of its trainable weights and what the test compares.
With REWARD_ADAPTER, the same launch then runs the PPO modes of test_ppo_ddp.py (tests/ppo/ppo_ddp_script.py; in
OUT_DIR/ppo_ddp, results under the key "ppo_ddp"; its `tools` mode needs TOOL_MODELS_DIR, the folder of
trl_ext.testing.tools.save_tool_models): one launch, one start and import of the two processes.
"""

import hashlib
import json
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared helpers

import torch  # noqa: E402

torch.set_num_threads(1)

from ppo_helpers import (  # noqa: E402
    config_kwargs,
    count_optimizer_steps,
    left_tokenizer,
    load_models,
    prompt_dataset,
    ptx_dataset,
    seed_all,
)


def checksum(model) -> str:
    params = [p for p in model.parameters() if p.requires_grad]
    assert params
    return hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in params)).hexdigest()


def lora(task_type):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type=task_type)


def hf_args(out):
    return dict(output_dir=str(out), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
                max_steps=3, per_device_train_batch_size=2, logging_steps=1, save_strategy="no", learning_rate=1e-2,
                seed=0, max_length=64, disable_tqdm=True)


def rows(kind, n, seed):
    from trl_ext.testing import tiny_corpus

    words = tiny_corpus(40, seed=21)
    rng = random.Random(seed)
    if kind == "ranked":
        return [{"prompt": rng.choice(words)[:20], "responses": [" " + rng.choice(words) for _ in range(2 + i % 3)]}
                for i in range(n)]
    return [{"prompt": rng.choice(words)[:20], "chosen": " " + rng.choice(words), "rejected": " " + rng.choice(words)}
            for _ in range(n)]


def run_reward(tiny, tok, out):
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification

    from trl_ext import RewardConfig, RewardTrainer

    trainer = RewardTrainer(
        model=AutoModelForSequenceClassification.from_pretrained(tiny.reward),
        args=RewardConfig(**hf_args(out / "reward"), label_smoothing=0.1),
        train_dataset=Dataset.from_list(rows("ranked", 12, seed=1)), processing_class=tok,
        peft_config=lora("SEQ_CLS"),
    )
    trainer.train()
    return {"checksum": checksum(trainer.model), "world_size": trainer.accelerator.num_processes,
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}


def run_dpo(tiny, tok, out):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    from trl_ext import DPOConfig, DPOTrainer

    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny.policy),
        args=DPOConfig(**hf_args(out / "dpo"), label_smoothing=0.1, beta=0.5),
        train_dataset=Dataset.from_list(rows("pairs", 12, seed=2)), processing_class=tok,
        peft_config=lora("CAUSAL_LM"),
    )
    trainer.train()
    return {"checksum": checksum(trainer.model), "world_size": trainer.accelerator.num_processes,
            "loss_types": trainer.loss_types, "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h]}


def run_ppo(tiny, tok, out, resume=None):
    from trl_ext import PPOConfig, PPOTrainer

    seed_all(0)
    policy, value, reward = load_models(tiny)
    kwargs = config_kwargs(out / "ppo", gradient_accumulation_steps=1, total_episodes=12, num_sample_generations=0,
                           kl_controller="adaptive", kl_target=0.01, kl_horizon=8, ptx_coef=0.5, ptx_max_length=16,
                           save_strategy="steps", save_steps=2)
    trainer = PPOTrainer(
        args=PPOConfig(**kwargs), processing_class=tok, model=policy, ref_model=None, reward_model=reward,
        train_dataset=prompt_dataset(tok), value_model=value, peft_config=lora(None), ptx_dataset=ptx_dataset(),
    )
    trainer.train(resume_from_checkpoint=resume)
    logs = [e for e in trainer.state.log_history if "objective/kl" in e]
    return {
        "checksum": checksum(trainer.accelerator.unwrap_model(trainer.model)),
        "world_size": trainer.accelerator.num_processes,
        "kl": [e["objective/kl"] for e in logs],
        "kl_coef": [e["objective/kl_coef"] for e in logs],
        "final_kl_coef": trainer.kl_ctl.value,
        "ptx": [e["loss/ptx_avg"] for e in logs],
        "checkpoint_files": sorted(os.listdir(out / "ppo" / "checkpoint-2")),
    }


RECORDED = []


def answer_length_reward(prompts, completions, completion_ids, answer, trainer_state, **kwargs):
    """Records what this rank's reward function sees; rewards the responses' length (a learnable signal)."""
    RECORDED.append({"prompts": list(prompts), "answer": list(answer), "step": trainer_state.global_step})
    return [float(len(ids)) for ids in completion_ids]


def run_ppo_reward_funcs(tiny, tok, out, use_cpu=True, facts=None):
    """GRPO with k = 2 and a reward function only: each rank's columns must travel with its own prompts. Gradient
    accumulation 2 with 2 mini-batches: also counts the optimizer steps (the engine's under DeepSpeed). (Also run by
    tests/engines/engine_script.py under DeepSpeed: `facts(trainer)` adds the engine's facts.)"""
    from datasets import Dataset

    from trl_ext import PPOConfig, PPOTrainer

    seed_all(0)
    policy, _, _ = load_models(tiny)
    data = prompt_dataset(tok, n=16)
    ids = [list(row) for row in data["input_ids"]]
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    data = Dataset.from_dict({"input_ids": ids, "prompt": texts, "answer": [str(i) for i in range(16)]})
    kwargs = config_kwargs(out / "ppo_rf", gradient_accumulation_steps=2, per_device_train_batch_size=2,
                           num_mini_batches=2, total_episodes=16, num_sample_generations=0, advantage_estimator="grpo",
                           num_samples_per_prompt=2, use_cpu=use_cpu)
    trainer = PPOTrainer(args=PPOConfig(**kwargs), processing_class=tok, model=policy, ref_model=None,
                         reward_model=None, train_dataset=data, value_model=None, peft_config=lora(None),
                         reward_funcs=answer_length_reward)
    steps = None if trainer.is_deepspeed_enabled else count_optimizer_steps(trainer)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "objective/kl" in e]
    result = facts(trainer) if facts else {"checksum": checksum(trainer.accelerator.unwrap_model(trainer.model)),
                                            "world_size": trainer.accelerator.num_processes}
    result["optimizer_steps"] = trainer.model.global_steps if steps is None else steps.count
    return {**result, "calls": RECORDED,
            "prompt_of": dict(zip(data["answer"], texts)), "reward_mean": [e["rewards/answer_length_reward/mean"]
                                                                            for e in logs]}


GENERATED = []


def response_length_reward(prompts, completion_ids, **kwargs):
    """Records the prompts and responses (ids up to the stop token) of this rank; rewards the responses' length."""
    GENERATED.append({"prompts": list(prompts), "ids": [list(ids) for ids in completion_ids]})
    return [len(ids) / 16 for ids in completion_ids]


def stop_often(policy, tok, data):
    """Pins the EOS logit of the random policy's LM head near 4 on the prompts' hidden states (~1/9 of the sampling
    mass), so that responses stop at uneven lengths (the random model alone stops ~1 step in 365)."""
    with torch.no_grad():
        batch = tok.pad({"input_ids": data["input_ids"]}, return_tensors="pt")
        hidden = policy.model.norm(policy.model(**batch).last_hidden_state)[batch["attention_mask"].bool()]
        mean = hidden.mean(0)
        policy.lm_head.weight[tok.eos_token_id] = 4.0 * mean / mean.norm() ** 2


def run_ppo_engine(tiny, tok, out):
    """RLOO k = 2 with LoRA and `rollout_engine: continuous_batching`, 2 updates, up to 16 tokens cut at the stop
    token: each rank's engine samples its own prompts; the update is DDP's (same weights, gathered metrics)."""
    from transformers import AutoModelForCausalLM

    from trl_ext import PPOConfig, PPOTrainer

    start = time.perf_counter()
    seed_all(0)
    policy = AutoModelForCausalLM.from_pretrained(tiny.policy)
    data = prompt_dataset(tok, n=16)
    stop_often(policy, tok, data)
    kwargs = config_kwargs(out / "ppo_cb", gradient_accumulation_steps=1, per_device_train_batch_size=4,
                           total_episodes=16, num_sample_generations=0, advantage_estimator="rloo",
                           num_samples_per_prompt=2, num_ppo_epochs=1, response_length=16,
                           local_rollout_forward_batch_size=4, rollout_engine="continuous_batching")
    trainer = PPOTrainer(args=PPOConfig(**kwargs), processing_class=tok, model=policy, ref_model=None,
                         reward_model=None, train_dataset=data, value_model=None, peft_config=lora(None),
                         reward_funcs=response_length_reward)
    trainer.train()
    keys = ("objective/kl", "reward", "completions/mean_length", "completions/min_length", "completions/max_length",
            "policy/ratio_avg", "policy/approxkl_avg", "loss/policy_avg")
    return {"checksum": checksum(trainer.accelerator.unwrap_model(trainer.model)),
            "world_size": trainer.accelerator.num_processes, "engine": trainer.rollout_engine_choice.engine,
            "logprobs_from_engine": trainer.rollout_engine.logprobs_from_engine, "eos": tok.eos_token_id,
            "responses": GENERATED, "metrics": [{k: e[k] for k in keys} for e in trainer.state.log_history
                                                if "objective/kl" in e],
            "seconds": time.perf_counter() - start}


def main():
    from trl_ext.testing import TinyModels

    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    tiny = TinyModels(root, root / "tokenizer", root / "policy", root / "reward")
    from transformers import AutoTokenizer

    result = {"reward": run_reward(tiny, AutoTokenizer.from_pretrained(tiny.tokenizer), out),
              "dpo": run_dpo(tiny, AutoTokenizer.from_pretrained(tiny.tokenizer), out)}
    tok = left_tokenizer(tiny)
    result["ppo"] = run_ppo(tiny, tok, out)
    result["ppo_resumed"] = run_ppo(tiny, tok, out, resume=str(out / "ppo" / "checkpoint-2"))
    result["ppo_reward_funcs"] = run_ppo_reward_funcs(tiny, tok, out)
    result["ppo_continuous_batching"] = run_ppo_engine(tiny, tok, out)
    if len(sys.argv) > 3:  # test_ppo_ddp.py's runs, after these (their numbers do not depend on the order)
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ppo"))
        from ppo_ddp_script import PPO_DDP_MODES, run_modes

        result["ppo_ddp"] = run_modes(PPO_DDP_MODES, tiny, out / "ppo_ddp", Path(sys.argv[3]),
                                      tool_models=Path(sys.argv[4]) if len(sys.argv) > 4 else None)
    result["rank"] = int(os.environ.get("RANK", "0"))
    (out / f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
