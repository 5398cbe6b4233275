"""GPU benchmark of one QLoRA PPO update (issue 18): TRL 1.12's PPOTrainer vs trl-ext's designs, memory and time.

Builds, on the spot, a random-initialised checkpoint of a real shape (no hub, no network): a bf16 safetensors causal
LM, a word-level tokenizer whose vocabulary matches the model's, and a random LoRA reward adapter with its score head
on it (the format a reward recipe with ``use_peft`` writes). Then runs each variant in its own process:

* ``trl112``: TRL 1.12's own ``trl.experimental.ppo.PPOTrainer``, with separate 4-bit reward and value models (what
  TRL's design needs), when ``--trl112-site DIR`` names a site-packages folder holding TRL 1.12 (put first on the
  child's ``PYTHONPATH``; e.g. ``pip install --target DIR --no-deps "trl==1.12.*"``);
* ``separate``: trl-ext with separate 4-bit reward and value models;
* ``shared``: trl-ext with ``shared_base`` (one 4-bit base for policy, reference, reward and value);
* ``fast``: ``shared`` plus this issue's fast settings: ``local_rollout_forward_batch_size: auto`` (the largest chunk
  that fits the memory target), ``lora_dropout: 0``, and ``upcast_non_quantized: false`` where the installed
  trl-ext has that loader option (the JSON says whether it was applied);
* ``engine``: ``fast`` plus ``rollout_engine: continuous_batching`` (transformers' continuous batching, its cache sized
  like the auto chunk's; ``docs/rollout-engine.md``).

Models load through trl-ext's loaders and the recipe pipeline's model code (``load_policy``,
``load_scalar_checkpoint``, ``shared_base_scalar_models``), as ``trl-ext train`` does. For each variant: the
whole-process peak GPU memory (``torch.cuda.max_memory_reserved`` plus what lies outside the caching allocator, i.e.
``total - free - reserved`` measured at the end: the CUDA context and library workspaces; assumes the GPU runs
nothing else), seconds per update (wall, from a callback) and per phase (trl-ext's ``time/*`` metrics; TRL 1.12 logs
none), rollout tokens per second, the first update's metrics, and what ``trl_ext.ppo.rollout.memory_budget`` predicts.

``--smoke`` runs the same code on CPU with a tiny Llama (4-bit through bitsandbytes' CPU path, float32 compute):
resident memory (peak RSS growth over the loaded models) instead of GPU memory. ``tests/test_gpu_ppo_benchmark.py``
runs it, so the script cannot rot. ``--budget-only`` prints memory_budget's 8B table for both residual-stream
settings without running anything.

    python benchmarks/gpu_ppo.py --shape llama-3-8b --trl112-site /tmp/trl112     # on a GPU machine
    python benchmarks/gpu_ppo.py --shape qwen2.5-0.5b --variants shared,fast
    python benchmarks/gpu_ppo.py --smoke                                           # CPU, tiny model, ~1 minute

Writes benchmarks/results/gpu_ppo[_smoke].json and .md (git ignores benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, child_result, machine_info, run_child, setup_env  # noqa: E402

VARIANTS = ("trl112", "separate", "shared", "fast", "engine")
GIB, MIB = 2**30, 2**20
SHAPES = {
    # published config.json sizes; settings as measured in ../shared/notes/gpu.md
    "llama-3-8b": dict(arch="llama", vocab=128_256, hidden=4096, intermediate=14_336, layers=32, heads=32, kv=8,
                       tie=False, prompt=512, response=64, micro=2, accumulation=32, chunk=8, epochs=1, lora_r=32,
                       updates=2),
    "qwen2.5-0.5b": dict(arch="qwen2", vocab=151_936, hidden=896, intermediate=4864, layers=24, heads=14, kv=2,
                         tie=True, prompt=512, response=64, micro=8, accumulation=8, chunk=64, epochs=4, lora_r=32,
                         updates=2),
    "smoke": dict(arch="llama", vocab=512, hidden=64, intermediate=128, layers=2, heads=4, kv=2, tie=False,
                  prompt=12, response=6, micro=2, accumulation=2, chunk=2, epochs=1, lora_r=4, updates=2),
}


# ------------------------------------------------------------------------------------------------ checkpoints


def word_tokenizer(vocab_size: int):
    """A word-level tokenizer with exactly ``vocab_size`` tokens (``<pad>``, ``</s>``, ``<s>``, ``<unk>``, then
    ``w4`` ... ): every id the model can sample decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "</s>", "<s>", "<unk>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"w{i}": i for i in range(len(specials), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>")


