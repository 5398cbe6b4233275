"""trl_ext.RewardTrainer: TRL's numbers at defaults, label smoothing, ranked data, centering, LoRA."""

import random

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset

import trl
from trl_ext import RewardConfig, RewardTrainer
from trl_ext.errors import UserInputError
from trl_ext.testing import tiny_corpus

WORDS = tiny_corpus(60, seed=3)


def pairwise_rows(n, seed=0):
    rng = random.Random(seed)
    return [
        {"prompt": rng.choice(WORDS)[:20], "chosen": " " + rng.choice(WORDS), "rejected": " " + rng.choice(WORDS)}
        for _ in range(n)
    ]


def ranked_rows(ks, seed=0):
    rng = random.Random(seed)
    return [{"prompt": rng.choice(WORDS)[:20], "responses": [" " + rng.choice(WORDS) for _ in range(k)]} for k in ks]


def config(tmp_path, **kw):
    base = dict(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        gradient_checkpointing=False,
        max_steps=2,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=16,
        logging_steps=1,
        save_strategy="no",
        learning_rate=1e-2,
        seed=0,
        max_length=64,
    )
    base.update(kw)
    return RewardConfig(**base)


@pytest.fixture(scope="module")
def scalar_path(tiny_models):
    return str(tiny_models.reward)


def load(scalar_path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(scalar_path)


def rewards_of(model, tokenizer, texts):
    """Each text scored alone (no padding), EOS appended as TRL does for plain text."""
    model.eval()
    out = []
    with torch.no_grad():
        for t in texts:
            ids = tokenizer(t + tokenizer.eos_token, return_tensors="pt")["input_ids"]
            out.append(model(input_ids=ids).logits.squeeze().item())
    return torch.tensor(out, dtype=torch.float64)


def nls(x):
    return -F.logsigmoid(x)


def train_log(trainer):
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


def test_defaults_reproduce_trl(scalar_path, tokenizer, tmp_path):
    data = Dataset.from_list(pairwise_rows(8))
    logs = {}
    weights = {}
    for name, cls in [("trl", trl.RewardTrainer), ("ext", RewardTrainer)]:
        t = cls(model=load(scalar_path), args=config(tmp_path, max_steps=3), train_dataset=data, processing_class=tokenizer)
        logs[name] = train_log(t)
        weights[name] = {k: v.detach().clone() for k, v in t.model.named_parameters()}
    keys = ["loss", "accuracy", "margin", "mean_reward", "min_reward", "max_reward", "num_tokens"]
    assert len(logs["trl"]) == 3
    for a, b in zip(logs["trl"], logs["ext"]):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}
    assert logs["trl"][-1]["loss"] != logs["trl"][0]["loss"]  # it trains
    assert all(torch.equal(weights["trl"][k], weights["ext"][k]) for k in weights["trl"])


def test_config_defaults_are_trls():
    """trl_ext's RewardConfig adds fields whose defaults leave TRL's training as it is, and keeps TRL's defaults."""
    ours, theirs = RewardConfig(output_dir="x", use_cpu=True), trl.RewardConfig(output_dir="x", use_cpu=True)
    added = {"label_smoothing": 0.0, "center_rewards_after_training": False, "nonfinite_policy": "stop",
             "max_consecutive_nonfinite_skips": 10}
    assert {k: v for k, v in ours.to_dict().items() if k not in added} == theirs.to_dict()
    assert {k: getattr(ours, k) for k in added} == added


def test_label_smoothing_step_one_by_hand(scalar_path, tokenizer, tmp_path):
    rows = pairwise_rows(4, seed=1)
    eps = 0.2
    model = load(scalar_path)
    rc = rewards_of(model, tokenizer, [r["prompt"] + r["chosen"] for r in rows])
    rr = rewards_of(model, tokenizer, [r["prompt"] + r["rejected"] for r in rows])
    d = rc - rr
    expected = ((1 - eps) * nls(d) + eps * nls(-d)).mean().item()
    assert abs(expected - nls(d).mean().item()) > 1e-3  # smoothing matters for these numbers
    t = RewardTrainer(
        model=load(scalar_path), args=config(tmp_path, max_steps=1, label_smoothing=eps),
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
    )
    log = train_log(t)[0]
    assert log["loss"] == pytest.approx(expected, abs=1e-5)
    assert log["accuracy"] == pytest.approx((d > 0).double().mean().item())
    assert log["margin"] == pytest.approx(d.mean().item(), abs=1e-5)


