"""``critic_warmup`` (trl_ext/ppo/objective/critic_warmup.py): the first updates train the value model alone. On the
tiny models, 3 updates of 2 PPO epochs with a warm-up of 2: the policy's parameters are bit-identical after each
warm-up update and its optimizer state empty, the value model's move every update, and at update 3 the policy takes
its first Adam steps; with the pretraining mix no ptx batch is drawn or stepped on while the policy is held."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

import trl_ext

from ppo_helpers import config_kwargs, load_models, ptx_dataset, seed_all, update_logs


class Snapshots(TrainerCallback):
    """The policy's and the value model's parameters (copies) after each update."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.policy, self.value = [self.copy("policy")], [self.copy("value_model")]

    def copy(self, part: str) -> list[torch.Tensor]:
        wrapper = self.trainer.accelerator.unwrap_model(self.trainer.model)
        return [p.detach().clone() for p in getattr(wrapper, part).parameters()]

    def on_step_end(self, args, state, control, **kwargs):
        self.policy.append(self.copy("policy"))
        self.value.append(self.copy("value_model"))


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def run(tiny_models, tmp_path, **overrides):
    from ppo_helpers import left_tokenizer, prompt_dataset

    seed_all(0)
    tok = left_tokenizer(tiny_models)
    policy, value, reward = load_models(tiny_models)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, num_sample_generations=0, **overrides))
    trainer = trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                                 train_dataset=prompt_dataset(tok), value_model=value,
                                 ptx_dataset=ptx_dataset() if args.ptx_coef > 0 else None)
    snapshots = Snapshots(trainer)
    trainer.add_callback(snapshots)
    if trainer.ptx is not None:  # count the ptx batches drawn, per update
        draw, trainer.ptx_batches = trainer.ptx.next_batch, []
        trainer.ptx.next_batch = lambda: trainer.ptx_batches.append(trainer.state.global_step + 1) or draw()
    trainer.train()
    return trainer, snapshots


@pytest.mark.parametrize("ptx", [{}, {"ptx_coef": 0.5, "ptx_mode": "joint"}, {"ptx_coef": 0.5, "ptx_mode": "separate"}],
                         ids=["plain", "ptx-joint", "ptx-separate"])
def test_the_policy_is_held_bit_for_bit_then_moves(tiny_models, tmp_path, ptx):
    trainer, snap = run(tiny_models, tmp_path, critic_warmup=2, **ptx)  # 12 episodes: 3 updates of 4, 2 epochs each
    logs = update_logs(trainer)
    assert [log["critic/warmup"] for log in logs] == [1.0, 1.0, 0.0]
    assert len(snap.policy) == 4
    assert same(snap.policy[1], snap.policy[0]) and same(snap.policy[2], snap.policy[0])  # held, bit for bit
    assert not same(snap.value[1], snap.value[0]) and not same(snap.value[2], snap.value[1])  # the critic trains
    assert not same(snap.policy[3], snap.policy[2])  # update 3: the policy moves
    optimizer = trainer.optimizer.optimizer
    wrapper = trainer.accelerator.unwrap_model(trainer.model)
    policy_steps = {int(optimizer.state[p]["step"]) for p in wrapper.policy.parameters() if p in optimizer.state}
    value_steps = {int(optimizer.state[p]["step"]) for p in wrapper.value_model.parameters()}
    # the value model stepped twice per update (2 epochs) from the start; the policy's Adam state began at update 3
    # (the separate ptx steps count there too)
    assert value_steps == {6} and policy_steps == ({4} if ptx.get("ptx_mode") == "separate" else {2})
    if ptx:  # no ptx loss while held (none drawn, none stepped), one at update 3
        assert ["loss/ptx_avg" in log for log in logs] == [False, False, True]
        # joint: one per micro-batch (2 per mini-batch, 2 epochs); separate: one per optimizer step
        assert trainer.ptx_batches == [3] * (4 if ptx["ptx_mode"] == "joint" else 2)


def test_off_by_default_logs_no_warmup_and_the_policy_moves_at_once(tiny_models, tmp_path):
    trainer, snap = run(tiny_models, tmp_path, total_episodes=4)
    assert trainer.critic_warmup is None and not trainer.policy_held
    assert "critic/warmup" not in update_logs(trainer)[0]
    assert not same(snap.policy[1], snap.policy[0])


def test_the_rules_of_critic_warmup(tmp_path):
    from trl_ext.errors import UserInputError

    with pytest.raises(UserInputError, match=r"^critic_warmup: -1 is out of range \(valid: an integer >= 0\)$"):
        trl_ext.PPOConfig(**config_kwargs(tmp_path, critic_warmup=-1))
    with pytest.raises(UserInputError, match=r"^critic_warmup: 2 sets the value model, and advantage_estimator "
                                             r"'rloo' has none; remove it, or set advantage_estimator to 'gae'$"):
        trl_ext.PPOConfig(**config_kwargs(tmp_path, critic_warmup=2, advantage_estimator="rloo",
                                          num_samples_per_prompt=2))


def test_the_held_parameters_are_the_policys_alone_also_on_a_shared_base(tiny_models):
    """With a separate value model every trainable parameter of the policy is held; on a shared base the value adapter
    lives in the policy's model and still trains: only the policy's own adapter is held."""
    from types import SimpleNamespace

    from peft import LoraConfig, get_peft_model

    from trl_ext.models.shared_base import add_scalar_adapter
    from trl_ext.ppo.objective.critic_warmup import policy_only_parameters

    policy, value, _ = load_models(tiny_models)
    held = policy_only_parameters(SimpleNamespace(policy=policy, value_model=value))
    assert [id(p) for p in held] == [id(p) for p in policy.parameters() if p.requires_grad]
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    policy = get_peft_model(policy, lora)
    value = add_scalar_adapter(policy, "value", lora_config=lora, trainable=True)
    held = {id(p) for p in policy_only_parameters(SimpleNamespace(policy=policy, value_model=value))}
    names = {name for name, p in policy.named_parameters() if id(p) in held}
    assert names and all(".default." in name for name in names)
    assert names == {name for name, p in policy.named_parameters() if ".default." in name and p.requires_grad}
    assert not held & {id(p) for p in value.parameters()}  # the value head trains
    assert any(".value." in name and p.requires_grad for name, p in policy.named_parameters())  # and its adapter
