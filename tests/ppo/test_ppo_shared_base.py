"""PPO with reward and value models as adapters on the policy's base: the same numbers as separate models.

Same weights both ways: the policy is the tiny causal LM with a LoRA adapter; reward and value start from one saved
LoRA reward adapter on that same base (fixture `reward_adapter`). Separate: two sequence-classification copies of
the base with the adapter (peft). Shared: adapters "reward" and "value" on the policy's own base.
"""

from __future__ import annotations

import re

import pytest
import torch

from ppo_helpers import config_kwargs, prompt_dataset, seed_all, update_logs

EXCLUDED_PREFIXES = ("eps", "time/")


@pytest.fixture(scope="module")
def data(tok):
    return prompt_dataset(tok), prompt_dataset(tok, n=4, seed=5)


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


def build_models(base_path, reward_adapter, *, shared: bool, checkpointing: bool):
    """(policy, reward, value) on the causal LM at ``base_path`` with the same weights, as separate models or
    sharing the policy's base."""
    from peft import PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from trl_ext.models.shared_base import add_scalar_adapter

    def base(cls, **kwargs):
        model = cls.from_pretrained(base_path, **kwargs)
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": False})
        return model

    seed_all(0)
    policy = get_peft_model(base(AutoModelForCausalLM), lora_config())
    if shared:
        reward = add_scalar_adapter(policy, "reward", source=reward_adapter, trainable=False)
        value = add_scalar_adapter(policy, "value", source=reward_adapter, trainable=True)
    else:
        reward = PeftModel.from_pretrained(base(AutoModelForSequenceClassification, num_labels=1), reward_adapter)
        value = PeftModel.from_pretrained(base(AutoModelForSequenceClassification, num_labels=1), reward_adapter,
                                          is_trainable=True)
    return policy, reward, value


def canonical(name: str):
    """A trainable tensor's role-level name, the same in both layouts: (role, layer, module, A/B) or (value, head)."""
    match = re.search(r"layers\.(\d+)\.(.+?)\.lora_([AB])\.(\w+)\.weight$", name)
    if match:
        role = "value" if match.group(4) == "value" or name.startswith("value_model.") else "policy"
        return role, int(match.group(1)), match.group(2), match.group(3)
    assert "score" in name, name
    return "value", "score"


def recording_trainer_class():
    import trl_ext

    class Recording(trl_ext.PPOTrainer):
        """Keeps each update's rollout tensors and the gradients of every optimizer step."""

        def score_rollouts(self, rollout):
            super().score_rollouts(rollout)
            self.rollouts.append({k: getattr(rollout, k).clone() for k in ("scores", "values", "ref_logprobs",
                                                                            "logprobs")})

        def train(self, *args, **kwargs):
            self.rollouts, self.grads = [], []
            model = self.accelerator.unwrap_model(self.model)
            names = {id(p): canonical(n) for n, p in model.named_parameters() if p.requires_grad}
            inner = self.optimizer.optimizer
            step = inner.step

            def recording_step(*a, **k):
                self.grads.append({names[id(p)]: p.grad.clone() for group in inner.param_groups
                                   for p in group["params"] if p.grad is not None})
                return step(*a, **k)

            inner.step = recording_step
            return super().train(*args, **kwargs)

    return Recording


def run(base_path, reward_adapter, tok, data, tmp_path, *, shared, checkpointing, settings=None, **kwargs):
    """A recording run (``settings``: config overrides; ``kwargs``: more trainer arguments)."""
    import trl_ext

    policy, reward, value = build_models(base_path, reward_adapter, shared=shared, checkpointing=checkpointing)
    trainer = recording_trainer_class()(
        args=trl_ext.PPOConfig(**config_kwargs(tmp_path, **(settings or {}))), processing_class=tok, model=policy,
        ref_model=None, reward_model=reward, train_dataset=data[0], value_model=value, eval_dataset=data[1], **kwargs,
    )
    trainer.train()
    return trainer


