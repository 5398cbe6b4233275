"""PPO under `torchrun --nproc_per_node 2` for test_ppo_ddp.py: a LoRA-policy PPO run with the extensions on.

Usage: ppo_ddp_script.py TINY_MODELS_DIR OUT_DIR [MODE[,MODE...] [REWARD_ADAPTER [TOOL_MODELS_DIR]]], modes from
trl, joint (the default), separate, shared (needs REWARD_ADAPTER), critic_free, objectives and tools (needs
TOOL_MODELS_DIR, trl_ext.testing.tools.save_tool_models's folder): one launch runs them one after the
other (each from freshly loaded models; the process start and imports are paid once). For each mode each rank
writes OUT_DIR/MODE/rank{N}.json with its logged kl_coef values and a checksum of its trainable weights, or
{"rank": N, "error": TRACEBACK} when the mode raised (the next mode runs all the same). The suite runs the modes of
test_ppo_ddp.py through `run_modes` inside the launch of tests/runtime/ddp_script.py, which it makes anyway.

`trl` runs TRL's own trainer; `joint` (default) and `separate` pick trl_ext's ptx_mode; `shared` (joint ptx) puts
the reward and value models as adapters on the policy's base (from REWARD_ADAPTER), saves checkpoint-2 and also
resumes from it; `critic_free` (joint ptx) trains with REINFORCE++-baseline (2 samples per prompt, no value model)
and also writes the first update's advantages and response masks. `objectives` (no ptx) trains GRPO on a binary
score with the global token mean, clip-higher, an entropy bonus and dynamic sampling, gradient accumulation 2 and 2
mini-batches, and writes each mini-batch's token count and normalizer, the sampling metrics and the optimizer steps
taken. `tools` (no ptx) trains a LoRA policy that calls an `add` tool
(on rank 1 its results have 3 more digits) with GAE (a value model) and adaptive KL, 2 updates, and also writes each
update's logged `tools/*`, `episodes/*` metrics, the same metrics of this process's episodes alone, and the episodes.
`evaluation` (eval_strategy steps, 5 eval prompts, batches of 2) writes the metrics of `trainer.evaluate()` before
training, the eval rows each rank scored, and the evaluation logged after one update.
"""

import hashlib
import json
import os
import sys
import time
import traceback
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

PPO_DDP_MODES = ["separate", "shared", "critic_free", "objectives", "tools", "evaluation"]  # test_ppo_ddp.py's


def main():
    from trl_ext.testing import TinyModels

    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    modes = (sys.argv[3] if len(sys.argv) > 3 else "joint").split(",")
    adapter = Path(sys.argv[4]) if len(sys.argv) > 4 else None
    tool_models = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    tiny = TinyModels(root, root / "tokenizer", root / "policy", root / "reward")
    for mode, result in run_modes(modes, tiny, out, adapter, tool_models).items():
        (out / mode / f"rank{result['rank']}.json").write_text(json.dumps(result))


def run_modes(modes: list[str], tiny, out: Path, adapter: Path | None, tool_models: Path | None = None) -> dict:
    """Each mode's result on this rank, in OUT/MODE (also called by tests/runtime/ddp_script.py, whose launch runs
    these modes after its own runs)."""
    import torch.distributed as dist

    results = {}
    for mode in modes:
        (out / mode).mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        try:
            results[mode] = (run_tools(tool_models, out / mode) if mode == "tools"
                             else run_evaluation(tiny, out / mode) if mode == "evaluation"
                             else run_mode(mode, tiny, out / mode, adapter))
        except Exception:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ["RANK"])
            results[mode] = {"rank": rank, "error": traceback.format_exc()}
        results[mode]["seconds"] = time.perf_counter() - start  # what each mode adds to the launch
    return results