def ranked_expected(model, tokenizer, rows, eps=0.0):
    per_example, accs, margins = [], [], []
    for r in rows:
        rw = rewards_of(model, tokenizer, [r["prompt"] + x for x in r["responses"]])
        k = len(rw)
        pair_losses = []
        for i in range(k):
            for j in range(i + 1, k):
                d = rw[i] - rw[j]
                pair_losses.append(((1 - eps) * nls(d) + eps * nls(-d)).item())
                accs.append(float(d > 0))
                margins.append(d.item())
        per_example.append(sum(pair_losses) / len(pair_losses))
    return sum(per_example) / len(per_example), sum(accs) / len(accs), sum(margins) / len(margins)


def test_ranked_step_one_by_hand_and_eval(scalar_path, tokenizer, tmp_path):
    rows = ranked_rows([2, 3, 4, 3], seed=2)
    eps = 0.1
    loss, acc, margin = ranked_expected(load(scalar_path), tokenizer, rows, eps)
    t = RewardTrainer(
        model=load(scalar_path), args=config(tmp_path, max_steps=1, label_smoothing=eps),
        train_dataset=Dataset.from_list(rows), eval_dataset=Dataset.from_list(rows), processing_class=tokenizer,
    )
    # one batch holds the 12 responses of the 4 examples
    batch = t.data_collator([t.train_dataset[i] for i in range(4)])
    assert batch["input_ids"].shape[0] == 12 and batch["num_responses"].tolist() == [2, 3, 4, 3]
    before = t.evaluate()
    assert before["eval_loss"] == pytest.approx(loss, abs=1e-5)
    assert before["eval_accuracy"] == pytest.approx(acc) and before["eval_margin"] == pytest.approx(margin, abs=1e-5)
    log = train_log(t)[0]
    assert log["loss"] == pytest.approx(loss, abs=1e-5)
    assert log["accuracy"] == pytest.approx(acc) and log["margin"] == pytest.approx(margin, abs=1e-5)


def test_ranked_k2_equals_pairwise_training(scalar_path, tokenizer, tmp_path):
    pairs = pairwise_rows(8, seed=4)
    ranked = [{"prompt": r["prompt"], "responses": [r["chosen"], r["rejected"]]} for r in pairs]
    logs = []
    for rows in (pairs, ranked):
        t = RewardTrainer(
            model=load(scalar_path), args=config(tmp_path, max_steps=3, label_smoothing=0.1,
                                                  center_rewards_coefficient=0.01),
            train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        )
        logs.append(train_log(t))
    for a, b in zip(*logs):
        for k in ["loss", "accuracy", "margin", "mean_reward"]:
            assert a[k] == pytest.approx(b[k], abs=1e-5), k


@pytest.mark.parametrize("conversational", [False, True])
def test_ranked_tokenization_is_trls_chosen_tokenization(scalar_path, tokenizer, tmp_path, conversational):
    if conversational:
        rows = [{"prompt": [{"role": "user", "content": "hello cat"}],
                 "responses": [[{"role": "assistant", "content": w}] for w in ["good dog", "bad", "the sun"]]}]
    else:
        rows = [{"prompt": "hello cat", "responses": [" good dog", " bad", " the sun"]}]
    t = RewardTrainer(model=load(scalar_path), args=config(tmp_path), train_dataset=Dataset.from_list(rows),
                      processing_class=tokenizer)
    ids = t.train_dataset[0]["responses_ids"]
    pairs = [{"prompt": rows[0]["prompt"], "chosen": r, "rejected": rows[0]["responses"][0]} for r in rows[0]["responses"]]
    ref = trl.RewardTrainer(model=load(scalar_path), args=config(tmp_path), train_dataset=Dataset.from_list(pairs),
                            processing_class=tokenizer)
    assert ids == [ref.train_dataset[i]["chosen_ids"] for i in range(3)]