def model_config(s: dict):
    from transformers import LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[s["arch"]]
    return cls(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
               num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
               max_position_embeddings=max(2048, s["prompt"] + s["response"]), tie_word_embeddings=s["tie"],
               pad_token_id=0, eos_token_id=1, bos_token_id=2)


def build_child(a):
    """Write the random checkpoint (bf16 safetensors + tokenizer) and a random LoRA reward adapter on it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    s = SHAPES[a.shape]
    root = Path(a.workdir)
    device = "cpu" if a.smoke else "cuda"
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(model_config(s), dtype=torch.bfloat16)
    model.save_pretrained(root / "policy")
    word_tokenizer(s["vocab"]).save_pretrained(root / "policy")
    del model
    scalar = AutoModelForSequenceClassification.from_pretrained(root / "policy", num_labels=1, dtype=torch.bfloat16,
                                                                device_map=device)
    lora = LoraConfig(r=s["lora_r"], lora_alpha=2 * s["lora_r"], target_modules="all-linear", task_type="SEQ_CLS",
                      init_lora_weights=False)
    scalar = get_peft_model(scalar, lora)
    scalar.save_pretrained(root / "reward")
    return {"build_s": time.perf_counter() - t, "parameters": sum(p.numel() for p in scalar.parameters())}


# ------------------------------------------------------------------------------------------------ one variant


def recipe_keys(a, variant: str) -> dict:
    """The recipe of a variant, as `trl-ext train` would read it."""
    s = SHAPES[a.shape]
    root = Path(a.workdir)
    keys = dict(
        trainer="ppo", model_name_or_path=str(root / "policy"), reward_model_path=str(root / "reward"),
        dataset_name=str(root / "prompts.jsonl"), output_dir=str(root / f"out-{variant}"), overwrite_output_dir=True,
        load_in_4bit=True, bnb_4bit_quant_type="nf4", use_bnb_nested_quant=True, use_peft=True,
        lora_r=s["lora_r"], lora_alpha=2 * s["lora_r"], lora_target_modules="all-linear", lora_dropout=0.05,
        value_use_peft=True, value_load_in_4bit=True, value_use_bnb_nested_quant=True, reward_load_in_4bit=True,
        reward_use_bnb_nested_quant=True, value_lora_r=s["lora_r"], value_lora_target_modules="all-linear",
        per_device_train_batch_size=s["micro"], gradient_accumulation_steps=s["accumulation"], num_mini_batches=1,
        num_ppo_epochs=s["epochs"], local_rollout_forward_batch_size=s["chunk"], response_length=s["response"],
        total_episodes=s["updates"] * s["micro"] * s["accumulation"], learning_rate=3e-6, kl_coef=0.05,
        stop_token="eos", missing_eos_penalty=1.0, num_sample_generations=0, save_strategy="no", logging_steps=1,
        report_to="none", seed=0, disable_tqdm=True,
    )
    if a.smoke:
        keys.update(dtype="float32", use_cpu=True, bf16=False)
    else:
        keys.update(dtype="bfloat16", bf16=True)
    if variant in ("shared", "fast", "engine"):
        for k in [k for k in keys if k.startswith(("reward_", "value_")) and k != "reward_model_path"]:
            keys.pop(k)
        keys["shared_base"] = True
    if variant in ("fast", "engine"):
        keys.update(local_rollout_forward_batch_size="auto", lora_dropout=0.0)
        if a.max_memory_gib:
            keys["max_memory_gib"] = a.max_memory_gib
        if has_upcast_option():
            keys["upcast_non_quantized"] = False
    if variant == "engine":
        keys["rollout_engine"] = "continuous_batching"
    return keys


def has_upcast_option() -> bool:
    from trl_ext.recipe_loader.loader import valid_keys

    return "upcast_non_quantized" in valid_keys("ppo")


def prompts(a):
    """``--episodes`` random prompts of exactly the shape's prompt length (ids past the special tokens)."""
    import random

    s = SHAPES[a.shape]
    rng = random.Random(0)
    n = s["updates"] * s["micro"] * s["accumulation"]
    return [" ".join(f"w{rng.randrange(4, s['vocab'])}" for _ in range(s["prompt"])) for _ in range(n)]


