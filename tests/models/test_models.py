"""trl_ext.models: tokenizer, policy and scalar-model loading, quantization, LoRA, and the user-input errors."""

import logging
import sys
import warnings

import pytest
import torch
import transformers
from trl import ModelConfig

from trl_ext.errors import UserInputError
from trl_ext.models import load_policy, load_scalar_model, load_tokenizer
from trl_ext.models.quantization import (
    check_quantization_request,
    disable_bnb_cpu_weight_repacking,
    quantization_config_for,
)

LORA = dict(use_peft=True, lora_r=4, lora_alpha=8, lora_dropout=0.0)


# --------------------------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture(scope="module")
def two_label_checkpoint(tmp_path_factory, tokenizer):
    """A tiny LlamaForSequenceClassification with a 2-output head (a classifier, not a reward model)."""
    from transformers import LlamaForSequenceClassification

    from trl_ext.testing import tiny_llama_config

    torch.manual_seed(3)
    path = tmp_path_factory.mktemp("two_labels")
    LlamaForSequenceClassification(tiny_llama_config(tokenizer, num_labels=2)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def no_pad_checkpoint(tmp_path_factory, tokenizer):
    """A tiny causal LM whose tokenizer has no pad token and whose config has no pad_token_id."""
    from trl_ext.testing import build_causal_lm

    path = tmp_path_factory.mktemp("no_pad")
    model = build_causal_lm(tokenizer, pad_token_id=None)
    model.generation_config.pad_token_id = None
    model.save_pretrained(path)
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tok.pad_token = None
    tok.save_pretrained(path)
    return path


@pytest.fixture()
def no_weight_loading(monkeypatch):
    """Makes any attempt to load weights fail the test: errors must come before loading."""

    def refuse(*args, **kwargs):
        raise AssertionError("weights were loaded before the input was validated")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoModelForSequenceClassification):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


@pytest.fixture(scope="module")
def batch(tokenizer):
    torch.manual_seed(0)
    return torch.randint(len(tokenizer.all_special_ids), len(tokenizer), (2, 10))


class TransformersWarnings(logging.Handler):
    """Collects warnings logged by transformers (its root logger does not propagate to pytest's caplog)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("transformers").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("transformers").removeHandler(self)


def dequantized_weight(module):
    """The float32 weight a bitsandbytes Linear4bit/Linear8bitLt layer actually computes with."""
    import bitsandbytes as bnb

    if isinstance(module, bnb.nn.Linear4bit):
        return bnb.functional.dequantize_4bit(module.weight.data, module.weight.quant_state).float()
    if isinstance(module, bnb.nn.Linear8bitLt):
        return module.weight.data.float() * module.weight.SCB.float()[:, None] / 127
    return None


def randomize_lora_b(model, seed=0):
    """LoRA B starts at zero, which makes every LoRA A gradient zero; give it values so gradients are informative."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.1)


def fp32_twin(qmodel, twin):
    """Give the fp32 peft model ``twin`` the quantized model's dequantized weights and its trainable params."""
    qmodules = dict(qmodel.named_modules())
    replaced = 0
    with torch.no_grad():
        for name, module in twin.named_modules():
            weight = dequantized_weight(qmodules[name]) if name in qmodules else None
            if weight is not None:
                module.weight.copy_(weight)
                replaced += 1
        qparams = dict(qmodel.named_parameters())
        for name, param in twin.named_parameters():
            if param.requires_grad:
                param.copy_(qparams[name])
    assert replaced > 0
    return twin


def loss_of(model, ids):
    if "CausalLM" in type(model).__name__:
        return model(input_ids=ids, labels=ids).loss
    return (model(input_ids=ids).logits ** 2).mean()  # scalar model: any differentiable function of the output