def test_max_length_drops_long_responses_keeps_order(scalar_path, tokenizer, tmp_path, caplog):
    rows = [{"responses": ["a", "the cat " * 40, "b"]}, {"responses": ["c", "the dog " * 40]}]
    with caplog.at_level("WARNING", logger="trl_ext.preference.ranked_data"):
        t = RewardTrainer(model=load(scalar_path), args=config(tmp_path, max_length=16),
                          train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    assert "dropped 3 of 5 responses and 1 of 2 rows" in caplog.text
    assert len(t.train_dataset) == 1
    short = [tokenizer("a</s>")["input_ids"], tokenizer("b</s>")["input_ids"]]
    assert t.train_dataset[0]["responses_ids"] == short


@pytest.mark.parametrize(
    "rows, match",
    [
        ([{"responses": ["a", "b"]}, {"responses": ["only one"]}], "row 1: `responses` must be a list of at least 2"),
        ([{"prompt": "x", "responses": [{"text": "a"}, {"text": "b"}]}], r"row 0: responses\[0\] must be a string"),
        ([{"responses_ids": [[1, 2], [3]]}, {"responses_ids": [[5], []]}], r"row 1: responses_ids\[1\] is empty"),
        ([{"chosen": "a", "rejected": "b", "responses": None}, {"chosen": None, "rejected": None, "responses": ["a", "b"]}],
         r"mixes pairwise .* \(row 0 is pairwise, row 1 is ranked\)"),
        ([{"responses": ["a", "b"], "margin": 1.0}], "margin"),
    ],
)
def test_ranked_data_errors_name_the_row(scalar_path, tokenizer, tmp_path, rows, match):
    with pytest.raises(UserInputError, match=match):
        RewardTrainer(model=load(scalar_path), args=config(tmp_path), train_dataset=Dataset.from_list(rows),
                      processing_class=tokenizer)


def test_config_validation():
    with pytest.raises(UserInputError, match="label_smoothing"):
        RewardConfig(output_dir="x", use_cpu=True, label_smoothing=0.5)
    with pytest.raises(UserInputError, match="label_smoothing"):
        RewardConfig(output_dir="x", use_cpu=True, label_smoothing=-0.1)


def test_centering_saves_and_reloads_mean_zero(scalar_path, tokenizer, tmp_path):
    from transformers import AutoModelForSequenceClassification

    rows = ranked_rows([3, 2, 4, 2, 3, 2], seed=5)
    t = RewardTrainer(model=load(scalar_path), args=config(tmp_path, center_rewards_after_training=True),
                      train_dataset=Dataset.from_list(rows), processing_class=tokenizer)
    t.train()
    offset = [h["reward/center_offset"] for h in t.state.log_history if "reward/center_offset" in h]
    assert len(offset) == 1 and abs(offset[0]) > 1e-3
    t.save_model(str(tmp_path / "centred"))
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "centred"), trust_remote_code=True)
    assert reloaded.score.bias is not None and reloaded.score.bias.item() == pytest.approx(-offset[0], abs=1e-6)
    best = rewards_of(reloaded, tokenizer, [r["prompt"] + r["responses"][0] for r in rows])
    assert abs(best.mean().item()) < 1e-5
    # a reloaded centred model saves and reloads again, with plain save_pretrained
    reloaded.save_pretrained(str(tmp_path / "again"))
    again = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "again"), trust_remote_code=True)
    assert torch.equal(again.score.bias, reloaded.score.bias)
    # our loader reloads the centred model with its bias, without trust_remote_code
    from trl import ModelConfig

    from trl_ext.models import load_scalar_model

    ours = load_scalar_model(ModelConfig(model_name_or_path=str(tmp_path / "centred"), dtype="float32"))
    assert torch.equal(ours.score.bias, reloaded.score.bias)
    assert torch.allclose(rewards_of(ours, tokenizer, [r["prompt"] + r["responses"][0] for r in rows]), best, atol=1e-6)
    # the same model without the bias is the trained model: rewards shift by exactly the offset
    others = rewards_of(reloaded, tokenizer, [r["prompt"] + r["responses"][1] for r in rows])
    trained = rewards_of(t.model, tokenizer, [r["prompt"] + r["responses"][1] for r in rows])
    assert torch.allclose(others, trained, atol=1e-5)