def variant_child(a):
    """Load the variant's models as the recipe pipeline does, train ``updates`` updates, measure."""
    import torch
    import transformers

    from trl_ext.recipe_loader import pipeline
    from trl_ext.recipe_loader.data import tokenize_prompts
    from trl_ext.recipe_loader.loader import resolve_recipe

    s = SHAPES[a.shape]
    cuda = not a.smoke
    keys = recipe_keys(a, a.variant)
    recipe_file = Path(a.workdir) / f"{a.variant}.yaml"
    import yaml

    recipe_file.write_text(yaml.safe_dump(keys))
    recipe = resolve_recipe(recipe_file)
    args = recipe.training_args
    model_args = pipeline._resolved(recipe.model_args)
    tokenizer = pipeline.load_tokenizer(model_args)
    tokenizer.padding_side = "left"
    train_ds, _ = pipeline.open_datasets(recipe)
    train_ds = tokenize_prompts(train_ds, tokenizer)
    transformers.set_seed(0)
    policy = pipeline.load_policy(model_args, tokenizer=tokenizer)
    if recipe.pipeline.shared_base:
        reward, value = pipeline.shared_base_scalar_models(recipe, policy)
    else:
        reward = pipeline.load_scalar_checkpoint(pipeline._resolved(recipe.reward_model_args), trainable=False,
                                                 tokenizer=tokenizer)
        reward.eval().requires_grad_(False)
        value = pipeline.load_scalar_checkpoint(pipeline._resolved(recipe.value_model_args), trainable=True,
                                                tokenizer=tokenizer)
    if a.variant == "trl112":
        import trl
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        assert trl.__version__.startswith("1.12"), f"--trl112-site gave TRL {trl.__version__}"
        fields = {f for f in PPOConfig.__dataclass_fields__}
        args = PPOConfig(**{k: v for k, v in vars(args).items() if k in fields and not k.startswith("_")})
    else:
        from trl_ext import PPOTrainer

    class Timer(transformers.TrainerCallback):
        def __init__(self):
            self.seconds = []

        def on_train_begin(self, *_, **__):
            self.last = time.perf_counter()

        def on_step_end(self, *_, **__):
            now = time.perf_counter()
            self.seconds.append(now - self.last)
            self.last = now

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    from _common import peak_rss_mb, reset_peak_rss, rss_mb, trim_heap

    trim_heap()
    rss_before = rss_mb()
    reset_peak_rss()
    timer = Timer()
    trainer = PPOTrainer(args=args, processing_class=tokenizer, model=policy, ref_model=None, reward_model=reward,
                         value_model=value, train_dataset=train_ds, callbacks=[timer])
    trainer.train()
    logs = [e for e in trainer.state.log_history if "objective/kl" in e]
    result = {"variant": a.variant, "trl": __import__("trl").__version__, "seconds_per_update": timer.seconds,
              "first_update": logs[0] if logs else None,
              "rollout_chunk": trainer.args.local_rollout_forward_batch_size,
              "upcast_non_quantized": policy.get_input_embeddings().weight.dtype == torch.float32,
              "lora_dropout": keys["lora_dropout"]}
    phases = [{k: e[k] for k in ("time/rollout", "time/scoring", "time/optimization") if k in e} for e in logs]
    result["phases"] = phases
    result["rollout_tokens_per_s"] = [args.local_batch_size * s["response"] / p["time/rollout"]
                                      for p in phases if p.get("time/rollout")]
    if cuda:
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        outside = total - free - reserved
        result.update(peak_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
                      peak_reserved_gib=torch.cuda.max_memory_reserved() / GIB, outside_allocator_gib=outside / GIB,
                      peak_gib=(torch.cuda.max_memory_reserved() + outside) / GIB)
    else:
        result.update(rss_before_mib=rss_before, peak_rss_growth_mib=peak_rss_mb() - rss_before)
    result["predicted"] = predicted_budget(a, a.variant, recipe, policy, trainer, train_ds)
    return result


