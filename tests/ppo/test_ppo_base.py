"""trl-ext's own PPO base (what trl_ext.PPOTrainer extends from TRL 1.13 on) against TRL 1.12's, and the choice.

Where the installed TRL still ships `trl.experimental.ppo` (1.10-1.12), the own base is built next to TRL's trainer
on the same inputs and compared attribute by attribute, and the PPO parity tests run once more on top of it in a
child process (TRL_EXT_PPO_BASE=trl-ext). From TRL 1.13 on the own base is the default, so the whole suite runs on it
and the parity tests compare with the recorded TRL 1.12 runs (tests/ppo_reference.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ppo_helpers import config_kwargs, left_tokenizer, load_models, seed_all
from ppo_reference import config_fields, lora_config, recorded_sample_tables, reference, scenario_data

ROOT = Path(__file__).resolve().parents[2]


def trl_ppo_or_skip():
    from trl_ext.ppo.base import TRL_HAS_PPO

    if not TRL_HAS_PPO:
        import trl

        pytest.skip(f"TRL {trl.__version__} has no trl.experimental.ppo to compare with live (the suite's PPO "
                    "parity tests compare with its recorded runs instead)")
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    return PPOTrainer, PPOConfig


@pytest.mark.parametrize(
    "setting, trl_has_ppo, expected",
    [(None, True, "trl"), (None, False, "trl-ext"), ("auto", False, "trl-ext"), ("trl-ext", True, "trl-ext"),
     ("TRL", True, "trl"), ("trl", False, "error"), ("fork", True, "error")],
)
def test_base_follows_the_installed_trl_unless_overridden(monkeypatch, setting, trl_has_ppo, expected):
    from trl_ext.ppo import base

    monkeypatch.setattr(base, "TRL_HAS_PPO", trl_has_ppo)
    if setting is None:
        monkeypatch.delenv(base.PPO_BASE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(base.PPO_BASE_VARIABLE, setting)
    if expected == "error":
        with pytest.raises(ImportError, match=base.PPO_BASE_VARIABLE):
            base._choose_base()
    else:
        assert base._choose_base() == expected


def test_own_config_has_trl_1_12s_fields_defaults_and_help():
    """Every field of TRL 1.12's PPOConfig, in order; the same default, type and help for every field TRL declares
    (PPO's own and TRL's changes to TrainingArguments' defaults, e.g. learning_rate 3e-6, logging_steps 10)."""
    from trl_ext.ppo.base.base_config import PPOBaseConfig

    ours = config_fields(PPOBaseConfig)
    recorded = reference()["ppo_config"]
    assert ours == recorded
    assert recorded["declared"]["learning_rate"]["default"] == 3e-6 and len(recorded["declared"]) >= 30
    from trl_ext.ppo.base import TRL_HAS_PPO

    if TRL_HAS_PPO:
        from trl.experimental.ppo import PPOConfig

        assert config_fields(PPOConfig) == recorded


def test_own_helpers_equal_trls():
    """trl-ext's sequence and masked-statistics helpers give TRL 1.12's results bit for bit."""
    trl_ppo_or_skip()
    from trl.experimental.ppo import ppo_trainer as trl_ppo
    from trl.experimental.utils import first_true_indices as trl_first_true_indices

    from trl_ext.ppo.objective import masked_stats
    from trl_ext.ppo.rollout import sequences

    gen = torch.Generator().manual_seed(0)
    responses = torch.randint(0, 6, (5, 9), generator=gen)
    responses[2] = 5  # a row without the stop token 0
    values = torch.randn(5, 9, generator=gen)
    mask = torch.rand(5, 9, generator=gen) > 0.3
    for stop in (0, 3):
        assert torch.equal(sequences.first_true_indices(responses == stop), trl_first_true_indices(responses == stop))
        assert torch.equal(sequences.truncate_response(stop, 7, responses), trl_ppo.truncate_response(stop, 7, responses))
    assert torch.equal(masked_stats.masked_mean(values, mask), trl_ppo.masked_mean(values, mask))
    assert torch.equal(masked_stats.masked_mean(values, mask, axis=1), trl_ppo.masked_mean(values, mask, axis=1))
    assert torch.equal(masked_stats.masked_var(values, mask), trl_ppo.masked_var(values, mask))
    for shift in (True, False):
        assert torch.equal(masked_stats.masked_whiten(values, mask, shift), trl_ppo.masked_whiten(values, mask, shift))
    assert sequences.INVALID_LOGPROB == trl_ppo.INVALID_LOGPROB


def build(trainer_cls, config_cls, variant, tiny_models, tok, data, output_dir):
    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    trainer = trainer_cls(
        args=config_cls(**config_kwargs(output_dir, total_episodes=16)), processing_class=tok, model=policy,
        ref_model=None, reward_model=reward, train_dataset=data[0], value_model=value, eval_dataset=data[1],
        peft_config=lora_config() if variant == "lora" else None,
    )
    return trainer, torch.get_rng_state()


def trainable(trainer):
    return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("variant", ["full", "lora"])
def test_own_base_builds_what_trls_builds(tiny_models, tmp_path, variant):
    """Constructor (derived batch sizes, seeds, reference model, wrapped models, optimizer, scheduler, callbacks,
    state, DataLoaders), sample generations, save_model and model card of the own base equal TRL 1.12's, live."""
    import safetensors.torch

    from trl_ext.ppo.base.base_config import PPOBaseConfig
    from trl_ext.ppo.base.base_trainer import PPOBaseTrainer

    TRLTrainer, TRLConfig = trl_ppo_or_skip()
    tok = left_tokenizer(tiny_models)
    data = scenario_data(tok)
    theirs, their_rng = build(TRLTrainer, TRLConfig, variant, tiny_models, tok, data, tmp_path / "trl" / "out")
    ours, our_rng = build(PPOBaseTrainer, PPOBaseConfig, variant, tiny_models, tok, data, tmp_path / "own" / "out")
    assert torch.equal(their_rng, our_rng)  # same RNG draws (LoRA init, seeding around the DataLoader)

    skip = {"output_dir", "logging_dir", "run_name"}
    assert {k: v for k, v in ours.args.to_dict().items() if k not in skip} == {
        k: v for k, v in theirs.args.to_dict().items() if k not in skip
    }
    assert (ours.args.batch_size, ours.args.num_total_batches, ours.args.local_mini_batch_size) == (4, 4, 4)
    for name in ("stop_token_id", "local_seed", "sample_generations_freq", "local_dataloader_batch_size",
                 "train_dataset_len", "is_peft_model", "model_adapter_name", "ref_adapter_name",
                 "is_deepspeed_enabled", "is_fsdp_enabled", "hub_model_id", "_tag_names", "_name", "_paper"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.policy_model.generation_config.eos_token_id == tok.eos_token_id
    assert type(ours.model).__name__ == type(theirs.model).__name__ == "PolicyAndValueWrapper"
    mine, reference_weights = trainable(ours), trainable(theirs)
    assert mine.keys() == reference_weights.keys() and all(torch.equal(mine[k], reference_weights[k]) for k in mine)
    if variant == "lora":
        assert ours.ref_model is None and theirs.ref_model is None
    else:  # a frozen copy of the policy
        assert not ours.ref_model.training and not any(p.requires_grad for p in ours.ref_model.parameters())
        policy = dict(ours.model.policy.named_parameters())
        assert all(torch.equal(p, policy[n]) for n, p in ours.ref_model.named_parameters())
        assert ours.ref_model is not ours.model.policy

    # optimizer, scheduler, callbacks, state
    assert type(ours.optimizer.optimizer) is type(theirs.optimizer.optimizer)
    groups = [[{k: v for k, v in g.items() if k != "params"} for g in t.optimizer.param_groups] for t in (ours, theirs)]
    assert groups[0] == groups[1]
    assert [[p.shape for p in g["params"]] for g in ours.optimizer.param_groups] == [
        [p.shape for p in g["params"]] for g in theirs.optimizer.param_groups
    ]
    assert type(ours.lr_scheduler) is type(theirs.lr_scheduler)
    assert ours.lr_scheduler.get_last_lr() == theirs.lr_scheduler.get_last_lr()
    names = [[type(cb).__name__ for cb in t.callback_handler.callbacks] for t in (ours, theirs)]
    assert names[0] == names[1]
    assert (ours.state.episode, ours.state.global_step) == (theirs.state.episode, theirs.state.global_step) == (0, 0)
    assert [type(cb).__name__ for cb in ours.state.stateful_callbacks] == [
        type(cb).__name__ for cb in theirs.state.stateful_callbacks
    ]

    # DataLoaders: the same shuffled prompt batches, the same eval batches
    def batches(loader, n):
        torch.manual_seed(123)
        out = []
        for batch in loader:
            out.append(batch["input_ids"])
            if len(out) == n:
                return out
        return out

    for name, n in (("dataloader", 4), ("eval_dataloader", 2)):
        ours_b, theirs_b = batches(getattr(ours, name), n), batches(getattr(theirs, name), n)
        assert len(ours_b) == len(theirs_b) == n and all(torch.equal(a, b) for a, b in zip(ours_b, theirs_b))

    # sample generations: the whole eval set (2 batches of 2), same text and scores
    tables = []
    for trainer in (theirs, ours):
        torch.manual_seed(7)
        with recorded_sample_tables() as recorded:
            trainer.generate_completions()
        tables.append(recorded)
    assert len(tables[0]) == len(tables[1]) == 1 and len(tables[0][0]) == 4
    for a, b in zip(tables[0][0], tables[1][0]):
        assert a["query"] == b["query"] and a["model response"] == b["model response"]
        assert b["score"] == pytest.approx(a["score"], abs=1e-6)

    # save_model: the policy alone, same files and weights; the model card written with each checkpoint
    for trainer in (theirs, ours):
        trainer.save_model(str(Path(trainer.args.output_dir) / "final"))
        trainer.create_model_card(model_name="out")
    saved = [Path(t.args.output_dir) / "final" for t in (theirs, ours)]
    assert sorted(p.name for p in saved[0].iterdir()) == sorted(p.name for p in saved[1].iterdir())
    weights = "adapter_model.safetensors" if variant == "lora" else "model.safetensors"
    a, b = (safetensors.torch.load_file(p / weights) for p in saved)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    cards = [(Path(t.args.output_dir) / "README.md").read_text() for t in (theirs, ours)]
    assert cards[0] == cards[1] and "PPO" in cards[0]


def test_ppo_parity_tests_pass_on_the_own_base_under_this_trl():
    """On TRL 1.10-1.12, run the PPO parity tests again with TRL_EXT_PPO_BASE=trl-ext: trl-ext's own base against
    TRL's live trainer, to 1e-6, for a full policy, a LoRA policy and a reference adapter."""
    trl_ppo_or_skip()
    from trl_ext.ppo.base import PPO_BASE

    if PPO_BASE != "trl":
        pytest.skip("already running on trl-ext's own base")
    env = {**os.environ, "TRL_EXT_PPO_BASE": "trl-ext",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    tests = ["tests/ppo/test_ppo_trainer.py::test_defaults_reproduce_trl_metrics",
             "tests/test_package.py::test_exports_are_subclasses_of_their_parents"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", *tests],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4 passed" in proc.stdout, proc.stdout[-1000:]