def run_mode(mode: str, tiny, out: Path, adapter: Path | None) -> dict:
    """One mode's run (see the module docstring); its per-rank result."""
    from peft import LoraConfig

    use_trl = mode == "trl"
    tok = left_tokenizer(tiny)
    seed_all(0)
    policy, value, reward = load_models(tiny)
    kwargs = config_kwargs(out, gradient_accumulation_steps=1, total_episodes=8, num_sample_generations=0)
    if use_trl:
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        extra = {}
    else:
        from trl_ext import PPOConfig, PPOTrainer

        kwargs.update(kl_controller="adaptive", kl_target=0.01, kl_horizon=8, value_clip="mean", ptx_coef=0.5,
                      ptx_max_length=16, ptx_mode="joint" if mode == "critic_free" else mode)
        extra = {"ptx_dataset": ptx_dataset()}
    if mode == "objectives":
        return run_objectives(tok, policy, reward, kwargs)
    if mode == "shared":
        return run_shared(tiny, tok, out, adapter, kwargs, extra)
    rollouts = []
    if mode == "critic_free":
        kwargs.update(advantage_estimator="reinforce_pp_baseline", num_samples_per_prompt=2)
        value = None

        class Recording(PPOTrainer):
            def compute_advantages(self, rollout):
                super().compute_advantages(rollout)
                rollouts.append(rollout)

        PPOTrainer = Recording  # noqa: N806
    trainer = PPOTrainer(
        args=PPOConfig(**kwargs), processing_class=tok, model=policy, ref_model=None, reward_model=reward,
        train_dataset=prompt_dataset(tok), value_model=value,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), **extra,
    )
    trainer.train()
    result = summary(trainer)
    if rollouts:
        result["advantages"] = rollouts[0].advantages.tolist()
        result["mask"] = (~rollouts[0].padding_mask).tolist()
        result["queries"] = rollouts[0].queries.tolist()
    return result


def evaluation_data(tok):
    """(train, eval) datasets of `evaluation` mode: 8 and 5 prompts with an `answer` column naming the row."""
    from datasets import Dataset

    from trl_ext.testing import tiny_corpus

    texts = [" ".join(line.split()[:3]) for line in tiny_corpus(13, seed=4)]
    columns = [{"input_ids": [tok(t)["input_ids"] for t in part], "prompt": part, "answer": [f"{tag}{i}" for i in
                range(len(part))]} for part, tag in ((texts[:8], "t"), (texts[8:], "e"))]
    return Dataset.from_dict(columns[0]), Dataset.from_dict(columns[1])


def evaluation_trainer(tiny, out, seen: list):
    """A PPO trainer (reward model and a reward function of the completion ids) with `eval_strategy: steps` on the
    5 prompts of :func:`evaluation_data`; the function appends each `answer` it scores to `seen`."""
    import trl_ext

    def digest(completion_ids, answer, **kwargs):
        seen.extend(answer)
        return [float(sum(ids) % 7) for ids in completion_ids]

    tok = left_tokenizer(tiny)
    seed_all(0)
    policy, value, reward = load_models(tiny)
    train, evaluation = evaluation_data(tok)
    args = trl_ext.PPOConfig(**config_kwargs(out, total_episodes=8, num_sample_generations=0,
                                             per_device_train_batch_size=4, gradient_accumulation_steps=1,
                                             per_device_eval_batch_size=2, eval_strategy="steps", eval_steps=1))
    return trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                              train_dataset=train, value_model=value, reward_funcs=[digest], eval_dataset=evaluation)


def run_evaluation(tiny, out: Path) -> dict:
    """`evaluation`: `trainer.evaluate()` before training (the weights every process and a one-process run share:
    comparable), then one update with its evaluation; each rank's metrics and the eval rows it scored."""
    seen = []
    trainer = evaluation_trainer(tiny, out, seen)
    before = trainer.evaluate()
    before_seen = list(seen)
    trainer.train()  # 8 episodes, 4 per process and update: one update under two processes
    return {"rank": trainer.accelerator.process_index, "before": before, "before_seen": before_seen,
            "logged": [e for e in trainer.state.log_history if "eval_reward" in e]}


