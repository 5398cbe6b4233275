"""Two CPU processes (gloo): a LoRA-policy PPO run with the extensions on finishes, where TRL's crashes."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_lora_policy_ppo_under_ddp_with_ptx_and_adaptive_kl(tiny_models, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    # ptx_mode="separate" also exercises the hand-made gradient all-reduce of the separate ptx step
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "tests" / "ppo" / "ppo_ddp_script.py"), str(tiny_models.root), str(tmp_path), "separate"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    # both ranks end with identical weights and the same KL coefficient (the KL is averaged over processes)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert ranks[0]["kl_coef"] == ranks[1]["kl_coef"] and ranks[0]["kl_coef"][0] == 0.05
    assert ranks[0]["kl_coef"][1] != 0.05  # adaptive controller moved it
    assert len(ranks[0]["ptx_losses"]) == 2
