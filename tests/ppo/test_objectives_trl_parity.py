"""Parity with TRL's GRPOTrainer where the math is the same: one batch (log-probs of the tiny policy, old and
reference log-probs, advantages, a mask of unequal lengths) gives the same loss and the same gradients on every
policy weight through TRL's own `GRPOTrainer._compute_loss` and through trl_ext's objective functions.

A real GRPOTrainer is built once on the tiny policy (TRL >= 1.13; TRL 1.12 has an older loss and is skipped). Each
case then sets the attributes TRL's `__init__` copies from `GRPOConfig` (`loss_type`, `epsilon_low/high`,
`importance_sampling_level`, `beta`, `args.delta`, `args.use_bias_correction_kl`), as a trainer built with those
values holds them. Our side takes
the per-token log-probs from TRL's own `_get_per_token_logps_and_entropies` (the same forward) and
:func:`trl_ext.ppo.objective.objectives.objective_terms`. The map of names is in docs/ppo.md.

`test_from_grpo_config_gives_grpotrainers_loss` gives whole GRPOConfigs (TRL's defaults, DAPO-style, ...) to both:
to GRPOTrainer as its `__init__` reads them, to ours through `PPOConfig.from_grpo_config`.
"""

from __future__ import annotations

import math

import pytest
import torch

trl = pytest.importorskip("trl")
from packaging.version import Version  # noqa: E402

if Version(trl.__version__).release < (1, 13):
    pytest.skip(f"TRL {trl.__version__}: GRPOTrainer's loss types of TRL >= 1.13 are compared", allow_module_level=True)

from trl_ext.ppo.objective.objectives import ObjectiveConfig, objective_terms  # noqa: E402

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
def grpo(tiny_models, tmp_path_factory, converted):  # the configs first: building one resets accelerate's state
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


def ours(trainer, inputs, keys, beta, accumulation=1, cfg=None):
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logps = trainer._get_per_token_logps_and_entropies(trainer.model, input_ids, attention_mask, T)[0]
    mask = inputs["completion_mask"].bool()
    if cfg is None:
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


# GRPOConfigs given whole: TRL 1.16's defaults, DAPO's recipe, GRPO's paper (KL in the loss), GSPO, Dr. GRPO, CISPO
GRPO_CONFIGS = {
    "trl_defaults": {},
    "dapo_style": {"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28, "beta": 0.0,
                   "mask_truncated_completions": True},
    "grpo_paper": {"loss_type": "grpo", "beta": 0.04},
    "gspo": {"loss_type": "grpo", "importance_sampling_level": "sequence", "epsilon": 3e-4, "epsilon_high": 4e-4},
    "dr_grpo": {"loss_type": "dr_grpo", "scale_rewards": "none", "beta": 0.02, "use_bias_correction_kl": False},
    "cispo": {"loss_type": "cispo", "epsilon_high": 5.0},
}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{name: (GRPOConfig, the ObjectiveConfig of PPOConfig.from_grpo_config(it), its kl_coef)}."""
    import warnings

    from trl import GRPOConfig

    from trl_ext import PPOConfig

    out = {}
    for name, keys in GRPO_CONFIGS.items():
        config = GRPOConfig(output_dir=str(tmp_path_factory.mktemp(name)), use_cpu=True, bf16=False,
                            report_to="none", per_device_train_batch_size=B, num_generations=2,
                            max_completion_length=T, **keys)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "GRPOConfig. not honoured")  # max_grad_norm: no loss term
            ppo = PPOConfig.from_grpo_config(config)
        out[name] = config, ObjectiveConfig.from_args(ppo), ppo.kl_coef
    return out


@pytest.mark.parametrize("name", list(GRPO_CONFIGS))
def test_from_grpo_config_gives_grpotrainers_loss(grpo, converted, name):
    """A GRPOConfig through PPOConfig.from_grpo_config: the loss and gradients of GRPOTrainer built with it."""
    config, objective, kl_coef = converted[name]
    # what GRPOTrainer.__init__ copies from its config
    grpo.loss_type, grpo.beta = config.loss_type, config.beta
    grpo.epsilon_low = config.epsilon
    grpo.epsilon_high = config.epsilon if config.epsilon_high is None else config.epsilon_high
    grpo.importance_sampling_level, grpo.max_completion_length = config.importance_sampling_level, T
    grpo.args.delta, grpo.args.use_bias_correction_kl = config.delta, config.use_bias_correction_kl
    # one of 2 accumulated micro-batches, the other holding 9 more tokens: tells dapo's global token mean from bnpo's
    grpo.current_gradient_accumulation_steps = grpo.args.steps_per_generation = 2
    inputs = batch(grpo, other_tokens=9)
    trl_loss = grpo._compute_loss(grpo.model, inputs)
    trl_loss.backward()
    trl_grads = gradients(grpo.model)
    our_loss = ours(grpo, inputs, None, kl_coef, accumulation=2, cfg=objective)
    our_loss.backward()
    our_grads = gradients(grpo.model)
    assert abs(trl_loss.item() - our_loss.item()) < 1e-6, (trl_loss.item(), our_loss.item())
    assert trl_grads.keys() == our_grads.keys() and len(trl_grads) > 5
    assert max((trl_grads[n] - our_grads[n]).abs().max().item() for n in trl_grads) < 1e-6
    assert max(g.abs().max().item() for g in trl_grads.values()) > 1e-3
