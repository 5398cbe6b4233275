"""benchmarks/gpu_ppo.py --smoke: the GPU benchmark's code on CPU with tiny models of both shapes' architectures and
tokenizer paths (a Llama read back as saved, a Qwen2 read as ``Qwen2Tokenizer``), so that the script cannot rot.

The variants run in this process here (the script runs each in a child of its own, through the same functions),
one update each; ``trl112`` wherever TRL 1.12 is this environment's TRL (CI's TRL 1.12 phase). Each variant's
settings are read back from the trainer and the model (chunk, LoRA dropout, residual dtype, engine).
`--budget-only` runs as the command (its `__main__` block, in this process)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def gpu_ppo():
    sys.path.insert(0, str(BENCH))
    try:
        import gpu_ppo

        yield gpu_ppo
    finally:
        sys.path.remove(str(BENCH))


# (chunk, training micro-batch, LoRA dropout as loaded, residual dtype, engine) each variant must run with; smoke
# batch 4 (2 x 2), recipe chunk 2; the 2 GiB target of `auto` fits the whole batch and the whole mini-batch
EXPECTED = {"trl112": (2, 2, 0.05, "float32", "generate"), "separate": (2, 2, 0.05, "float32", "generate"),
            "shared": (2, 2, 0.05, "float32", "generate"), "fast": (4, 4, 0.0, "bfloat16", "generate"),
            "engine": (4, 4, 0.0, "bfloat16", "continuous_batching"), "graphs": (4, 4, 0.0, "bfloat16", "generate")}


@pytest.mark.parametrize("shape, workload, tokenizer", [("smoke-llama", "full", "TokenizersBackend"),
                                                        ("smoke-qwen2", "uneven", "Qwen2Tokenizer")])
def test_smoke_every_variant_on_cpu(gpu_ppo, tmp_path, shape, workload, tokenizer):
    from trl_ext.ppo.memory.budget import GIB

    a = gpu_ppo.parse_args(["--smoke", "--shape", shape, "--workload", workload, "--updates", "1",
                            "--workdir", str(tmp_path)])
    built = gpu_ppo.build_child(a)
    gpu_ppo.write_prompts(a)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["policy", "prompts.jsonl", "reward"]
    assert built["parameters"] > 0 and built["workload"] == workload
    if workload == "uneven":  # the EOS row scaled until the per-step EOS probability is 2 / response_length
        assert built["eos_step_probability"] == pytest.approx(2 / gpu_ppo.SHAPES[shape]["response"], rel=1e-3)
        assert built["eos_row_scale"] > 1
    variants = [v for v in gpu_ppo.VARIANTS if v != "trl112" or gpu_ppo.trl112_importable()]
    results = {}
    for variant in variants:
        a.variant = variant
        results[variant] = r = gpu_ppo.variant_child(a)
        st = r["settings"]
        assert (st["rollout_chunk"], st["train_micro_batch"], st["lora_dropout"], st["residual_dtype"],
                st["engine"]) == EXPECTED[variant]
        assert st["tokenizer"] == tokenizer
        assert len(r["seconds_per_update"]) == 1 and r["peak_rss_growth_mib"] > 0
        assert all(math.isfinite(r["first_update"][k]) for k in ("objective/scores", "objective/kl", "loss/value_avg"))
        if variant != "trl112":
            assert r["rollout_tokens_per_s"] and r["phases"][0]["time/rollout"] > 0
        assert st["cuda_graphs"] == (variant == "graphs")
        if variant == "graphs":  # on CPU the static cache without graphs: every decoding step eager, same tokens
            assert r["cuda_graphs"]["greedy_check"] == 1.0 and r["cuda_graphs"]["replays"] == 0
            assert r["cuda_graphs"]["eager_steps"] > 0 and r["cuda_graphs"]["failure"] is None
        if workload == "uneven":  # responses stop at EOS (random weights alone: about 1 in 512 steps)
            assert r["eos_fraction"][0] > 0
    fast = results["fast"]
    assert fast["predicted"]["peak_gib"] <= 2.0  # auto's chunk: memory_budget at that chunk within the target
    assert fast["predicted"]["peak_gib"] * GIB > 1 * GIB  # the budget's assumed 1 GiB device overhead included
    rows = [{"variant": "trl112", "shape": shape, "workload": workload, "error": "skipped"}] + list(results.values())
    md = gpu_ppo.table(rows, smoke=True)
    assert md.count("\n") == len(rows) + 1 and f"| {shape}, {workload} | fast (TRL " in md
    assert "| 4, 4, 0, bfloat16, continuous_batching |" in md


def test_profile_runs_one_more_update_and_summarises_its_windows(gpu_ppo, tmp_path):
    """``--profile fast``: the timed updates are reported as without it, one more update runs under the profiler
    (update_profile.py): its four windows, the decoding steps counted in every rollout (6-token responses: the
    prefill samples the first token, 5 decoding steps the rest; random weights almost never sample EOS), and a Chrome
    trace of the decode and optimization windows. On CPU no kernels: the GPU columns stay empty."""
    import gzip
    import json

    a = gpu_ppo.parse_args(["--smoke", "--shape", "smoke-llama", "--updates", "1", "--workdir", str(tmp_path / "m"),
                            "--profile", "fast", "--trace-dir", str(tmp_path / "traces")])
    gpu_ppo.build_child(a)
    gpu_ppo.write_prompts(a)
    assert gpu_ppo.recipe_keys(a, "fast")["total_episodes"] == 2 * gpu_ppo.recipe_keys(a, "shared")["total_episodes"]
    a.variant = "fast"
    r = gpu_ppo.variant_child(a)
    assert len(r["seconds_per_update"]) == 1 and len(r["phases"]) == 1  # the profiled update is not timed
    p = r["profile"]
    assert p["decoding_steps"] == [5, 5] and p["prefills"] == [1, 1]  # auto chunk: the whole batch of 4
    assert p["decode_ms_per_step"] == [pytest.approx(1e3 * r["phases"][0]["time/rollout"] / 5)]
    w = p["windows"]
    assert list(w) == ["prefill", "decode", "scoring", "optimization"]
    assert all(x["steps"] == 1 for x in w.values())  # decode: decoding step 1 alone (6 // 4 = 1)
    for name in ("prefill", "decode"):  # one policy forward: 2 layers x 7 4-bit linear layers
        calls = {o["name"]: o["calls"] for o in w[name]["top_cpu_ops"]}
        assert calls["bitsandbytes::gemm_4bit"] == 14, calls
    for x in w.values():
        assert x["wall_ms"] > 0 and x["host_ops"] > 0 and x["top_cpu_ops"]
        assert x["kernel_ms"] == 0 and x["gpu_idle_share"] is None and not x["top_kernels"]
        assert 0 <= x["outside_ops_ms"] <= x["wall_ms"]
    # the optimization window holds the backward and the optimizer step; the decode window neither
    assert any("Backward" in o["name"] for o in w["optimization"]["top_cpu_ops"] + [{"name": ""}]) or \
        w["optimization"]["host_ops"] > 3 * w["decode"]["host_ops"]
    for name in ("decode", "optimization"):
        trace = json.loads(gzip.open(tmp_path / "traces" / f"trace_{name}.json.gz").read())
        assert trace["traceEvents"]
    from update_profile import profile_table

    md = profile_table(p, p["decode_ms_per_step"][-1])
    assert md.count("\n| ") == 4 and "| decode | 1 |" in md and "ms per decoding step" in md


def test_the_trl112_config_passes_only_keys_the_recipe_sets(gpu_ppo, tmp_path):
    """TRL 1.12's PPOConfig refuses trl-ext's default ``kl_estimator: None``: the variant passes the recipe's own
    keys only (here checked on the key set; the run itself is in the test above under TRL 1.12)."""
    from trl_ext.recipe_loader.loader import resolve_recipe

    import yaml

    a = gpu_ppo.parse_args(["--smoke", "--workdir", str(tmp_path)])
    gpu_ppo.build_child(a)
    gpu_ppo.write_prompts(a)
    recipe_file = tmp_path / "trl112.yaml"
    recipe_file.write_text(yaml.safe_dump(gpu_ppo.recipe_keys(a, "trl112")))
    recipe = resolve_recipe(recipe_file)
    assert "kl_estimator" not in recipe.explicit and recipe.training_args.kl_estimator is None
    assert recipe.explicit["local_rollout_forward_batch_size"] == 2


def test_prompts_are_one_token_per_word_in_both_tokenizers(gpu_ppo, tmp_path):
    """The 0.5B shape's prompts tokenized to zero tokens (a word-level vocabulary read back as Qwen2's byte-level
    BPE): both real shapes' tokenizers, at full vocabulary size and read back as `trl-ext train` reads them (next to
    the shape's config), give one token per prompt word and decode every id."""
    import random_checkpoint  # beside gpu_ppo.py (the fixture put benchmarks/ on the path)
    from transformers import AutoTokenizer

    for shape, cls in (("llama-3-8b", "TokenizersBackend"), ("qwen2.5-0.5b", "Qwen2Tokenizer")):
        s = gpu_ppo.SHAPES[shape]
        make = gpu_ppo.byte_level_tokenizer if s["arch"] == "qwen2" else gpu_ppo.word_tokenizer
        make(s["vocab"]).save_pretrained(tmp_path / shape)
        gpu_ppo.model_config(s).save_pretrained(tmp_path / shape)
        tok = AutoTokenizer.from_pretrained(tmp_path / shape)
        assert type(tok).__name__ == cls and len(tok) == s["vocab"]
        words = gpu_ppo.prompt_words(s)
        sample = "".join(words[i] for i in (0, 1, 25, 26, 700, len(words) - 1))
        ids = tok(sample)["input_ids"]
        assert len(ids) == 6 and len(set(ids)) == 6 and min(ids) >= len(random_checkpoint.SPECIALS)
        assert tok.decode([s["vocab"] - 1]).strip() == words[-1].strip()


def test_budget_only_prints_the_8b_table(gpu_ppo, capsys, monkeypatch):
    """The script run as the command (``python benchmarks/gpu_ppo.py --budget-only``: its ``__main__`` block, through
    runpy in this process; a fresh interpreter would add only its imports, ~10 s)."""
    import runpy

    import transformers

    monkeypatch.setattr(sys, "argv", [str(BENCH / "gpu_ppo.py"), "--budget-only"])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the script puts benchmarks/ and the repository on it
    verbosity = transformers.logging.get_verbosity()  # the script's setup_env lowers it, process-wide
    try:
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(BENCH / "gpu_ppo.py"), run_name="__main__")
    finally:
        transformers.logging.set_verbosity(verbosity)
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "| **peak** = all run + largest phase + overhead | **24.8** (training) | **20.0** (training) | " \
           "**14.2** (training) | **11.3** (training) |" in out
    assert "| `auto` chunk at 24 GiB | none fits | 64 | 64 | 64 |" in out