def lora_grads(model, ids):
    model.train()
    model.zero_grad()
    loss_of(model, ids).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def max_rel_err(grads, ref):
    assert grads.keys() == ref.keys() and len(ref) > 0
    return max(((grads[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref)


def inference_passes(model, ids):
    """What evaluation loops and generation do: eval mode, no autograd."""
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    with torch.inference_mode():
        model(input_ids=ids)
    if "CausalLM" in type(model).__name__:
        prompt = ids[:, :4]
        model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, do_sample=False)


# --------------------------------------------------------------------------------------------------------------
# Tokenizer, plain loading


def test_load_tokenizer_sets_missing_pad_from_eos(no_pad_checkpoint, tiny_models):
    tok = load_tokenizer(ModelConfig(model_name_or_path=str(no_pad_checkpoint)))
    assert tok.pad_token == tok.eos_token == "</s>" and tok.pad_token_id == tok.eos_token_id
    tok = load_tokenizer(ModelConfig(model_name_or_path=str(tiny_models.policy)))
    assert tok.pad_token == "<pad>" and tok.pad_token_id != tok.eos_token_id  # an existing pad token is kept


def test_load_policy_plain_matches_from_pretrained(tiny_models, batch):
    model = load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy)))
    ref = transformers.AutoModelForCausalLM.from_pretrained(tiny_models.policy, dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert all(p.requires_grad for p in model.parameters())  # full fine-tuning
    torch.testing.assert_close(model(batch).logits, ref(batch).logits, rtol=0, atol=0)


def test_load_policy_dtype_and_kwargs_override(tiny_models):
    args = ModelConfig(model_name_or_path=str(tiny_models.policy), dtype="bfloat16")
    assert load_policy(args).dtype == torch.bfloat16
    assert load_policy(args, dtype=torch.float32, use_cache=False).dtype == torch.float32  # kwargs win
    with pytest.raises(UserInputError, match="dtype 'float8'"):
        load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy), dtype="float8"))


def test_load_policy_sets_pad_token_on_tokenizer_and_model(no_pad_checkpoint):
    tok = transformers.AutoTokenizer.from_pretrained(no_pad_checkpoint)
    assert tok.pad_token is None
    model = load_policy(ModelConfig(model_name_or_path=str(no_pad_checkpoint)), tokenizer=tok)
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id == model.generation_config.pad_token_id


def test_single_target_module_name_is_a_name_not_a_regex(tiny_models):
    # trl.ModelConfig turns ["q_proj"] into "q_proj", which peft would read as a regex over full names.
    args = ModelConfig(model_name_or_path=str(tiny_models.policy), lora_target_modules=["q_proj"], **LORA)
    assert args.lora_target_modules == "q_proj"
    model = load_policy(args)
    lora_layers = [n for n, _ in model.named_modules() if n.endswith("q_proj.lora_A")]
    assert len(lora_layers) == 2  # one per layer of the 2-layer model
    assert {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, p in model.named_parameters() if p.requires_grad} == {
        "q_proj"
    }


# --------------------------------------------------------------------------------------------------------------
# Scalar models


def test_scalar_model_from_reward_checkpoint_keeps_its_head(tiny_models, batch):
    model = load_scalar_model(ModelConfig(model_name_or_path=str(tiny_models.reward)))
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    assert model.config.num_labels == 1 and model.score.out_features == 1
    torch.testing.assert_close(model.score.weight, ref.score.weight, rtol=0, atol=0)
    assert model(batch).logits.shape == (2, 1)


def test_scalar_model_from_causal_lm_checkpoint_is_quiet_and_keeps_the_backbone(tiny_models, batch):
    policy = transformers.AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    with TransformersWarnings() as logged, warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        model = load_scalar_model(ModelConfig(model_name_or_path=str(tiny_models.policy)))
    assert logged.messages == []  # no LOAD REPORT (lm_head unexpected / score missing), no 2-label warning
    assert not [w for w in warned if "label" in str(w.message).lower()]
    assert model.config.num_labels == 1 and len(model.config.id2label) == 1 and model.score.out_features == 1
    torch.testing.assert_close(model.model.embed_tokens.weight, policy.model.embed_tokens.weight, rtol=0, atol=0)
    torch.testing.assert_close(
        model.model.layers[1].mlp.down_proj.weight, policy.model.layers[1].mlp.down_proj.weight, rtol=0, atol=0
    )
    assert model.score.weight.abs().sum() > 0  # initialised, not left empty
    assert model(batch).logits.shape == (2, 1)


