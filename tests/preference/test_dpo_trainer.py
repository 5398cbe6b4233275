"""trl_ext.DPOTrainer: TRL's numbers at defaults and for TRL's label-smoothing losses; cDPO by hand."""

import random

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset

import trl
from trl_ext import DPOConfig, DPOTrainer
from trl_ext.errors import UserInputError
from trl_ext.testing import build_causal_lm, tiny_corpus

WORDS = tiny_corpus(60, seed=11)


def rows(n=8, seed=0):
    rng = random.Random(seed)
    return [
        {"prompt": rng.choice(WORDS)[:20], "chosen": " " + rng.choice(WORDS), "rejected": " " + rng.choice(WORDS)}
        for _ in range(n)
    ]


def config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False,
        max_steps=2, per_device_train_batch_size=4, logging_steps=1, save_strategy="no", learning_rate=1e-2, seed=0,
        max_length=64, beta=0.5,
    )
    base.update(kw)
    return DPOConfig(**base)


def policy(tiny_models):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_models.policy)


def run(cls, tiny_models, tokenizer, args, data, ref=True):
    ref_model = build_causal_lm(tokenizer, seed=7) if ref else None
    t = cls(model=policy(tiny_models), ref_model=ref_model, args=args, train_dataset=data, processing_class=tokenizer)
    t.train()
    return t, [h for h in t.state.log_history if "loss" in h]


KEYS = ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen"]


def test_defaults_reproduce_trl(tiny_models, tokenizer, tmp_path):
    data = Dataset.from_list(rows())
    ta, a = run(trl.DPOTrainer, tiny_models, tokenizer, config(tmp_path, max_steps=3), data)
    tb, b = run(DPOTrainer, tiny_models, tokenizer, config(tmp_path, max_steps=3), data)
    assert len(a) == 3
    for x, y in zip(a, b):
        assert {k: x[k] for k in KEYS} == {k: y[k] for k in KEYS}
    assert a[-1]["loss"] != a[0]["loss"]  # it trains
    for (name, pa), pb in zip(ta.model.named_parameters(), tb.model.parameters()):
        assert torch.equal(pa, pb), name


def test_config_defaults_are_trls():
    """trl_ext's DPOConfig adds fields (the non-finite policy) and keeps every TRL field's default."""
    ours, theirs = DPOConfig(output_dir="x", use_cpu=True), trl.DPOConfig(output_dir="x", use_cpu=True)
    assert {k: v for k, v in ours.to_dict().items() if "nonfinite" not in k} == theirs.to_dict()
    assert ours.nonfinite_policy == "stop"


@pytest.mark.parametrize("loss_type, eps", [("robust", 0.1), ("exo_pair", 1e-3), ("aot", 0.2), ("aot_unpaired", 0.2)])
def test_trl_label_smoothing_losses_unchanged(tiny_models, tokenizer, tmp_path, loss_type, eps):
    data = Dataset.from_list(rows(seed=1))
    args = dict(loss_type=loss_type, label_smoothing=eps)
    _, a = run(trl.DPOTrainer, tiny_models, tokenizer, config(tmp_path, **args), data)
    _, b = run(DPOTrainer, tiny_models, tokenizer, config(tmp_path, **args), data)
    for x, y in zip(a, b):
        assert {k: x[k] for k in KEYS} == {k: y[k] for k in KEYS}


def sequence_logps(model, batch):
    """Sum of the completion tokens' log-probabilities, by hand from the model's logits."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch["input_ids"][:, 1:, None]).squeeze(-1)
    return (logp * batch["completion_mask"][:, 1:]).sum(-1)


def test_cdpo_step_one_by_hand(tiny_models, tokenizer, tmp_path):
    eps, beta = 0.2, 0.5
    data = Dataset.from_list(rows(4, seed=2))
    args = config(tmp_path, max_steps=1, label_smoothing=eps, beta=beta)
    t = DPOTrainer(model=policy(tiny_models), ref_model=build_causal_lm(tokenizer, seed=7), args=args,
                   train_dataset=data, processing_class=tokenizer)
    batch = t.data_collator([t.train_dataset[i] for i in range(4)])  # the whole data set is the first batch
    pi_c, pi_r = sequence_logps(policy(tiny_models), batch).chunk(2)
    ref_c, ref_r = sequence_logps(build_causal_lm(tokenizer, seed=7), batch).chunk(2)
    x = beta * ((pi_c - ref_c) - (pi_r - ref_r))
    expected = (-(1 - eps) * F.logsigmoid(x) - eps * F.logsigmoid(-x)).mean().item()
    plain_dpo = (-F.logsigmoid(x)).mean().item()
    assert abs(expected - plain_dpo) > 1e-3  # the smoothing changes this loss
    t.train()
    log = [h for h in t.state.log_history if "loss" in h][0]
    assert log["loss"] == pytest.approx(expected, abs=1e-5)
    assert log["rewards/margins"] == pytest.approx(x.mean().item(), abs=1e-5)
    # TRL itself ignores label_smoothing for `sigmoid`: its loss is plain DPO
    _, trl_log = run(trl.DPOTrainer, tiny_models, tokenizer, config(tmp_path, max_steps=1, label_smoothing=eps,
                                                                       beta=beta), data)
    assert trl_log[0]["loss"] == pytest.approx(plain_dpo, abs=1e-5)


def test_cdpo_with_lora_policy(tiny_models, tokenizer, tmp_path):
    from peft import LoraConfig

    data = Dataset.from_list(rows(8, seed=3))
    t = DPOTrainer(model=policy(tiny_models), args=config(tmp_path, label_smoothing=0.1), train_dataset=data,
                   processing_class=tokenizer,
                   peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    t.train()
    log = [h for h in t.state.log_history if "loss" in h]
    # step one: policy == reference (adapters start at zero), so d = 0 and cDPO = log 2 for any eps
    assert log[0]["loss"] == pytest.approx(0.693147, abs=1e-5)
    assert log[1]["loss"] != pytest.approx(0.693147, abs=1e-6)


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(label_smoothing=0.5), "out of range"),
        (dict(label_smoothing=-0.01), "out of range"),
        (dict(loss_type="hinge", label_smoothing=0.1), r"no effect with loss_type=\['hinge'\]"),
        (dict(loss_type=["ipo", "sft"], label_smoothing=0.1), "no effect"),
        (dict(loss_type=["sigmoid", "robust"], label_smoothing=0.1), "cannot be combined"),
    ],
)
def test_config_errors(kw, match):
    with pytest.raises(UserInputError, match=match):
        DPOConfig(output_dir="x", use_cpu=True, **kw)


def test_config_accepts():
    DPOConfig(output_dir="x", use_cpu=True, loss_type=["sigmoid", "sft"], label_smoothing=0.1)
    DPOConfig(output_dir="x", use_cpu=True, loss_type="hinge")
