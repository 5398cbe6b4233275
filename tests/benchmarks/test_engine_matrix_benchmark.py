"""benchmarks/engine_matrix.py through its ``main`` on 2 CPU processes with DDP only (``--cpu --engines ""``): one
``accelerate launch`` of tests/engines/engine_script.py (reward, DPO, PPO, PPO resumed, the PPO demo recipe; about
20 s), every run checked and passed, the table and result JSON written. DDP is the matrix's reference; the DeepSpeed
and FSDP launches themselves are tests/engines' (tests/engines/test_engines.py, the same script under the same CPU
configs), not repeated here. Then the matrix's ``check`` on the ranks this launch reported, altered as a broken
engine would leave them: each failure is named."""

from __future__ import annotations

import copy
import json

import pytest
from benchmark_scripts import loaded_script


@pytest.fixture(scope="module")
def ddp(tmp_path_factory):
    """(the result JSON of the DDP-only run, the script's ``check`` and ``ALL_RUNS``)."""
    out = tmp_path_factory.mktemp("engine_matrix") / "matrix.json"
    with loaded_script("engine_matrix") as script:
        assert script.main(["--cpu", "--engines", "", "--out", str(out)]) == 0
        check, runs = script.check, list(script.ALL_RUNS)
    return json.loads(out.read_text()), check, runs


def test_ddp_runs_every_trainer_and_passes(ddp):
    result, _, runs = ddp
    settings = result["meta"]["settings"]
    assert (settings["gpu"], settings["num_processes"], settings["engines"]) == (False, 2, ["ddp"])
    rows = result["results"]["rows"]
    assert [row[:3] for row in rows] == [["ddp", run, "pass"] for run in runs] + [["fsdp", "ppo", "refused"]]
    ranks = result["results"]["engines"]["ddp"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert set(runs) <= set(r)
        assert all(r[run]["world_size"] == 2 and r[run]["distributed_type"] == "MULTI_CPU" for run in runs)
    ppo = ranks[0]["ppo"]
    assert len(ppo["kl"]) == len(ppo["kl_coef"]) == 3 and ppo["kl_coef"][0] == 0.05  # adaptive KL, 3 updates


def as_engine(ranks: list[dict], distributed_type: str) -> list[dict]:
    """The DDP ranks as another engine would report them (the same numbers)."""
    out = copy.deepcopy(ranks)
    for r in out:
        for run in r.values():
            if isinstance(run, dict):
                run["distributed_type"] = distributed_type
    return out


def test_check_names_what_a_broken_engine_run_gets_wrong(ddp):
    result, check, runs = ddp
    ranks = result["results"]["engines"]["ddp"]["ranks"]
    assert all(check("ddp", run, ranks, ranks, 2, 1e-5) == "" for run in runs)
    assert check("ddp", "ppo", ranks[:1], ranks, 2, 1e-5) == "1 of 2 ranks reported this run"
    diverged = copy.deepcopy(ranks)
    diverged[1]["dpo"]["checksum"] = "0" * 64
    assert check("ddp", "dpo", diverged, ranks, 2, 1e-5) == "ranks end with different weights"
    resumed = copy.deepcopy(ranks)
    for r in resumed:
        r["ppo_resumed"]["checksum"] = "1" * 64
    assert check("ddp", "ppo_resumed", resumed, ranks, 2, 1e-5) == ("resumed run ends with other weights than the "
                                                                     "uninterrupted one")
    # ZeRO-2: the same numbers as DDP pass; another distributed type, or a KL off by 1e-3, fails
    zero2 = as_engine(ranks, "DEEPSPEED")
    assert all(check("zero2", run, zero2, ranks, 2, 1e-5) == "" for run in runs)
    assert check("zero2", "reward", ranks, ranks, 2, 1e-5) == "accelerate ran MULTI_CPU, not DEEPSPEED"
    for r in zero2:
        r["ppo"]["kl"][1] += 1e-3
    assert check("zero2", "ppo", zero2, ranks, 2, 1e-5).startswith("kl differs from DDP")
    # ZeRO-3 shards: a rank holding every trainable value did not
    assert check("zero3", "reward", as_engine(ranks, "DEEPSPEED"), ranks, 2, 1e-5) == ("not sharded: a rank holds "
                                                                                        "all trainable values")
