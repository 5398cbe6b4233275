"""benchmarks/ppo_overhead.py and ppo_scaling.py through their ``main`` on a policy of hidden size 32, one layer,
4 episodes of 4 tokens per update, 2 updates (one timed), one repeat: every configuration and every setting runs,
and the result JSON holds its row with positive, finite times. No assertion on which is faster."""

from __future__ import annotations

import json
import math

from benchmark_scripts import in_process_children, loaded_script

TINY = ["--repeats", "1", "--updates", "2", "--batch", "4", "--response-length", "4", "--hidden", "32",
        "--layers", "1"]


def finite_positive(*values) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


def test_ppo_overhead_every_configuration_with_its_memory_child(tmp_path, monkeypatch):
    """(a), (b), (c) against the baseline, then each configuration's memory child (its ``--child`` code, here in
    this process). With every extension at its default, (a) logs exactly the baseline's numbers."""
    out = tmp_path / "overhead.json"
    with loaded_script("ppo_overhead") as script:
        children = in_process_children(script)
        monkeypatch.setattr(script, "run_child", children)
        script.main([*TINY, "--out", str(out)])
        configs = list(script.CONFIGS)
    result = json.loads(out.read_text())
    assert result["a_logs_identical"] is True
    assert [r["config"] for r in result["results"]] == ["a_defaults", "b_adaptive_kl_value_mean", "c_ptx_joint"]
    for r in result["results"]:
        assert len(r["ratios"]) == 1 and len(r["ext_total_s"]) == 1 == len(r["trl_total_s"])
        assert finite_positive(r["ext_update_s"], r["trl_update_s"], r["ratio_median"])
    assert math.isfinite(result["ptx"]["share_of_update_median"])
    assert 0 < result["ptx"]["ptx_forward_share_median"] < 1  # the ptx forward passes are part of (c)'s update
    # one child per configuration, with the run's sizes passed on
    assert [c[:2] for c in children.calls] == [["--child", name] for name in configs]
    assert all(c[c.index("--hidden") + 1] == "32" and c[c.index("--updates") + 1] == "2" for c in children.calls)
    assert [m["config"] for m in result["memory"]] == configs
    for m in result["memory"]:
        assert m["peak_rss_mb"] >= m["rss_before_train_mb"] > 0 and m["train_peak_growth_mb"] >= 0
    assert result["memory"][0]["growth_ratio_vs_trl"] in (1.0, None)  # None: no growth of the peak to divide by


def test_ppo_scaling_every_setting(tmp_path):
    """The base, response length x2 and x4, batch x2 and x4: each with its phases' times."""
    out = tmp_path / "scaling.json"
    with loaded_script("ppo_scaling") as script:
        script.main([*TINY, "--out", str(out)])
        phases = script.PHASES
    result = json.loads(out.read_text())
    rows = {r["setting"]: r for r in result["results"]}
    sizes = {"base": (4, 4), "response x2": (4, 8), "response x4": (4, 16), "batch x2": (8, 4), "batch x4": (16, 4)}
    assert list(rows) == list(sizes)
    for name, (batch, length) in sizes.items():
        r = rows[name]
        assert (r["batch"], r["response_length"]) == (batch, length) and len(r["runs"]) == 1
        assert finite_positive(r["update_s"], *(r[f"{p}_s"] for p in phases), r["update_growth"])
        assert all(finite_positive(r[f"{p}_growth"]) for p in phases)
        assert math.isfinite(r["other_s"]) and r["gc_per_update_s"] >= 0
        # the phases are parts of the update
        assert sum(r[f"{p}_s"] for p in phases) <= r["update_s"] * 1.001
        assert (r["update_exponent"] is None) == (name == "base")
    assert rows["base"]["update_growth"] == 1.0
    assert sorted(result["shares"]) == sorted(sizes)
