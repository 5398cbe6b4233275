"""Parity with TRL's GRPOTrainer where the math is the same: one batch (log-probs of the tiny policy, old and
reference log-probs, advantages, a mask of unequal lengths) gives the same loss and the same gradients on every
policy weight through TRL's own `GRPOTrainer._compute_loss` and through trl_ext's objective functions.

A real GRPOTrainer is built once on the tiny policy (TRL >= 1.13; TRL 1.12 has an older loss and is skipped). Each
case then sets the attributes TRL's `__init__` copies from `GRPOConfig` (`loss_type`, `epsilon_low/high`,
`importance_sampling_level`, `beta`, `args.delta`, `args.use_bias_correction_kl`), as a trainer built with those
values holds them. Our side takes
the per-token log-probs from TRL's own `_get_per_token_logps_and_entropies` (the same forward) and
:func:`trl_ext.ppo.objectives.objective_terms`. The map of names is in docs/ppo.md.
"""

from __future__ import annotations

import math

import pytest
import torch

trl = pytest.importorskip("trl")
from packaging.version import Version  # noqa: E402

if Version(trl.__version__).release < (1, 13):
    pytest.skip(f"TRL {trl.__version__}: GRPOTrainer's loss types of TRL >= 1.13 are compared", allow_module_level=True)

from trl_ext.ppo.objectives import ObjectiveConfig, objective_terms  # noqa: E402

B, P, T = 4, 3, 6
LENGTHS = [6, 3, 5, 1]
RATIOS = [0.5, 0.75, 0.85, 1.0, 1.1, 1.25, 1.35, 2.0, 5.0, 0.95, 1.5, 0.6]  # beyond and inside both clip edges
ADVANTAGES = [1.5, -0.7, 0.9, -1.2]

# TRL GRPOConfig values -> trl_ext PPOConfig keys (ObjectiveConfig fields), with eps = TRL's epsilon = our cliprange
CASES = {
    "grpo": ({"loss_type": "grpo"}, {"loss_aggregation": "seq_mean_token_mean"}),
    "bnpo": ({"loss_type": "bnpo"}, {"loss_aggregation": "token_mean"}),
    "dr_grpo": ({"loss_type": "dr_grpo"}, {"loss_aggregation": "seq_mean_token_sum_norm"}),
    "dapo": ({"loss_type": "dapo"}, {"loss_aggregation": "global_token_mean"}),
    "cispo": ({"loss_type": "cispo", "epsilon_high": 2.0},
              {"policy_loss": "cispo", "cliprange_high": 1.0, "loss_aggregation": "global_token_mean"}),
    "grpo_sequence": ({"loss_type": "grpo", "importance_sampling_level": "sequence"},
                      {"loss_aggregation": "seq_mean_token_mean", "ratio_level": "sequence"}),
    "bnpo_sequence": ({"loss_type": "bnpo", "importance_sampling_level": "sequence"},
                      {"loss_aggregation": "token_mean", "ratio_level": "sequence"}),
    "dapo_epsilon_high": ({"loss_type": "dapo", "epsilon_high": 0.28},
                          {"loss_aggregation": "global_token_mean", "cliprange_high": 0.28}),
    "grpo_beta": ({"loss_type": "grpo", "beta": 0.04},
                  {"loss_aggregation": "seq_mean_token_mean", "kl_in_loss": True, "loss_kl_estimator": "k3"}),
    "dapo_beta_epsilon_high": ({"loss_type": "dapo", "beta": 0.1, "epsilon_high": 0.28},
                               {"loss_aggregation": "global_token_mean", "kl_in_loss": True, "cliprange_high": 0.28}),
    "grpo_beta_bias_corrected": ({"loss_type": "grpo", "beta": 0.04, "use_bias_correction_kl": True},
                                 {"loss_aggregation": "seq_mean_token_mean", "kl_in_loss": True,
                                  "use_bias_correction_kl": True}),
    "dapo_sequence_beta_bias_corrected": ({"loss_type": "dapo", "beta": 0.1, "importance_sampling_level": "sequence",
                                           "use_bias_correction_kl": True},
                                          {"loss_aggregation": "global_token_mean", "kl_in_loss": True,
                                           "ratio_level": "sequence", "use_bias_correction_kl": True}),
    "bnpo_delta": ({"loss_type": "bnpo", "delta": 1.5}, {"loss_aggregation": "token_mean", "delta": 1.5}),
    # one of 2 accumulated micro-batches; the other holds 9 more tokens: both divide the token sum by all 9 + ours
    "dapo_accumulated": ({"loss_type": "dapo", "accumulation": 2, "other_tokens": 9},
                         {"loss_aggregation": "global_token_mean"}),
}


