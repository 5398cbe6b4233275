"""benchmarks/ppo_memory.py's budget part through its ``main``: the memory budget tables of
``trl_ext.ppo.rollout.memory_budget`` for Llama-3-8B and Qwen2.5-7B at the 0.5B recipe's settings and two fitting
ones, each design against the shared base with streamed log-probs. (Its rollout and shared parts measure peak RSS
in child processes on a model with Qwen2.5's 151,936-token vocabulary: not run here.)"""

from __future__ import annotations

import json

from benchmark_scripts import loaded_script


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
        assert row(table, "part") == ["Llama-3-8B, today: separate models, TRL rollout",
                                      "Llama-3-8B, shared base, streamed log-probs",
                                      "Qwen2.5-7B, today: separate models, TRL rollout",
                                      "Qwen2.5-7B, shared base, streamed log-probs"]
        weights = [float(x) for x in row(table, "base weights")]
        logprobs = [float(x) for x in row(table, "rollout: log-probs")]
        for separate, shared in ((0, 1), (2, 3)):  # one base for the three models; no (batch, length, vocab) tensor
            assert 0 < weights[shared] < weights[separate] and 0 < logprobs[shared] < logprobs[separate]
        assert all(cell.startswith("**") and "(" in cell for cell in row(table, "**peak** = all run + largest "
                                                                                "phase + overhead"))
        assert set(row(table, "fits 24 GiB?")) <= {"yes", "no"}
