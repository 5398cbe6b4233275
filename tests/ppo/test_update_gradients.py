"""What the PPO update keeps whatever its micro-batches: for every ptx mode (off, joint, separate), every loss
aggregation and a mini-batch of 4 sequences cut into passes of 1, 3 + 1 or 4, each optimizer step's gradients are
those of the whole mini-batch in one pass as TRL computes it (train_micro_batch_size unset, one micro-batch of 4;
within float rounding), and the joint ptx term adds exactly
``ptx_coef * grad lm_loss`` of its batch. The gradients are read where the trainer steps (its overridable
``optimizer_step``), before any clipping, on the real trainer and tiny models; they pin the update while its parts
move (issue 58)."""

from __future__ import annotations

import pytest
import torch

from ppo_helpers import config_kwargs, load_models, prompt_dataset, seed_all

# one update of one mini-batch of 4 (per_device_train_batch_size 2 x gradient_accumulation_steps 2), one PPO epoch:
# one PPO optimizer step (and, in separate ptx mode, the ptx step after it)
SETTINGS = dict(total_episodes=4, num_ppo_epochs=1, num_sample_generations=0)
PTX = dict(ptx_coef=0.7, ptx_batch_size=2, ptx_max_length=12)
AGGREGATIONS = ["token_mean", "global_token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
PTX_TEXT = "the quick brown fox jumps over the lazy dog and runs"
TOLERANCE = 1e-6


def ptx_rows():
    """Eight copies of one text: every ptx batch is the same, so one ptx batch per pass is the same data as one for
    the whole mini-batch (the one-big-batch update is well defined)."""
    from datasets import Dataset

    return Dataset.from_dict({"text": [PTX_TEXT] * 8})


def step_gradients(tiny_models, tok, tmp_path, *, micro, ptx, aggregation, **more):
    """``(gradients of each optimizer step, trainer)`` of one update: per step, each trainable parameter's gradient
    (None where it has none) as the trainer's ``optimizer_step`` sees it."""
    import trl_ext

    class Recording(trl_ext.PPOTrainer):
        def optimizer_step(self):
            model = self.accelerator.unwrap_model(self.model)
            self.recorded.append({n: None if p.grad is None else p.grad.detach().clone()
                                  for n, p in model.named_parameters() if p.requires_grad})
            return super().optimizer_step()

    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    overrides = {**SETTINGS, "loss_aggregation": aggregation, "train_micro_batch_size": micro, **more}
    if ptx is not None:
        overrides.update(PTX, ptx_mode=ptx)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, **overrides))
    trainer = Recording(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                        value_model=value, train_dataset=prompt_dataset(tok),
                        ptx_dataset=ptx_rows() if ptx is not None else None)
    trainer.recorded = []
    trainer.train()
    return trainer.recorded, trainer


def largest_difference(a: list[dict], b: list[dict]) -> float:
    assert len(a) == len(b) and all(x.keys() == y.keys() for x, y in zip(a, b))
    worst = 0.0
    for x, y in zip(a, b):
        for name in x:
            assert (x[name] is None) == (y[name] is None), name
            if x[name] is not None:
                worst = max(worst, (x[name] - y[name]).abs().max().item())
    return worst


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("ptx", [None, "joint", "separate"])
def test_every_cut_of_the_mini_batch_gives_the_gradients_of_one_pass(tiny_models, tok, tmp_path, ptx, aggregation):
    whole, trainer = step_gradients(tiny_models, tok, tmp_path / "whole", micro=4, ptx=ptx, aggregation=aggregation)
    assert len(whole) == (2 if ptx == "separate" else 1)  # the PPO step (and the separate ptx step)
    assert trainer.state.global_step == 1
    assert max(g.abs().max().item() for g in whole[0].values() if g is not None) > 1e-3  # real gradients
    # the whole mini-batch as TRL computes it: train_micro_batch_size unset, one pass of 4 (nothing weighted)
    one, _ = step_gradients(tiny_models, tok, tmp_path / "trl", micro=None, ptx=ptx, aggregation=aggregation,
                            per_device_train_batch_size=4, gradient_accumulation_steps=1)
    assert largest_difference(one, whole) < TOLERANCE, f"ptx {ptx}, {aggregation}: weighted pass of 4 vs TRL's"
    for micro in (1, 3):
        cut, cut_trainer = step_gradients(tiny_models, tok, tmp_path / f"micro{micro}", micro=micro, ptx=ptx,
                                          aggregation=aggregation)
        assert cut_trainer.train_micro_batch == micro
        difference = largest_difference(cut, whole)
        assert difference < TOLERANCE, f"ptx {ptx}, {aggregation}, passes of {micro}: {difference:.3g}"


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_the_joint_ptx_term_is_ptx_coef_times_the_gradient_of_its_lm_loss(tiny_models, tok, tmp_path, aggregation):
    """Joint ptx minus no ptx, in passes of 1 (four ptx batches, each weighted 1/4) and of 4 (one ptx batch):
    ``ptx_coef * grad lm_loss`` of the ptx batch on the policy, nothing on the value model."""
    from trl_ext.ppo.ptx_data import PretrainingMix

    seed_all(0)
    policy, _, _ = load_models(tiny_models)
    batch = tok([PTX_TEXT] * PTX["ptx_batch_size"], truncation=True, max_length=PTX["ptx_max_length"],
                return_tensors="pt")
    (PTX["ptx_coef"] * PretrainingMix.lm_loss(policy, dict(batch), torch.device("cpu"))).backward()
    expected = {f"policy.{n}": p.grad for n, p in policy.named_parameters()}
    for micro in (1, 4):
        off, _ = step_gradients(tiny_models, tok, tmp_path / f"off{micro}", micro=micro, ptx=None,
                                aggregation=aggregation)
        joint, _ = step_gradients(tiny_models, tok, tmp_path / f"joint{micro}", micro=micro, ptx="joint",
                                  aggregation=aggregation)
        (off,), (joint,) = off, joint
        for name, grad in joint.items():
            added = grad - off[name]
            if name in expected:
                assert torch.allclose(added, expected[name], atol=TOLERANCE), (micro, name)
            else:  # the value model's parameters
                assert added.abs().max().item() < TOLERANCE, (micro, name)
        assert any(g.abs().max().item() > 1e-3 for g in expected.values())