@pytest.fixture(scope="module")
def grpo(tiny_models, tmp_path_factory):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("grpo")), use_cpu=True, report_to="none", bf16=False,
                      per_device_train_batch_size=B, num_generations=2, max_completion_length=T, beta=0.0,
                      gradient_accumulation_steps=1, epsilon=0.2)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["a b c"] * 8}),
                          processing_class=AutoTokenizer.from_pretrained(tiny_models.tokenizer))
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; 1 = no accumulation
    trainer.model.train()
    return trainer


def batch(trainer, other_tokens=0):
    gen = torch.Generator().manual_seed(1)
    vocab = trainer.model.config.vocab_size
    prompt_ids, completion_ids = torch.randint(3, vocab, (B, P), generator=gen), torch.randint(3, vocab, (B, T),
                                                                                               generator=gen)
    mask = (torch.arange(T).unsqueeze(0) < torch.tensor(LENGTHS).unsqueeze(1)).long()
    input_ids, attention_mask = torch.cat([prompt_ids, completion_ids], 1), torch.cat([torch.ones_like(prompt_ids),
                                                                                        mask], 1)
    with torch.no_grad():
        logps = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, T)[0]
    log_ratios = torch.tensor([math.log(RATIOS[(i * T + t) % len(RATIOS)]) for i in range(B) for t in range(T)],
                              dtype=logps.dtype).view(B, T)
    return {"prompt_ids": prompt_ids, "prompt_mask": torch.ones_like(prompt_ids), "completion_ids": completion_ids,
            "completion_mask": mask, "advantages": torch.tensor(ADVANTAGES, dtype=logps.dtype),
            "old_per_token_logps": logps - log_ratios,
            "ref_per_token_logps": logps + 0.3 * torch.randn(B, T, generator=gen, dtype=logps.dtype),
            "num_items_in_batch": mask.sum() + other_tokens}


def gradients(model):
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def configure(trainer, trl_keys):
    trainer.loss_type = trl_keys.get("loss_type", "grpo")
    trainer.epsilon_low = 0.2
    trainer.epsilon_high = trl_keys.get("epsilon_high", 0.2)
    trainer.importance_sampling_level = trl_keys.get("importance_sampling_level", "token")
    trainer.beta = trl_keys.get("beta", 0.0)
    trainer.args.delta = trl_keys.get("delta")
    # TRL 1.16's default is True (the KL term times the ratio); GRPO's plain term, and our default, is False
    trainer.args.use_bias_correction_kl = trl_keys.get("use_bias_correction_kl", False)
    trainer.current_gradient_accumulation_steps = trainer.args.steps_per_generation = trl_keys.get("accumulation", 1)


def ours(trainer, inputs, keys, beta, accumulation=1):
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, T)[0]
    mask = inputs["completion_mask"].bool()
    cfg = ObjectiveConfig(**{"cliprange_low": 0.2, "cliprange_high": 0.2, "response_length": T, **keys})
    # global_token_normalizer's N / (G * P), one process
    normalizer = inputs["num_items_in_batch"].float() / accumulation
    advantages = inputs["advantages"].unsqueeze(1).expand(B, T)
    terms = objective_terms(cfg, logps, inputs["old_per_token_logps"], advantages, mask,
                            inputs["ref_per_token_logps"], beta, token_normalizer=normalizer)
    loss = terms.policy.loss if terms.penalty is None else terms.policy.loss + terms.penalty
    return loss / accumulation  # what accelerate's backward divides by (TRL divides inside its loss)


@pytest.mark.parametrize("case", list(CASES))
def test_same_loss_and_gradients_as_trl_grpo(grpo, case):
    trl_keys, our_keys = CASES[case]
    configure(grpo, trl_keys)
    inputs = batch(grpo, trl_keys.get("other_tokens", 0))
    trl_loss = grpo._compute_loss(grpo.model, inputs)
    trl_loss.backward()
    trl_grads = gradients(grpo.model)
    our_loss = ours(grpo, inputs, our_keys, trl_keys.get("beta", 0.0), trl_keys.get("accumulation", 1))
    our_loss.backward()
    our_grads = gradients(grpo.model)
    assert abs(trl_loss.item() - our_loss.item()) < 1e-6, (trl_loss.item(), our_loss.item())
    assert trl_grads.keys() == our_grads.keys() and len(trl_grads) > 5
    worst = max((trl_grads[n] - our_grads[n]).abs().max().item() for n in trl_grads)
    assert worst < 1e-6, worst
    assert max(g.abs().max().item() for g in trl_grads.values()) > 1e-3  # the gradients are not all ~0
