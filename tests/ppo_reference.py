"""TRL 1.12's own PPO runs that trl_ext.PPOTrainer must reproduce on every TRL version.

SCENARIOS are small PPO runs on the tiny models (full policy, LoRA policy, LoRA policy with a reference adapter, an
epoch's end under gradient accumulation). `tests/data/make_trl112_ppo_reference.py` runs TRL 1.12's
`trl.experimental.ppo.PPOTrainer` on each and records, in REFERENCE_PATH, the metrics of every update, the files of
its checkpoint, its sample-generation tables and the fields of its PPOConfig. :func:`parent_run` gives the parent's
run to compare against: TRL's trainer run live where the installed TRL ships it (TRL <= 1.12), else the recording.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import typing
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from trl_ext.recipe_loader.argv import plain  # a YAML/JSON-safe copy of a value

from ppo_helpers import config_kwargs, load_models, prompt_dataset, seed_all, update_logs

REFERENCE_PATH = Path(__file__).resolve().parent / "data" / "trl112_ppo_reference.json"
REGENERATE = 'python tests/data/make_trl112_ppo_reference.py  (in an environment with trl==1.12.*)'
EXCLUDED = ("eps",)  # wall-clock episodes per second
REFERENCE_TOLERANCE = 1e-5  # against the recording (another process, maybe another TRL)
LIVE_TOLERANCE = 1e-6  # against TRL's trainer run here and now
# Metrics that sum, over a response's tokens, a difference of two log-probs: the KL estimate `objective/kl` and the
# KL penalty `objective/non_score_reward` (-kl_coef x kl; TRL's default kl_coef 0.05, which no scenario changes).
# Each term is a difference of two log-probs of size |log p|, so float32 rounding shows at the scale of the summed
# |log p|, about `objective/entropy` (~47 here), not at the scale of the small difference. And that rounding
# differs between machines (torch picks CPU kernels by instruction set): TRL 1.12's own trainer, run on another
# machine of this project's kind, differed from the recording by up to 5.3e-5 in `objective/kl` (1.1e-6 of
# `objective/entropy`) while every other metric stayed within 1e-5 of it. Against the recording, these two metrics
# get an absolute tolerance of REFERENCE_TOLERANCE x factor x objective/entropy.
KL_SUMS = {"objective/kl": 1.0, "objective/non_score_reward": 0.05}
CHECKPOINT_STEP = 2


def lora_config(**kwargs):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], **kwargs)


def with_ref_adapter(policy):
    """A PeftModel policy with a trained-looking `default` adapter and a different `ref` adapter."""
    from peft import get_peft_model

    torch.manual_seed(5)
    model = get_peft_model(policy, lora_config(init_lora_weights=False))
    model.add_adapter("ref", lora_config(init_lora_weights=False))
    return model


SAVE = dict(save_strategy="steps", save_steps=CHECKPOINT_STEP)
SCENARIOS = {
    # 3 updates of 4 episodes (2 prompts x 2 accumulation steps), 2 PPO epochs, sample generations after updates 1, 2
    "full": dict(overrides=SAVE),
    "lora": dict(peft=True, overrides=SAVE),
    # reference = the policy with its `ref` adapter active
    "ref_adapter": dict(wrap_policy=with_ref_adapter,
                        overrides=dict(model_adapter_name="default", ref_adapter_name="ref")),
    # 4 updates of 4 prompts: the 4th takes the epoch's last batch (no gradient accumulation there, as in TRL)
    "epoch_end": dict(overrides=dict(total_episodes=16, num_sample_generations=0)),
}


def scenario_data(tok):
    """(train prompts, eval prompts) of every scenario."""
    return prompt_dataset(tok), prompt_dataset(tok, n=4, seed=5)


def run_scenario(trainer_cls, config_cls, name, tiny_models, tok, data, output_dir, overrides=None, **extra):
    """Run scenario `name` with `trainer_cls`/`config_cls` (TRL's or trl_ext's): (trainer, per-update logs).
    `overrides`: config keys over the scenario's; `extra`: trainer arguments."""
    scenario = SCENARIOS[name]
    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    if scenario.get("wrap_policy"):
        policy = scenario["wrap_policy"](policy)
    trainer = trainer_cls(
        args=config_cls(**config_kwargs(output_dir, **{**scenario.get("overrides", {}), **(overrides or {})})),
        processing_class=tok,
        model=policy,
        ref_model=None,
        reward_model=reward,
        train_dataset=data[0],
        value_model=value,
        eval_dataset=data[1],
        peft_config=lora_config() if scenario.get("peft") else None,
        **extra,
    )
    trainer.train()
    return trainer, update_logs(trainer)


