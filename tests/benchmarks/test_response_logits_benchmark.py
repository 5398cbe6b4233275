"""benchmarks/response_logits.py through its ``main`` with ``--quick``, each child's code in this process (its peak RSS
is then this process's: only checked to be measured): every way and phase runs, the ways' log-probs agree (the
checksum of the masked log-probs), and the logits each holds by the budget's rule are the response positions'
(one slice) for trl_ext and every position's for the others; TRL 1.12's way only where TRL 1.12 is installed."""

from __future__ import annotations

import json
import math

import pytest

from benchmark_scripts import in_process_children, loaded_script


def test_every_way_and_phase_and_their_log_probs_agree(tmp_path):
    out = tmp_path / "logits.json"
    with loaded_script("response_logits") as script:
        script.run_child = in_process_children(script)
        script.main(["--quick", "--out", str(out)])
        trl112 = script.trl112_importable()
    results = json.loads(out.read_text())["results"]
    ways = ("trl_ext", "full_logits") + (("trl112",) if trl112 else ())
    assert [(r["phase"], r["way"]) for r in results] == [(p, w) for p in ("scoring", "update") for w in ways]
    for phase in ("scoring", "update"):
        rows = {r["way"]: r for r in results if r["phase"] == phase}
        checksums = [r["checksum"] for r in rows.values()]
        assert all(math.isfinite(c) and c < 0 for c in checksums)
        assert checksums == pytest.approx([checksums[0]] * len(checksums), abs=1e-3)
        assert all(math.isfinite(r["growth_mib"]) for r in rows.values())
    # --quick: vocabulary 4096, prompts 64, responses 8, 4 sequences scored, micro-batch 2 (float32 logits)
    logits = {(r["phase"], r["way"]): r["logits_mib"] * 2**20 for r in results}
    assert logits["scoring", "trl_ext"] == 4 * 9 * 4096 * 4 and logits["scoring", "full_logits"] == 4 * 72 * 4096 * 4
    assert logits["update", "trl_ext"] == 3 * 2 * 9 * 4096 * 4  # LOGIT_COPIES x micro-batch x positions x vocab
    assert logits["update", "full_logits"] == 3 * 2 * 72 * 4096 * 4