def test_multi_output_head_is_refused_before_loading(two_label_checkpoint, no_weight_loading):
    with pytest.raises(UserInputError, match=r"2 outputs.*reinit_head=True") as err:
        load_scalar_model(ModelConfig(model_name_or_path=str(two_label_checkpoint)))
    assert "\n" not in str(err.value) and str(two_label_checkpoint) in str(err.value)
    with pytest.raises(UserInputError, match="num_labels=2"):
        load_scalar_model(ModelConfig(model_name_or_path=str(two_label_checkpoint)), num_labels=2)


def test_reinit_head_replaces_a_multi_output_head(two_label_checkpoint, batch):
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(two_label_checkpoint)
    assert ref.score.out_features == 2
    with TransformersWarnings() as logged:
        torch.manual_seed(0)
        model = load_scalar_model(ModelConfig(model_name_or_path=str(two_label_checkpoint)), reinit_head=True)
        torch.manual_seed(0)
        again = load_scalar_model(ModelConfig(model_name_or_path=str(two_label_checkpoint)), reinit_head=True)
    assert logged.messages == []
    assert model.score.out_features == 1 and model.config.num_labels == 1 and len(model.config.id2label) == 1
    std = model.score.weight.std().item()
    assert 0.01 < std < 0.04  # normal(0, initializer_range=0.02), not a slice of the old head
    torch.testing.assert_close(model.score.weight, again.score.weight, rtol=0, atol=0)  # from torch's RNG
    torch.testing.assert_close(model.model.norm.weight, ref.model.norm.weight, rtol=0, atol=0)
    torch.testing.assert_close(
        model.model.layers[0].self_attn.q_proj.weight, ref.model.layers[0].self_attn.q_proj.weight, rtol=0, atol=0
    )
    assert model(batch).logits.shape == (2, 1)


def test_reinit_head_on_a_reward_checkpoint_starts_a_new_head(tiny_models):
    kept = load_scalar_model(ModelConfig(model_name_or_path=str(tiny_models.reward)))
    fresh = load_scalar_model(ModelConfig(model_name_or_path=str(tiny_models.reward)), reinit_head=True)
    assert fresh.score.out_features == 1 and not torch.allclose(fresh.score.weight, kept.score.weight)
    torch.testing.assert_close(fresh.model.norm.weight, kept.model.norm.weight, rtol=0, atol=0)