def checkpoint_files(output_dir) -> list[str]:
    """Relative paths of the files of `output_dir/checkpoint-CHECKPOINT_STEP` (empty if there is none)."""
    root = Path(output_dir) / f"checkpoint-{CHECKPOINT_STEP}"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.is_dir() else []


def plain_logs(logs: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k not in EXCLUDED} for entry in logs]


def table_records(table) -> list[dict]:
    return [{k: (float(v) if k == "score" else v) for k, v in row.items()} for row in table.to_dict("records")]


def _field_default(f):
    if f.default is not dataclasses.MISSING:
        return plain(f.default)
    if f.default_factory is not dataclasses.MISSING:
        return plain(f.default_factory())
    return None


def config_fields(config_cls) -> dict:
    """Every field name of `config_cls`, and default, type and help of the fields it does not inherit unchanged
    from transformers' TrainingArguments."""
    from transformers import TrainingArguments

    hf = {f.name: f for f in dataclasses.fields(TrainingArguments)}
    types = typing.get_type_hints(config_cls)
    declared = {}
    for f in dataclasses.fields(config_cls):
        if f.name in hf and _field_default(hf[f.name]) == _field_default(f):
            continue
        declared[f.name] = {"default": _field_default(f), "type": str(types[f.name]), "help": f.metadata.get("help")}
    return {"names": [f.name for f in dataclasses.fields(config_cls)], "declared": declared}


@contextmanager
def recorded_sample_tables():
    """Record the sample-generation tables `generate_completions` prints (TRL's and trl-ext's PPO base print them
    with a module-level `print_rich_table`), as lists of row dicts, in call order."""
    tables = []
    modules = [sys.modules[name] for name in ("trl.experimental.ppo.ppo_trainer", "trl_ext.ppo.base.base_trainer")
               if name in sys.modules]
    with pytest.MonkeyPatch.context() as patch:
        for module in modules:
            patch.setattr(module, "print_rich_table", lambda df: tables.append(table_records(df)))
        yield tables


@dataclass
class ParentRun:
    """TRL 1.12's PPO on one scenario: live (this TRL ships it) or recorded (REFERENCE_PATH)."""

    logs: list[dict]
    checkpoint_files: list[str]
    sample_tables: list[list[dict]]
    live: bool
    tolerance: float = field(init=False)

    def __post_init__(self):
        self.tolerance = LIVE_TOLERANCE if self.live else REFERENCE_TOLERANCE


def reference() -> dict:
    """The recording of TRL 1.12's runs (see `tests/data/make_trl112_ppo_reference.py`)."""
    return json.loads(REFERENCE_PATH.read_text())


def parent_run(name, tiny_models, tok, data, output_dir) -> ParentRun:
    """TRL's own PPOTrainer on scenario `name`, run live where TRL ships it; else TRL 1.12's recorded run."""
    from trl_ext.ppo.base import TRL_HAS_PPO

    if TRL_HAS_PPO:
        from trl.experimental.ppo import PPOConfig, PPOTrainer

        with recorded_sample_tables() as tables:
            _, logs = run_scenario(PPOTrainer, PPOConfig, name, tiny_models, tok, data, output_dir)
        return ParentRun(plain_logs(logs), checkpoint_files(output_dir), tables, live=True)
    recorded = reference()["scenarios"][name]
    return ParentRun(recorded["logs"], recorded["checkpoint_files"], recorded["sample_tables"], live=False)


def assert_same_logs(parent: list[dict], child: list[dict], tolerance: float, what: str = "",
                     recorded: bool = False) -> None:
    """Every metric TRL logs (but `eps`) equal, update by update, to `tolerance` (absolute and relative).

    `recorded`: one side is the recording, made on another machine. Then the metrics in KL_SUMS get their absolute
    tolerance on the scale they are computed at (see KL_SUMS), not on their own, often near-zero, value.
    """
    assert len(child) == len(parent), (what, len(child), len(parent))
    for p, c in zip(parent, child):
        for key, value in p.items():
            if key in EXCLUDED:
                continue
            assert key in c, (what, p["step"], key)
            abs_tolerance = tolerance * KL_SUMS[key] * abs(p["objective/entropy"]) if recorded and key in KL_SUMS \
                else tolerance
            assert c[key] == pytest.approx(value, abs=abs_tolerance, rel=tolerance), \
                (what, p["step"], key, c[key], value)


def assert_same_tables(parent: list[list[dict]], child: list[list[dict]], tolerance: float) -> None:
    assert len(child) == len(parent)
    for parent_table, child_table in zip(parent, child):
        assert [{k: v for k, v in row.items() if k != "score"} for row in child_table] == [
            {k: v for k, v in row.items() if k != "score"} for row in parent_table
        ]
        for p, c in zip(parent_table, child_table):
            assert math.isclose(c["score"], p["score"], abs_tol=tolerance, rel_tol=tolerance), (c, p)