def predicted_budget(a, variant, recipe, policy, trainer, train_ds) -> dict:
    """What memory_budget predicts for the variant's run (the loaded policy's shape, the chunk that ran)."""
    from trl_ext.ppo.rollout.memory_budget import ppo_memory_budget
    from trl_ext.ppo.rollout.chunk import run_shape_from_models

    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    peft_policy = getattr(unwrapped, "policy", policy)
    shape, run = run_shape_from_models(peft_policy, trainer.args, max(len(x) for x in train_ds["input_ids"]))
    run = replace(run, rollout_chunk=int(trainer.args.local_rollout_forward_batch_size),
                  streaming_logprobs=variant != "trl112")
    budget = ppo_memory_budget(shape, run, shared=bool(recipe.pipeline.shared_base))
    from trl_ext.ppo.rollout.memory_budget import DEVICE_OVERHEAD_BYTES

    return {"peak_gib": budget.peak / GIB, "persistent_gib": budget.persistent / GIB,
            "peak_without_device_overhead_mib": (budget.peak - DEVICE_OVERHEAD_BYTES) / MIB,
            "phases_gib": {k: v / GIB for k, v in budget.phases.items()}}


# ------------------------------------------------------------------------------------------------ parent


def budget_only() -> str:
    from trl_ext.ppo.rollout.memory_budget import LLAMA_3_8B, PPOShape, budget_table, ppo_memory_budget
    from trl_ext.ppo.rollout.chunk import largest_fitting_chunk

    s = SHAPES["llama-3-8b"]
    run = PPOShape(batch=s["micro"] * s["accumulation"], micro_batch=s["micro"], rollout_chunk=s["chunk"],
                   prompt_length=s["prompt"], response_length=s["response"], lora_r=s["lora_r"],
                   quantization="nf4-nested")
    budgets, chunks = [], []
    for shared in (False, True):
        for upcast in (True, False):
            r = replace(run, upcast_non_quantized=upcast)
            b = ppo_memory_budget(LLAMA_3_8B, r, shared=shared)
            b.design += ", " + ("float32 residual" if upcast else "bf16 residual")
            budgets.append(b)
            try:
                chunks.append(str(largest_fitting_chunk(LLAMA_3_8B, r, 24 * GIB, shared=shared).chunk))
            except ValueError:
                chunks.append("none fits")
    return budget_table(budgets) + "\n| `auto` chunk at 24 GiB | " + " | ".join(chunks) + " |"