def summary(trainer):
    params = [p for p in trainer.accelerator.unwrap_model(trainer.model).parameters() if p.requires_grad]
    return {
        "rank": trainer.accelerator.process_index,
        "world_size": trainer.accelerator.num_processes,
        "kl_coef": [e["objective/kl_coef"] for e in trainer.state.log_history if "objective/kl_coef" in e],
        "kl": [e["objective/kl"] for e in trainer.state.log_history if "objective/kl" in e],
        "checksum": hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in params)).hexdigest(),
        "final_kl_coef": trainer.kl_ctl.value,
        "ptx_losses": [e["loss/ptx_avg"] for e in trainer.state.log_history if "loss/ptx_avg" in e],
    }


def run_shared(tiny, tok, out, adapter, kwargs, extra):
    """3 updates with reward and value adapters on the policy's base, checkpoint-2; then resumed from it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_ext import PPOConfig, PPOTrainer
    from trl_ext.models.shared_base import add_scalar_adapter

    def trainer(resume=None):
        seed_all(0)
        policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny.policy),
                                LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        reward = add_scalar_adapter(policy, "reward", source=adapter, trainable=False)
        value = add_scalar_adapter(policy, "value", source=adapter, trainable=True)
        args = PPOConfig(**{**kwargs, "ptx_mode": "joint", "total_episodes": 12, "save_strategy": "steps",
                            "save_steps": 2})
        t = PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                       train_dataset=prompt_dataset(tok), value_model=value, **extra)
        t.train(resume_from_checkpoint=resume)
        return t

    result = summary(trainer())
    resumed = summary(trainer(str(out / "checkpoint-2")))
    result["resumed_checksum"], result["resumed_kl"] = resumed["checksum"], resumed["kl"]
    result["checkpoint_files"] = sorted(os.listdir(out / "checkpoint-2"))
    result["value_model_files"] = sorted(os.listdir(out / "checkpoint-2" / "value_model"))
    return result


def run_objectives(tok, policy, reward, kwargs):
    """GRPO (2 samples per prompt, 2 prompts per process and update) with the objective keys, 2 updates."""
    from peft import LoraConfig

    from trl_ext import PPOConfig, PPOTrainer
    from trl_ext.ppo.objective import objectives

    normalizers = []

    class Binary(PPOTrainer):
        def compute_scores(self, postprocessed_query_response, context_length):
            return (super().compute_scores(postprocessed_query_response, context_length) > 0).float()

        def postprocess_responses(self, responses):  # 3 tokens count on rank 0, 5 on rank 1: unequal counts
            responses = super().postprocess_responses(responses).clone()
            responses[:, 3 + 2 * self.accelerator.process_index:] = self.processing_class.pad_token_id
            return responses

    def recording(cfg, rollout, inds, accumulation, accelerator):
        normalizer = objectives.mini_batch_token_normalizer(cfg, rollout, inds, accumulation, accelerator)
        local = objectives.loss_mask(rollout.padding_mask[inds], rollout.contain_eos_token[inds], cfg).sum()
        normalizers.append((local.item(), normalizer.item()))
        return normalizer

    import trl_ext.ppo.optimize_loop as loop_module

    original = loop_module.mini_batch_token_normalizer
    loop_module.mini_batch_token_normalizer = recording  # undone below: a later mode in this launch trains too
    # gradient accumulation 2 with 2 mini-batches: one optimizer step per mini-batch (TRL's PPO merges the two)
    args = PPOConfig(**{**kwargs, "total_episodes": 16, "ptx_coef": 0.0, "ptx_mode": "joint",
                        "gradient_accumulation_steps": 2, "num_mini_batches": 2, "advantage_estimator": "grpo",
                        "num_samples_per_prompt": 2, "loss_aggregation": "global_token_mean", "cliprange_high": 0.28,
                        "entropy_coef": 0.01, "dynamic_sampling": True, "max_sampling_rounds": 3})
    trainer = Binary(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                     train_dataset=prompt_dataset(tok), value_model=None,
                     peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    steps = count_optimizer_steps(trainer)
    try:
        trainer.train()
    finally:
        loop_module.mini_batch_token_normalizer = original
    result = summary(trainer)
    result["optimizer_steps"] = steps.count
    result["normalizers"] = normalizers
    result["sampling"] = [{k: v for k, v in e.items() if k.startswith("sampling/")} for e in trainer.state.log_history
                          if "sampling/rounds" in e]
    return result


def exact_sum(completions, answer, **kwargs):
    """1 when the episode's last message holds the sum (the `tools` mode's reward function)."""
    return [float(str(a) in c[-1]["content"]) for c, a in zip(completions, answer)]


def run_tools(root: Path, out: Path, use_cpu: bool = True, facts=None) -> dict:
    """A LoRA policy fitted to call `add` (tests/conftest.py `tool_models`), GAE with a value model, adaptive KL,
    `tools=[add]`: 2 updates of 2 episodes per process. Also each update's `tools/*` and `episodes/*` metrics of this
    process's episodes alone (EpisodeBatch.metrics without the gather). (Also run by tests/engines/engine_script.py
    under DeepSpeed ZeRO-2: `facts(trainer)` then replaces the checksum with the engine's facts.)"""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from trl_ext import PPOConfig, PPOTrainer
    from trl_ext.testing.tools import ADD_PAIRS
    from trl_ext.testing.tools import add as add_

    def add(a: int, b: int) -> int:  # rank 1's results 3 digits longer: each process's own metrics differ
        return add_(a, b) * 1000 ** int(os.environ["RANK"])

    add.__doc__ = add_.__doc__  # the schema the model was fitted with
    own, episodes = [], []

    class Recording(PPOTrainer):
        def compute_advantages(self, rollout):
            super().compute_advantages(rollout)
            own.append(rollout.episodes.metrics(lambda t: t))
            episodes.append([e.messages for e in rollout.episodes.episodes])

    tok = AutoTokenizer.from_pretrained(root / "tok")
    seed_all(0)
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Add {a} and {b}."}], "answer": a + b}
                              for a, b in ADD_PAIRS])
    kwargs = config_kwargs(out, gradient_accumulation_steps=1, num_ppo_epochs=1, total_episodes=8, response_length=64,
                           temperature=0.3, num_sample_generations=0, missing_eos_penalty=None,
                           kl_controller="adaptive", kl_target=0.01, kl_horizon=8, use_cpu=use_cpu,
                           critic_learning_rate=3e-3)  # the value model's own groups (also under DeepSpeed)
    trainer = Recording(
        args=PPOConfig(**kwargs), processing_class=tok, model=AutoModelForCausalLM.from_pretrained(root / "caller"),
        ref_model=None, reward_model=None, train_dataset=data,
        value_model=AutoModelForSequenceClassification.from_pretrained(root / "value", num_labels=1),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), reward_funcs=[exact_sum],
        tools=[add],
    )
    trainer.train()
    result = summary(trainer)
    if facts is not None:
        result.update(facts(trainer))
    result["logged"] = [{k: v for k, v in e.items() if k.startswith(("tools/", "episodes/"))}
                        for e in trainer.state.log_history if "tools/call_frequency" in e]
    result["own"], result["episodes"] = own, episodes
    # each group's rate before the schedule (which has decayed every group to 0 by the end)
    result["learning_rates"] = sorted({group["initial_lr"] for group in trainer.optimizer.param_groups})
    result["health"] = [{k: v for k, v in e.items() if k.startswith("critic/")}
                        for e in trainer.state.log_history if "objective/kl" in e]
    return result


if __name__ == "__main__":
    main()