def test_scalar_model_pad_token_makes_padded_batches_score_the_last_real_token(no_pad_checkpoint, tokenizer):
    tok = transformers.AutoTokenizer.from_pretrained(no_pad_checkpoint)
    model = load_scalar_model(ModelConfig(model_name_or_path=str(no_pad_checkpoint)), tokenizer=tok)
    assert tok.pad_token_id == tok.eos_token_id == model.config.pad_token_id
    bare = load_scalar_model(ModelConfig(model_name_or_path=str(no_pad_checkpoint)))  # no tokenizer: from eos
    assert bare.config.pad_token_id == tok.eos_token_id
    # Right-padded batch: each row's score must equal the score of that row alone.
    short, long = tok("hello cat")["input_ids"], tok("the big dog went home today")["input_ids"]
    assert tok.pad_token_id not in short + long and len(short) < len(long)
    padded = torch.tensor([short + [tok.pad_token_id] * (len(long) - len(short)), long])
    mask = (torch.arange(len(long)) < torch.tensor([[len(short)], [len(long)]])).long()
    model.eval()
    with torch.no_grad():
        together = model(input_ids=padded, attention_mask=mask).logits[:, 0]
        alone = torch.cat([model(input_ids=torch.tensor([ids])).logits[:, 0] for ids in (short, long)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_lora_scalar_model_saves_its_score_head_with_the_adapter(tiny_models, batch, tmp_path):
    """TRL #1379: a LoRA reward model whose score head is not saved reloads with a random head."""
    from peft import PeftModel
    from safetensors.torch import load_file

    args = ModelConfig(model_name_or_path=str(tiny_models.policy), **LORA)  # causal LM: the head is NEW
    torch.manual_seed(0)
    model = load_scalar_model(args)
    head_before = model.base_model.model.score.modules_to_save["default"].weight.detach().clone()
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    rewards = model(input_ids=batch).logits[:, 0]
    loss = -torch.nn.functional.logsigmoid(rewards[0] - rewards[1])
    loss.backward()
    optimizer.step()
    trained_head = model.base_model.model.score.modules_to_save["default"].weight
    assert not torch.equal(trained_head, head_before)  # the head is trained, not frozen

    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "adapter_model.safetensors")
    assert any("score" in k for k in saved) and any("lora_A" in k for k in saved)

    model.eval()
    with torch.no_grad():
        expected = model(input_ids=batch).logits
    torch.manual_seed(123)  # a different random head in the fresh base
    base = load_scalar_model(ModelConfig(model_name_or_path=str(tiny_models.policy)))
    with torch.no_grad():
        assert not torch.allclose(base(input_ids=batch).logits, expected, atol=1e-3)
    reloaded = PeftModel.from_pretrained(base, tmp_path)
    reloaded.eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=batch).logits, expected, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------------------------------
# bitsandbytes on CPU


