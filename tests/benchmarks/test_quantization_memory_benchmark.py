"""benchmarks/quantization_memory.py through its ``main`` on a policy of hidden size 128, one layer, one PPO update:
every variant's child (fp32, bf16, 8-bit and 4-bit nf4 LoRA, LoRA with a full reference copy, full fine-tuning;
bitsandbytes' CPU kernels) runs its code, here in this process, and reports the policy's stored weights and
trainable parameters, which the variants' settings fix. The memory figures of a child in this process are this
process's (only checked to be measured)."""

from __future__ import annotations

import json
import math

from benchmark_scripts import in_process_children, loaded_script


def test_every_variant_loads_the_policy_as_set_and_trains(tmp_path, monkeypatch):
    out = tmp_path / "quantization.json"
    with loaded_script("quantization_memory") as script:
        children = in_process_children(script)
        monkeypatch.setattr(script, "run_child", children)
        script.main(["--hidden", "128", "--layers", "1", "--updates", "1", "--out", str(out)])
        variants = list(script.VARIANTS)
    result = json.loads(out.read_text())
    rows = {r["variant"]: r for r in result["results"]}
    assert list(rows) == variants and [c[1] for c in children.calls] == variants
    weights = {name: r["weights_mib"] for name, r in rows.items()}
    # stored bytes: bf16 halves what 8-bit quantizes to a quarter and 4-bit to an eighth (the LoRA adapters, the
    # embeddings, the head and the norms stay as they were); the reference copy is not the policy's
    assert weights["4-bit nf4 LoRA"] < weights["8-bit LoRA"] < weights["fp32 LoRA"]
    assert weights["bf16 LoRA"] < weights["fp32 LoRA"] == weights["fp32 LoRA, full ref copy"]
    trainable = {name: r["trainable_parameters"] for name, r in rows.items()}
    lora = {trainable[name] for name in variants if "LoRA" in name}
    assert len(lora) == 1 and 0 < lora.pop() < trainable["fp32 full fine-tuning"] == result["policy_parameters"]
    for r in rows.values():
        assert r["reference"] == ("full copy" if "full" in r["variant"] else "adapters off")
        assert r["peak_rss_mib"] > 0 and math.isfinite(r["working_set_mib"]) and r["s_per_update"] > 0