def assert_close_tensors(a: dict, b: dict, what):
    assert a.keys() == b.keys(), what
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=1e-5, rtol=1e-5, msg=lambda m: f"{what} {key}: {m}")


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no_checkpointing", "checkpointing"])
def test_shared_base_gives_the_numbers_of_separate_models(tiny_models, reward_adapter, tok, data, tmp_path,
                                                          checkpointing, monkeypatch):
    separate = run(tiny_models.policy, reward_adapter, tok, data, tmp_path / "separate", shared=False,
                   checkpointing=checkpointing)
    shared = run(tiny_models.policy, reward_adapter, tok, data, tmp_path / "shared", shared=True,
                 checkpointing=checkpointing)

    # one base: policy, reference, reward and value share its weights; the reward adapter is frozen
    policy = shared.accelerator.unwrap_model(shared.model).policy
    assert shared.reward_model.policy is policy and shared.model.value_model.policy is policy
    trainable = {canonical(n) for n, p in shared.accelerator.unwrap_model(shared.model).named_parameters()
                 if p.requires_grad}
    assert {key[0] for key in trainable} == {"policy", "value"} and ("value", "score") in trainable
    assert not any(p.requires_grad for n, p in policy.named_parameters() if ".reward." in n)
    assert not shared.reward_model.score.weight.requires_grad
    in_optimizer = {id(p) for group in shared.optimizer.param_groups for p in group["params"]}
    assert id(shared.reward_model.score.weight) not in in_optimizer

    # same rollouts (scores, values, reference and policy log-probs) in each of the 3 updates
    assert len(shared.rollouts) == len(separate.rollouts) == 3
    for update, (a, b) in enumerate(zip(shared.rollouts, separate.rollouts)):
        assert_close_tensors(a, b, f"update {update + 1}")
    # same gradient of every trainable tensor at every optimizer step (3 updates x 2 PPO epochs)
    assert len(shared.grads) == len(separate.grads) == 6
    for step, (a, b) in enumerate(zip(shared.grads, separate.grads)):
        assert len(a) == len(trainable)
        assert_close_tensors(a, b, f"optimizer step {step + 1}")
    # same logged metrics; the run moved (KL from 0: LoRA starts as the reference)
    logs, reference = update_logs(shared), update_logs(separate)
    assert len(logs) == 3
    for got, expected in zip(logs, reference):
        for key, value in expected.items():
            if not key.startswith(EXCLUDED_PREFIXES):
                assert got[key] == pytest.approx(value, abs=1e-5, rel=1e-5), (expected["step"], key)
    assert abs(logs[0]["objective/kl"]) < 1e-6 < abs(logs[-1]["objective/kl"])

    if checkpointing:
        # The trap this guards against: without restoring the value adapter when the backward pass recomputes the
        # value model's checkpointed layers, the value gradients come out wrong (and silently so).
        from trl_ext.models.shared_base import AdapterSwitch

        monkeypatch.setattr(AdapterSwitch, "protect_checkpointing", lambda self: 0)
        naive = run(tiny_models.policy, reward_adapter, tok, data, tmp_path / "naive", shared=True,
                    checkpointing=True)
        first, expected = naive.grads[0], separate.grads[0]
        value_keys = [k for k in expected if k[0] == "value" and k != ("value", "score")]
        worst = max(((first[k] - expected[k]).norm() / expected[k].norm()).item() for k in value_keys)
        assert worst > 0.1, worst


def test_shared_base_with_tools_gives_the_numbers_of_separate_models(tool_models, tmp_path):
    """The same parity with `tools=[add]`: a LoRA policy that calls `add` (fixture `tool_models`), reward and value
    adapters from one adapter saved on its base, 2 updates of multi-turn episodes (GAE across the tool results):
    the same rollouts, gradients and logged metrics with the adapters on the policy's base as with separate models,
    and the tool was called in every update."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from trl_ext.testing import save_scalar_adapter
    from trl_ext.testing.tools import ADD_PAIRS, add

    tok = AutoTokenizer.from_pretrained(tool_models / "tok")
    adapter = save_scalar_adapter(tool_models / "caller", tmp_path / "adapter")
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Add {a} and {b}."}]} for a, b in ADD_PAIRS])
    settings = dict(total_episodes=8, response_length=64, temperature=0.3, num_sample_generations=0)
    runs = [run(tool_models / "caller", adapter, tok, (prompts, None), tmp_path / layout, shared=layout == "shared",
                checkpointing=False, settings=settings, tools=[add]) for layout in ("separate", "shared")]
    separate, shared = runs
    assert shared.reward_model.policy is shared.accelerator.unwrap_model(shared.model).policy
    assert len(shared.rollouts) == len(separate.rollouts) == 2
    for update, (a, b) in enumerate(zip(shared.rollouts, separate.rollouts)):
        assert_close_tensors(a, b, f"update {update + 1}")
    assert len(shared.grads) == len(separate.grads) == 4  # 2 updates x 2 PPO epochs
    for step, (a, b) in enumerate(zip(shared.grads, separate.grads)):
        assert_close_tensors(a, b, f"optimizer step {step + 1}")
    logs, reference = update_logs(shared), update_logs(separate)
    for got, expected in zip(logs, reference):
        assert expected["tools/call_frequency"] > 0 and expected["episodes/observation_tokens_mean"] > 0
        for key, value in expected.items():
            if not key.startswith(EXCLUDED_PREFIXES):
                assert got[key] == pytest.approx(value, abs=1e-5, rel=1e-5), (expected["step"], key)
    assert abs(logs[-1]["objective/kl"]) > 1e-6  # the run moved