def lora_model(scalar_path):
    from peft import LoraConfig, get_peft_model

    return get_peft_model(load(scalar_path), LoraConfig(task_type="SEQ_CLS", r=4, lora_alpha=8,
                                                        target_modules=["q_proj", "v_proj"]))


def test_lora_ranked_trains_and_score_head_reloads(scalar_path, tokenizer, tmp_path):
    from peft import PeftModel

    rows = ranked_rows([3, 2, 4, 2], seed=6)
    model = lora_model(scalar_path)
    score_before = model.base_model.model.score.modules_to_save["default"].weight.detach().clone()
    t = RewardTrainer(model=model, args=config(tmp_path, label_smoothing=0.1), train_dataset=Dataset.from_list(rows),
                      processing_class=tokenizer)
    t.train()
    trained_score = t.model.base_model.model.score.modules_to_save["default"].weight.detach()
    assert not torch.allclose(score_before, trained_score)  # the head trains
    t.save_model(str(tmp_path / "adapter"))
    reloaded = PeftModel.from_pretrained(load(scalar_path), str(tmp_path / "adapter"))
    texts = [r["prompt"] + x for r in rows for x in r["responses"]]
    assert torch.allclose(rewards_of(reloaded, tokenizer, texts), rewards_of(t.model, tokenizer, texts), atol=1e-6)
    assert not torch.allclose(rewards_of(load(scalar_path), tokenizer, texts), rewards_of(t.model, tokenizer, texts))


def test_centering_with_biasless_lora_head_fails_before_training(scalar_path, tokenizer, tmp_path):
    with pytest.raises(UserInputError, match="PEFT adapter needs a score head with a bias"):
        RewardTrainer(model=lora_model(scalar_path), args=config(tmp_path, center_rewards_after_training=True),
                      train_dataset=Dataset.from_list(ranked_rows([2, 3])), processing_class=tokenizer)


def test_resume_keeps_label_smoothing_and_ranked_data_position(scalar_path, tokenizer, tmp_path):
    rows = ranked_rows([2, 3, 4, 2, 3, 2, 4, 3, 2, 3, 2, 4], seed=8)
    data = Dataset.from_list(rows)
    kw = dict(max_steps=4, per_device_train_batch_size=3, label_smoothing=0.15, save_strategy="steps", save_steps=2)
    full = RewardTrainer(model=load(scalar_path), args=config(tmp_path / "a", **kw), train_dataset=data,
                         processing_class=tokenizer)
    full_log = train_log(full)
    resumed = RewardTrainer(model=load(scalar_path), args=config(tmp_path / "b", **kw), train_dataset=data,
                            processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "out" / "checkpoint-2"))
    resumed_log = [h for h in resumed.state.log_history if "loss" in h and h["step"] > 2]
    assert [h["step"] for h in resumed_log] == [3, 4]
    for a, b in zip(full_log[2:], resumed_log):
        for k in ["loss", "accuracy", "margin", "mean_reward"]:
            assert a[k] == pytest.approx(b[k], abs=1e-5), k


def test_centering_on_a_given_reference_dataset(scalar_path, tokenizer, tmp_path):
    reference = pairwise_rows(5, seed=9)
    t = RewardTrainer(model=load(scalar_path), args=config(tmp_path, center_rewards_after_training=True),
                      train_dataset=Dataset.from_list(ranked_rows([3, 2, 4, 2], seed=10)), processing_class=tokenizer,
                      center_rewards_dataset=Dataset.from_list(reference))
    t.train()
    chosen = rewards_of(t.model, tokenizer, [r["prompt"] + r["chosen"] for r in reference])
    assert abs(chosen.mean().item()) < 1e-5