def table(results: list[dict], smoke: bool) -> str:
    mem = "peak RSS growth MiB (CPU)" if smoke else "whole-process peak GiB"
    predicted = "predicted MiB (without the assumed 1 GiB CUDA overhead)" if smoke else "predicted peak GiB"
    lines = [f"| variant | {mem} | {predicted} | s per update | rollout / scoring / optimization s | "
             "rollout tokens/s | chunk | first update: objective/scores, objective/kl |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['error']} | | | | | | |")
            continue
        m = f"{r['peak_rss_growth_mib']:.0f}" if smoke else f"{r['peak_gib']:.1f}"
        last = r["phases"][-1] if r["phases"] else {}
        phases = " / ".join(f"{last[k]:.2f}" for k in ("time/rollout", "time/scoring", "time/optimization")
                            if k in last) or "not logged"
        tps = f"{r['rollout_tokens_per_s'][-1]:.0f}" if r["rollout_tokens_per_s"] else "-"
        first = r["first_update"] or {}
        scores, kl = (first.get(k, float("nan")) for k in ("objective/scores", "objective/kl"))
        pred = r["predicted"]
        pred = f"{pred['peak_without_device_overhead_mib']:.2f}" if smoke else f"{pred['peak_gib']:.2f}"
        lines.append(f"| {r['variant']} (TRL {r['trl']}) | {m} | {pred} | "
                     f"{r['seconds_per_update'][-1]:.2f} | {phases} | {tps} | {r['rollout_chunk']} | "
                     f"{scores:.4f}, {kl:.4f} |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=[k for k in SHAPES if k != "smoke"], default="llama-3-8b")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny Llama, RSS instead of GPU memory")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--trl112-site", default=None, help="site-packages folder holding TRL 1.12 (for the trl112 run)")
    p.add_argument("--max-memory-gib", type=float, default=None,
                   help="memory target of the fast variant's auto chunk (default: the GPU's free memory; smoke: 2)")
    p.add_argument("--workdir", default=None, help="where the checkpoint is built (default: benchmarks/results/)")
    p.add_argument("--out", default=None, help="JSON result path (default: benchmarks/results/gpu_ppo[_smoke].json)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--budget-only", action="store_true", help="print memory_budget's 8B table and exit")
    p.add_argument("--child", choices=["build", "variant"], help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.smoke:
        a.shape = "smoke"
        a.max_memory_gib = a.max_memory_gib or 2.0
    a.suffix = "_smoke" if a.smoke else f"_{a.shape}"
    a.workdir = a.workdir or str(RESULTS / f"gpu_ppo_models{a.suffix}")
    return a


def write_prompts(a) -> None:
    with open(Path(a.workdir) / "prompts.jsonl", "w") as f:
        for text in prompts(a):
            f.write(json.dumps({"prompt": text}) + "\n")


def main(argv=None):
    a = parse_args(argv)
    if a.budget_only:
        setup_env(a.threads)
        print(budget_only())
        return 0
    suffix = a.suffix
    if a.child:  # in a child process: measure, print the result as the last line
        setup_env(a.threads)
        child_result(build_child(a) if a.child == "build" else variant_child(a))
        return 0

    Path(a.workdir).mkdir(parents=True, exist_ok=True)
    common = ["--workdir", a.workdir, "--threads", str(a.threads)] + (["--smoke"] if a.smoke else ["--shape", a.shape])
    if a.max_memory_gib:
        common += ["--max-memory-gib", str(a.max_memory_gib)]
    script = Path(__file__).resolve()
    print(f"building the {a.shape} checkpoint in {a.workdir}", flush=True)
    built = run_child(script, common + ["--child", "build"])
    write_prompts(a)
    results = []
    for variant in [v.strip() for v in a.variants.split(",") if v.strip()]:
        if variant not in VARIANTS:
            raise SystemExit(f"--variants: unknown variant {variant!r} (choose from {', '.join(VARIANTS)})")
        env = None
        if variant == "trl112":
            if not a.trl112_site:
                print("trl112: skipped (no --trl112-site)", flush=True)
                results.append({"variant": "trl112", "error": "skipped: no --trl112-site given"})
                continue
            env = {"PYTHONPATH": os.pathsep.join([a.trl112_site, str(script.parents[1])])}
        print(f"running {variant}", flush=True)
        results.append(run_child(script, common + ["--child", "variant", "--variant", variant], env=env,
                                 timeout=3600))
    md = table(results, a.smoke)
    print(md)
    out = Path(a.out) if a.out else RESULTS / f"gpu_ppo{suffix}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine_info(), "shape": SHAPES[a.shape], "build": built,
                               "results": results}, indent=1, default=str))
    out.with_suffix(".md").write_text(md + "\n")
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
