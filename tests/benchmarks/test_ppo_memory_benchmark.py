"""benchmarks/ppo_memory.py through its ``main``: the budget part (the memory budget tables of
``trl_ext.ppo.memory.budget`` for Llama-3-8B and Qwen2.5-7B at the 0.5B recipe's settings and two fitting
ones, each design against the shared base with streamed log-probs), and the rollout part on a Llama of hidden size
32, one layer, with Qwen2.5's 151,936-token vocabulary, responses of 4 and 8 tokens: TRL's rollout and trl_ext's,
each child's code here in this process (its peak RSS is then this process's: only checked to be measured; a peak
that did not grow gives no ratio), checked against the budget's formulas; and the shared part on a 4-bit nf4 Llama
of hidden size 64, one layer (bitsandbytes' CPU kernels), one PPO update per design and one timing repeat of two
updates, whose weight bytes the formulas predict."""

from __future__ import annotations

import json
import math

from benchmark_scripts import in_process_children, loaded_script

QWEN_VOCAB = 151_936


def finite_positive(*values) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


def row(table: str, label: str) -> list[str]:
    """The cells of the markdown row that starts with ``label``."""
    (line,) = [line for line in table.splitlines() if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in line.strip("|").split("|")][1:]


def test_budget_tables_for_both_models_and_designs(tmp_path):
    out = tmp_path / "memory.json"
    with loaded_script("ppo_memory") as script:
        script.main(["budget", "--out", str(out)])
    budget = json.loads(out.read_text())["results"]["budget"]
    assert budget["checks"] == {}  # the formulas are checked against the measuring parts only when they ran
    tables = budget["tables"]
    assert list(tables) == ["recipe settings", "fitting settings", "fitting settings, 512 new tokens"]
    for table in tables.values():
        assert row(table, "part") == ["Llama-3-8B, TRL's design: separate models, TRL rollout",
                                      "Llama-3-8B, shared base, streamed log-probs",
                                      "Qwen2.5-7B, TRL's design: separate models, TRL rollout",
                                      "Qwen2.5-7B, shared base, streamed log-probs"]
        weights = [float(x) for x in row(table, "base weights")]
        logprobs = [float(x) for x in row(table, "rollout: log-probs")]
        for separate, shared in ((0, 1), (2, 3)):  # one base for the three models; no (batch, length, vocab) tensor
            assert 0 < weights[shared] < weights[separate] and 0 < logprobs[shared] < logprobs[separate]
        assert all(cell.startswith("**") and "(" in cell for cell in row(table, "**peak** = all run + largest "
                                                                                "phase + overhead"))
        assert set(row(table, "fits 24 GiB?")) <= {"yes", "no"}


def test_rollout_part_both_implementations_and_the_formulas(tmp_path, monkeypatch):
    out = tmp_path / "memory.json"
    with loaded_script("ppo_memory") as script:
        children = in_process_children(script)
        monkeypatch.setattr(script, "run_child", children)
        script.main(["rollout", "budget", "--hidden", "32", "--layers", "1", "--lengths", "4", "8", "--out",
                     str(out)])
        assert script.ratio(5.0, 0.0) is None and script.times(None) == "-"  # a peak that did not grow
    assert [c[:6] for c in children.calls] == [["--child", "rollout", "--impl", impl, "--length", length]
                                               for impl in ("trl", "ext") for length in ("4", "8")]
    assert all(c[c.index("--hidden") + 1] == "32" and c[c.index("--batch") + 1] == "4" for c in children.calls)
    results = json.loads(out.read_text())["results"]
    rollout = results["rollout"]
    assert rollout["lengths"] == [4, 8]
    rows = {(r["impl"], r["length"]): r for r in rollout["rows"]}
    assert list(rows) == [("trl", 4), ("trl", 8), ("ext", 4), ("ext", 8)]
    for (impl, length), r in rows.items():
        assert r["trl_scores_mib"] * 2**20 == 4 * length * QWEN_VOCAB * 4  # TRL's stacked scores, B*T*V float32
        assert r["kv_cache_mib"] > 0 and r["rss_before_mib"] > 0 and r["peak_growth_mib"] >= 0
        assert math.isfinite(r["logprob_sum"]) and r["logprob_sum"] < 0  # B*T sampled tokens' log-probs
    # the same sampled tokens give the same log-probs (the sampling seed is set before each rollout)
    for length in (4, 8):
        assert math.isclose(rows[("trl", length)]["logprob_sum"], rows[("ext", length)]["logprob_sum"], rel_tol=1e-3)
    for growth in rollout["growth_first_to_last"].values():
        assert growth is None or (math.isfinite(growth) and growth > 0)
    checks = results["budget"]["checks"]["rollout"]
    assert [row[:2] for row in checks] == [list(key) for key in rows]
    assert all(row[2] > 0 and row[3] >= 0 for row in checks)  # formula, measured (MiB)


def test_shared_part_one_base_for_the_three_models(tmp_path, monkeypatch):
    out = tmp_path / "memory.json"
    with loaded_script("ppo_memory") as script:
        children = in_process_children(script)
        monkeypatch.setattr(script, "run_child", children)
        script.main(["shared", "budget", "--shared-hidden", "64", "--shared-layers", "1", "--timing-hidden", "64",
                     "--timing-layers", "1", "--repeats", "1", "--timing-updates", "2", "--out", str(out)])
    assert [c[:2] for c in children.calls] == [["--child", "shared"], ["--child", "shared"], ["--child", "timing"]]
    results = json.loads(out.read_text())["results"]
    shared = results["shared"]
    sep, sh = shared["separate"], shared["shared"]
    assert shared["shape"]["hidden_size"] == 64 and shared["shape"]["num_layers"] == 1
    # the shared design holds one 4-bit base instead of three (the reward and value bases have no LM head)
    assert 0 < sh["weights_mib"] < sep["weights_mib"]
    for r in (sep, sh):
        assert r["s_per_update"] > 0 and r["run_peak_working_set_mib"] > 0 and r["loaded_working_set_mib"] >= 0
    timing = shared["timing"]
    assert finite_positive(timing["ratio_median"], *timing["s_per_update"].values())
    assert 0 < timing["switching_share_median"] < 1  # the shared design switches adapters, within its update
    checks = results["budget"]["checks"]["shared"]
    assert [row[0] for row in checks] == ["separate", "shared"]
    for row in checks:  # weight bytes: formula vs measured (packed 4-bit weights and their absmax, exact counts)
        assert abs(row[3] - 1) < 0.02
        assert row[4] > 0 and row[5] > 0  # run peak: formula, measured
