"""Record TRL 1.12's own PPO runs: the reference trl_ext.PPOTrainer must reproduce on every TRL version.

Run from the repository root in an environment with TRL 1.12 (any TRL that still ships `trl.experimental.ppo`):

    pip install "trl==1.12.*" && python tests/data/make_trl112_ppo_reference.py

It builds the tiny models (`trl_ext.testing`), runs `trl.experimental.ppo.PPOTrainer` on each scenario of
`tests/ppo_reference.py` (same seed, data and settings as the tests) and writes
`tests/data/trl112_ppo_reference.json`: the metrics of every update (but the wall-clock `eps`), the files of
checkpoint-2, the sample-generation tables and the fields of TRL's PPOConfig (defaults and help of the fields TRL
declares). Regenerate it only when a scenario changes; the tests compare against it wherever TRL has no PPO trainer,
and check it against TRL's live runs where it has one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # trl_ext and the tests' shared helpers
for name, value in {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "WANDB_MODE": "offline", "TRL_EXPERIMENTAL_SILENCE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(name, value)

import torch  # noqa: E402

torch.set_num_threads(1)  # as in tests/conftest.py


def main() -> None:
    import accelerate
    import peft
    import transformers
    import trl

    from trl_ext.ppo.base import TRL_HAS_PPO
    from trl_ext.testing import build_tiny_models

    if not TRL_HAS_PPO:
        raise SystemExit(f"TRL {trl.__version__} has no trl.experimental.ppo: run this with trl==1.12.*")
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    from ppo_helpers import left_tokenizer
    from ppo_reference import (
        REFERENCE_PATH,
        SCENARIOS,
        checkpoint_files,
        config_fields,
        plain_logs,
        recorded_sample_tables,
        run_scenario,
        scenario_data,
    )

    scenarios = {}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_tiny_models(Path(tmp) / "tiny")
        tok = left_tokenizer(tiny)
        data = scenario_data(tok)
        for name in SCENARIOS:
            out = Path(tmp) / name
            with recorded_sample_tables() as tables:
                _, logs = run_scenario(PPOTrainer, PPOConfig, name, tiny, tok, data, out)
            scenarios[name] = {"logs": plain_logs(logs), "checkpoint_files": checkpoint_files(out),
                               "sample_tables": tables}
            print(f"{name}: {len(logs)} updates, {len(scenarios[name]['checkpoint_files'])} checkpoint files, "
                  f"{len(tables)} sample tables")
    reference = {
        "generated_by": "tests/data/make_trl112_ppo_reference.py",
        "versions": {"trl": trl.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
                     "peft": peft.__version__, "accelerate": accelerate.__version__},
        "ppo_config": config_fields(PPOConfig),
        "scenarios": scenarios,
    }
    REFERENCE_PATH.write_text(json.dumps(reference, indent=1, sort_keys=True) + "\n")
    print(f"wrote {REFERENCE_PATH.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