@pytest.mark.parametrize(
    "loader, quant",
    [
        (load_policy, dict(bnb_4bit_quant_type="nf4")),
        (load_policy, dict(bnb_4bit_quant_type="fp4", use_bnb_nested_quant=True)),
        (load_scalar_model, dict(bnb_4bit_quant_type="nf4")),
    ],
    ids=["policy-nf4", "policy-fp4-nested", "scalar-nf4"],
)
def test_4bit_lora_gradients_stay_exact_after_inference_passes(tiny_models, batch, loader, quant):
    """The CPU trap (environment.md): eval + no_grad repacks Linear4bit weights; gradients must not change."""
    import bitsandbytes as bnb

    path = str(tiny_models.policy if loader is load_policy else tiny_models.reward)
    lora = dict(LORA, lora_target_modules=["all-linear"])
    qmodel = loader(ModelConfig(model_name_or_path=path, load_in_4bit=True, **quant, **lora))
    layers = [m for m in qmodel.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 14 and all(m.support_avx512bf16_for_cpu is False for m in layers)  # 7 per layer
    randomize_lora_b(qmodel)
    twin = fp32_twin(qmodel, loader(ModelConfig(model_name_or_path=path, **lora)))
    expected = lora_grads(twin, batch)
    assert max_rel_err(lora_grads(qmodel, batch), expected) < 1e-5
    for _ in range(3):
        inference_passes(qmodel, batch)
        assert max_rel_err(lora_grads(qmodel, batch), expected) < 1e-5
    assert not any(getattr(m.weight.quant_state, "packing_format_for_cpu", False) for m in layers)


def test_fix_also_covers_a_quantization_config_passed_as_kwarg(tiny_models):
    import bitsandbytes as bnb

    args = ModelConfig(model_name_or_path=str(tiny_models.policy), **LORA)  # not quantized by its fields
    model = load_policy(args, quantization_config=transformers.BitsAndBytesConfig(load_in_4bit=True))
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert layers and all(m.support_avx512bf16_for_cpu is False for m in layers)
    assert all(not p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)  # k-bit prepared


def test_without_the_fix_this_cpu_hits_the_trap_or_has_nothing_to_fix(tiny_models, batch):
    """Shows what the fix is for: on AVX512-BF16 CPUs, undoing it makes gradients wrong after one eval pass."""
    import bitsandbytes as bnb
    from bitsandbytes.functional import has_avx512bf16

    lora = dict(LORA, lora_target_modules=["all-linear"])
    path = str(tiny_models.policy)
    qmodel = load_policy(ModelConfig(model_name_or_path=path, load_in_4bit=True, **lora))
    for m in qmodel.modules():
        if isinstance(m, bnb.nn.Linear4bit):
            m.support_avx512bf16_for_cpu = has_avx512bf16()  # bitsandbytes' own default
    randomize_lora_b(qmodel)
    expected = lora_grads(fp32_twin(qmodel, load_policy(ModelConfig(model_name_or_path=path, **lora))), batch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the trap's only sign: "bitsandbytes::gemv_4bit: an autograd kernel ..."
        inference_passes(qmodel, batch)
        err = max_rel_err(lora_grads(qmodel, batch), expected)
    if has_avx512bf16():
        assert err > 0.1  # silently wrong gradients: this is what disable_bnb_cpu_weight_repacking prevents
    else:
        assert err < 1e-5
    # Applying the fix after the fact cannot repair repacked layers, and says so.
    if has_avx512bf16():
        with pytest.warns(UserWarning, match="already repacked"):
            disable_bnb_cpu_weight_repacking(qmodel)


def test_8bit_lora_gradients_are_close_to_fp32_with_dequantized_weights(tiny_models, batch):
    lora = dict(LORA, lora_target_modules=["all-linear"])
    path = str(tiny_models.policy)
    qmodel = load_policy(ModelConfig(model_name_or_path=path, load_in_8bit=True, **lora))
    randomize_lora_b(qmodel)
    twin = fp32_twin(qmodel, load_policy(ModelConfig(model_name_or_path=path, **lora)))
    expected = lora_grads(twin, batch)
    assert max_rel_err(lora_grads(qmodel, batch), expected) < 1e-3
    inference_passes(qmodel, batch)
    assert max_rel_err(lora_grads(qmodel, batch), expected) < 1e-3


@pytest.mark.parametrize("bits", ["load_in_4bit", "load_in_8bit"])
def test_quantized_lora_optimizer_step_changes_adapters_and_lowers_loss(tiny_models, batch, bits):
    model = load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy), **{bits: True}, **LORA))
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)  # the quantized base is frozen
    before = {n: p.detach().clone() for n, p in trainable.items()}
    optimizer = torch.optim.Adam(trainable.values(), lr=1e-2)
    model.train()
    loss0 = model(input_ids=batch, labels=batch).loss
    loss0.backward()
    optimizer.step()
    model.eval()
    with torch.no_grad():
        loss1 = model(input_ids=batch, labels=batch).loss
    changed = {n for n in before if not torch.equal(trainable[n], before[n])}
    # LoRA B starts at zero, so A gets no gradient on the first step: every B must move.
    assert changed == {n for n in before if "lora_B" in n}
    assert loss1.item() < loss0.item() - 1e-3


def test_gradient_checkpointing_follows_the_wish_and_keeps_gradients(tiny_models, batch):
    args = ModelConfig(model_name_or_path=str(tiny_models.policy), load_in_4bit=True, **LORA)
    default = load_policy(args)  # quantized + LoRA: on by default
    off = load_policy(args, gradient_checkpointing=False)
    assert default.base_model.model.is_gradient_checkpointing and not off.base_model.model.is_gradient_checkpointing
    randomize_lora_b(default)
    off.load_state_dict({n: p for n, p in default.state_dict().items() if "lora_" in n}, strict=False)
    assert max_rel_err(lora_grads(default, batch), lora_grads(off, batch)) < 1e-6
    plain = load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy)), gradient_checkpointing=True)
    assert plain.is_gradient_checkpointing
    assert not load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy))).is_gradient_checkpointing


