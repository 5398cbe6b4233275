"""trl_ext.models.shared_base: reward/value adapters on the policy's base score like separate models, switch adapters
without touching requires_grad, survive activation checkpointing, save and load, and refuse what cannot work."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

QR = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 0], [12, 13, 14, 15, 16, 0, 0, 0]])  # pad 0, right-padded


def lora_config(**kwargs):
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                      init_lora_weights=False, **kwargs)


def peft_policy(tiny_models, checkpointing=False, seed=0):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    if checkpointing:
        model.activation_checkpointing_enable({"use_reentrant": False})
    return get_peft_model(model, lora_config())


def seqcls_from_adapter(tiny_models, adapter, trainable=False, checkpointing=False):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    base = AutoModelForSequenceClassification.from_pretrained(tiny_models.policy, num_labels=1)
    if checkpointing:
        base.activation_checkpointing_enable({"use_reentrant": False})
    return PeftModel.from_pretrained(base, adapter, is_trainable=trainable)


def test_reward_adapter_scores_like_the_separate_peft_model(tiny_models, reward_adapter):
    from trl.experimental.utils import get_reward

    from trl_ext.models.scalar_heads import scalar_model_outputs
    from trl_ext.models.shared_base import add_scalar_adapter

    policy = peft_policy(tiny_models)
    reward = add_scalar_adapter(policy, "reward", source=reward_adapter, trainable=False)
    separate = seqcls_from_adapter(tiny_models, reward_adapter).eval()
    with torch.no_grad():
        expected = separate(input_ids=QR, attention_mask=QR != 0).logits
        torch.testing.assert_close(reward(input_ids=QR, attention_mask=QR != 0).logits, expected)
        ours, trl = scalar_model_outputs(reward, QR, 0, 2), get_reward(reward, QR, 0, 2)
        torch.testing.assert_close(ours[1], expected.squeeze(-1))
        torch.testing.assert_close(trl[1], expected.squeeze(-1))
        # the policy itself is unchanged by the extra adapter (its own adapter is active)
        plain = peft_policy(tiny_models)
        torch.testing.assert_close(policy(input_ids=QR).logits, plain(input_ids=QR).logits)
    assert reward.head_name == "score" and not reward.trainable
    assert not any(p.requires_grad for n, p in policy.named_parameters() if ".reward." in n)
    assert [n for n, _ in reward.named_parameters()] == ["score.weight"]  # the base is the policy's, not ours


def test_switch_keeps_requires_grad_and_disables_for_the_reference(tiny_models, reward_adapter):
    from trl_ext.models.shared_base import adapter_switch, add_scalar_adapter

    policy = peft_policy(tiny_models)
    add_scalar_adapter(policy, "value", source=reward_adapter, trainable=True)
    grads = {n: p.requires_grad for n, p in policy.named_parameters()}
    assert any(g for n, g in grads.items() if ".value." in n) and any(g for n, g in grads.items() if ".default." in n)
    switch = adapter_switch(policy)
    with torch.no_grad():
        with switch.use(None):
            reference = policy(input_ids=QR).logits
            assert switch.state() == (("default",), True)
        with policy.disable_adapter():  # peft's way gives the same reference...
            expected = policy(input_ids=QR).logits
    torch.testing.assert_close(reference, expected)
    # ...but rewrites requires_grad: after it the value adapter is frozen. The switch leaves them as they were.
    assert not any(p.requires_grad for n, p in policy.named_parameters() if ".value." in n)
    with switch.use("value"):
        assert switch.state() == (("value",), False)
    assert switch.state() == (("default",), False)


def grads_after_one_backward(policy, value, *, naive=False):
    """Policy LM loss + value loss on the same batch, one backward; every gradient by role-level name."""
    import re

    from trl_ext.models.scalar_heads import scalar_model_outputs
    from trl_ext.models.shared_base import adapter_switch

    policy.train()
    if naive:  # switch adapters around the forward only, as a first implementation would
        with adapter_switch(policy).use("value"):
            hidden = value.decoder()(input_ids=QR, attention_mask=QR != 0, output_hidden_states=True).hidden_states
        values = value.score(hidden[-1])
    else:
        values = scalar_model_outputs(value, QR, 0, 2)[0]
    logits = policy(input_ids=QR, attention_mask=QR != 0).logits
    (logits.log_softmax(-1)[..., 3].mean() + (values ** 2).mean()).backward()
    out = {}
    for prefix, model in (("policy.", policy), ("value_model.", value)):
        for name, param in model.named_parameters():
            if param.grad is None:
                continue
            match = re.search(r"layers\.(\d+)\..*?(q_proj|v_proj)\.lora_([AB])\.(\w+)\.weight", name)
            role = "value" if prefix == "value_model." or (match and match.group(4) == "value") else "policy"
            out[(role, *match.groups()[:3]) if match else ("value", "score")] = param.grad.clone()
    return out


@pytest.mark.parametrize("checkpointing", [False, True])
def test_gradients_equal_separate_models_also_with_activation_checkpointing(tiny_models, reward_adapter,
                                                                             checkpointing):
    from trl_ext.models.shared_base import add_scalar_adapter

    separate = grads_after_one_backward(
        peft_policy(tiny_models, checkpointing),
        seqcls_from_adapter(tiny_models, reward_adapter, trainable=True, checkpointing=checkpointing))
    policy = peft_policy(tiny_models, checkpointing)
    shared = grads_after_one_backward(policy, add_scalar_adapter(policy, "value", source=reward_adapter,
                                                                 trainable=True))
    assert shared.keys() == separate.keys() and len(shared) == 17  # 2 layers x 2 modules x A/B x 2 roles + head
    for key in separate:
        torch.testing.assert_close(shared[key], separate[key], atol=1e-6, rtol=1e-5)
    if checkpointing:
        # Without the checkpoint context, the backward pass recomputes the value model's layers with the policy's
        # adapter active: the value gradients are silently wrong.
        policy = peft_policy(tiny_models, checkpointing=True)
        naive = grads_after_one_backward(policy, add_scalar_adapter(policy, "value", source=reward_adapter,
                                                                    trainable=True), naive=True)
        errors = [((naive[k] - separate[k]).norm() / separate[k].norm()).item() for k in separate if k[0] == "value"]
        assert max(errors) > 0.1, errors


def test_reentrant_checkpointing_is_refused(tiny_models, reward_adapter):
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    from trl_ext.errors import UserInputError
    from trl_ext.models.shared_base import add_scalar_adapter

    model = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    model.activation_checkpointing_enable({"use_reentrant": True})
    policy = get_peft_model(model, lora_config())
    value = add_scalar_adapter(policy, "value", source=reward_adapter, trainable=True)
    policy.train()
    with pytest.raises(UserInputError, match="reentrant"):
        value.backbone(input_ids=QR)


def test_save_and_load_the_value_adapter(tiny_models, reward_adapter, tmp_path):
    from trl_ext.models.shared_base import add_scalar_adapter

    policy = peft_policy(tiny_models)
    value = add_scalar_adapter(policy, "value", source=reward_adapter, trainable=True)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if ".value." in name:
                param.add_(0.1)
        value.score.weight.mul_(-2)
        trained = value(input_ids=QR).logits
    value.save_pretrained(tmp_path / "value_model")
    config = json.loads((tmp_path / "value_model" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS" and config["modules_to_save"] == ["score"]
    assert config["base_model_name_or_path"] == str(tiny_models.policy)
    with torch.no_grad():
        # loadable as a separate peft sequence classifier, as a shared-base adapter, and in place
        separate = seqcls_from_adapter(tiny_models, tmp_path / "value_model").eval()
        torch.testing.assert_close(separate(input_ids=QR, attention_mask=QR != 0).logits, trained)
        other = peft_policy(tiny_models)
        again = add_scalar_adapter(other, "value", source=tmp_path / "value_model", trainable=True)
        torch.testing.assert_close(again(input_ids=QR).logits, trained)
        fresh = add_scalar_adapter(peft_policy(tiny_models), "value", source=reward_adapter, trainable=True)
        fresh.load_weights(tmp_path / "value_model")
        torch.testing.assert_close(fresh(input_ids=QR).logits, trained)


def test_fresh_value_adapter_and_head(tiny_models):
    from trl_ext.models.shared_base import add_scalar_adapter

    policy = peft_policy(tiny_models)
    torch.manual_seed(3)
    value = add_scalar_adapter(policy, "value", lora_config=lora_config(), trainable=True)
    std = policy.get_base_model().config.initializer_range
    assert value.score.weight.shape == (1, 64) and 0.2 * std < value.score.weight.std().item() < 5 * std
    assert value.trainable and value.score.weight.requires_grad
    assert any(p.requires_grad for n, p in policy.named_parameters() if ".value." in n)


def test_4bit_shared_base_scores_like_a_4bit_reward_model(tiny_models, reward_adapter, tokenizer):
    """The same LoRA reward adapter on the 4-bit policy base and on a separately loaded 4-bit reward model."""
    from trl import ModelConfig

    from trl_ext.models import load_policy
    from trl_ext.models.shared_base import add_scalar_adapter
    from trl_ext.recipe_loader.pipeline import load_scalar_checkpoint

    common = dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", dtype="float32")
    policy = load_policy(ModelConfig(model_name_or_path=str(tiny_models.policy), use_peft=True, lora_r=4,
                                     lora_target_modules=["q_proj", "v_proj"], **common), tokenizer=tokenizer,
                         gradient_checkpointing=False)
    reward = add_scalar_adapter(policy, "reward", source=reward_adapter, trainable=False)
    separate = load_scalar_checkpoint(ModelConfig(model_name_or_path=str(reward_adapter), **common), trainable=False,
                                      tokenizer=tokenizer).eval()
    with torch.no_grad():
        torch.testing.assert_close(reward(input_ids=QR, attention_mask=QR != 0).logits,
                                   separate(input_ids=QR, attention_mask=QR != 0).logits)


def altered_adapter(adapter, path, key, tensor):
    """A copy of the LoRA adapter directory `adapter` at `path`, with its weight `key` set to `tensor`."""
    import safetensors.torch

    shutil.copytree(adapter, path)
    weights = safetensors.torch.load_file(path / "adapter_model.safetensors")
    weights[key] = tensor
    safetensors.torch.save_file(weights, path / "adapter_model.safetensors")
    return path


def test_adapter_directories_that_cannot_share_the_base_are_refused(tiny_models, reward_adapter, tmp_path):
    from trl_ext.errors import UserInputError
    from trl_ext.models.shared_base import add_scalar_adapter, read_scalar_adapter

    base = str(tiny_models.policy)
    assert read_scalar_adapter(reward_adapter, policy_base=base).head_name == "score"
    with pytest.raises(UserInputError, match="is not a LoRA adapter directory.*not full models"):
        read_scalar_adapter(tiny_models.reward, policy_base=base)  # a full reward model
    other = tmp_path / "other_base"
    shutil.copytree(reward_adapter, other)
    config = json.loads((other / "adapter_config.json").read_text())
    (other / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "Qwen/Qwen2.5-7B"}))
    with pytest.raises(UserInputError, match=r"trained on base 'Qwen/Qwen2.5-7B', but the policy's base is"):
        read_scalar_adapter(other, policy_base=base)
    extra = altered_adapter(reward_adapter, tmp_path / "extra_module", "base_model.model.model.embed_tokens.weight",
                            torch.zeros(8, 64))
    with pytest.raises(UserInputError, match="one score head.*embed_tokens"):
        read_scalar_adapter(extra, policy_base=base)
    two = altered_adapter(reward_adapter, tmp_path / "two_outputs", "base_model.model.score.weight", torch.zeros(2, 64))
    with pytest.raises(UserInputError, match="score head has 2 outputs"):
        read_scalar_adapter(two)

    from transformers import AutoModelForCausalLM

    with pytest.raises(UserInputError, match="must be a LoRA peft model"):
        add_scalar_adapter(AutoModelForCausalLM.from_pretrained(tiny_models.policy), "reward", source=reward_adapter,
                           trainable=False)
    policy = peft_policy(tiny_models)
    add_scalar_adapter(policy, "reward", source=reward_adapter, trainable=False)
    with pytest.raises(UserInputError, match="already has an adapter named 'reward'"):
        add_scalar_adapter(policy, "reward", source=reward_adapter, trainable=False)
    with pytest.raises(UserInputError, match="'someone/reward-adapter': no such local directory, and fetching it"):
        add_scalar_adapter(policy, "value", source="someone/reward-adapter", trainable=True)  # offline in tests


def test_trainer_refuses_adapters_of_another_policy(tiny_models, reward_adapter, tokenizer, tmp_path):
    import trl_ext
    from trl_ext.errors import UserInputError
    from trl_ext.models.shared_base import add_scalar_adapter

    from ppo_helpers import config_kwargs, prompt_dataset

    policy, elsewhere = peft_policy(tiny_models), peft_policy(tiny_models)
    reward = add_scalar_adapter(elsewhere, "reward", source=reward_adapter, trainable=False)
    value = add_scalar_adapter(policy, "value", source=reward_adapter, trainable=True)
    with pytest.raises(UserInputError, match="^reward_model: its adapter sits on another model's base"):
        trl_ext.PPOTrainer(args=trl_ext.PPOConfig(**config_kwargs(tmp_path)), processing_class=tokenizer,
                           model=policy, ref_model=None, reward_model=reward, value_model=value,
                           train_dataset=prompt_dataset(tokenizer))