def test_4bit_compute_dtype_follows_dtype_and_checkpoint_for_auto():
    stored_bf16 = transformers.LlamaConfig(dtype="bfloat16")
    q = quantization_config_for(ModelConfig(load_in_4bit=True, dtype="auto"), stored_bf16)
    assert q.bnb_4bit_compute_dtype == torch.bfloat16  # TRL alone fails on "auto"
    q = quantization_config_for(ModelConfig(load_in_4bit=True, dtype="float32", bnb_4bit_quant_type="fp4"))
    assert q.bnb_4bit_compute_dtype == torch.float32 and q.bnb_4bit_quant_type == "fp4"
    assert quantization_config_for(ModelConfig(load_in_8bit=True)).load_in_8bit
    assert quantization_config_for(ModelConfig()) is None


# --------------------------------------------------------------------------------------------------------------
# User-input errors: one line, naming the culprit, before any weights are loaded


def one_line(err):
    assert "\n" not in str(err.value)
    return str(err.value)


def test_both_4bit_and_8bit_is_refused(tiny_models, no_weight_loading):
    args = ModelConfig(model_name_or_path=str(tiny_models.policy), load_in_4bit=True)
    args.load_in_8bit = True  # TRL's __post_init__ only checks at construction
    for loader in (load_policy, load_scalar_model):
        with pytest.raises(UserInputError, match="load_in_4bit and load_in_8bit") as err:
            loader(args)
        one_line(err)


@pytest.mark.parametrize("bits", ["load_in_4bit", "load_in_8bit"])
def test_quantization_without_bitsandbytes_is_refused(tiny_models, no_weight_loading, monkeypatch, bits):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # `import bitsandbytes` now raises ImportError
    with pytest.raises(UserInputError, match=f"{bits} needs bitsandbytes.*pip install bitsandbytes") as err:
        load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy), **{bits: True}))
    one_line(err)
    check_quantization_request(ModelConfig())  # not quantized: bitsandbytes is not needed


def test_missing_local_paths_are_named(tmp_path, monkeypatch, no_weight_loading):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for path in ["./nope", "../nope-xyz", str(tmp_path / "nope"), "~/nope-trl-ext-xyz", "models/nope", "a/b/c"]:
        for load in (load_policy, load_scalar_model, load_tokenizer):
            with pytest.raises(UserInputError, match="no such directory") as err:
                load(ModelConfig(model_name_or_path=path))
            assert repr(path) in one_line(err)


def test_missing_hub_id_is_named(no_weight_loading):
    # Offline (conftest): a Hub-id-looking name that is not a local directory fails on its config, named.
    with pytest.raises(UserInputError, match="'nobody/no-such-model'.*no such local directory.*Hub") as err:
        load_policy(ModelConfig(model_name_or_path="nobody/no-such-model"))
    one_line(err)


def test_directory_without_a_model_is_named(tmp_path, no_weight_loading):
    with pytest.raises(UserInputError, match="config.json of this local directory") as err:
        load_scalar_model(ModelConfig(model_name_or_path=str(tmp_path)))
    assert str(tmp_path) in one_line(err)
    with pytest.raises(UserInputError, match="model_name_or_path is not set"):
        load_policy(ModelConfig())


def test_absent_lora_targets_are_listed_with_the_available_ones(tiny_models, no_weight_loading):
    for loader, path, linear in [
        (load_policy, tiny_models.policy, "lm_head"),
        (load_scalar_model, tiny_models.policy, "score"),
    ]:
        args = ModelConfig(
            model_name_or_path=str(path), lora_target_modules=["q_proj", "qkv", "dense"], **LORA
        )
        with pytest.raises(UserInputError, match=r"lora_target_modules \['dense', 'qkv'\] not found") as err:
            loader(args)
        message = one_line(err)
        for name in ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", linear]:
            assert name in message
    with pytest.raises(UserInputError, match=r"regex .* matches no module"):
        args = ModelConfig(model_name_or_path=str(tiny_models.policy), lora_target_modules=[".*attn\\.qkv"], **LORA)
        load_policy(args)
