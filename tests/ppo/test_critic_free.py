"""Critic-free PPO (RLOO, GRPO, REINFORCE++) in trl_ext.PPOTrainer: config refusals, the rollout's groups, the
estimators' numbers inside the trainer, no value model anywhere, the metrics, KL in the loss under a controller."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ppo_helpers import config_kwargs, load_models, prompt_dataset, seed_all, update_logs


def make(tiny_models, tok, data, out, trainer_cls=None, value_model=None, **overrides):
    import trl_ext

    seed_all(0)
    policy, _, reward = load_models(tiny_models)
    kwargs = dict(advantage_estimator="rloo", num_samples_per_prompt=2, total_episodes=8, num_sample_generations=0)
    kwargs.update(overrides)
    return (trainer_cls or trl_ext.PPOTrainer)(
        args=trl_ext.PPOConfig(**config_kwargs(out, **kwargs)), processing_class=tok, model=policy, ref_model=None,
        reward_model=reward, train_dataset=data[0], value_model=value_model, eval_dataset=data[1],
    )


@pytest.mark.parametrize("overrides, message", [
    (dict(advantage_estimator="ppo"), "advantage_estimator: invalid choice 'ppo' \\(valid: one of gae, rloo"),
    (dict(advantage_estimator="grpo"), "num_samples_per_prompt: advantage_estimator 'grpo' compares the samples"),
    (dict(advantage_estimator="rloo", num_samples_per_prompt=3), "num_samples_per_prompt: 3 does not divide the "
     "episodes per update and process, per_device_train_batch_size \\* gradient_accumulation_steps = 4"),
    (dict(num_samples_per_prompt=0), "num_samples_per_prompt: 0 is out of range \\(valid: an integer >= 1\\)"),
    (dict(kl_in="loss"), "kl_in: 'loss' needs a critic-free advantage_estimator"),
    (dict(advantage_estimator="reinforce_pp", kl_in="value"), "kl_in: invalid choice 'value'"),
    (dict(advantage_estimator="reinforce_pp", whiten_rewards=True, per_device_train_batch_size=8),
     "whiten_rewards: applies to advantage_estimator 'gae' only"),
])
def test_config_refuses_wrong_combinations_in_one_line(tmp_path, overrides, message):
    import trl_ext
    from trl_ext.errors import UserInputError

    with pytest.raises(UserInputError, match=f"^{message}") as caught:
        trl_ext.PPOConfig(**config_kwargs(tmp_path, **overrides))
    assert "\n" not in str(caught.value)


def test_kl_in_defaults_follow_the_papers(tmp_path):
    import trl_ext

    def kl_in(**kw):
        return trl_ext.PPOConfig(**config_kwargs(tmp_path, num_samples_per_prompt=2, **kw)).kl_in

    assert kl_in(advantage_estimator="grpo") == "loss"
    assert kl_in(advantage_estimator="rloo") == kl_in(advantage_estimator="reinforce_pp") == kl_in() == "reward"


def test_value_model_must_match_the_estimator(tiny_models, tok, data, tmp_path):
    from trl_ext.errors import UserInputError

    value = load_models(tiny_models)[1]
    with pytest.raises(UserInputError, match="^value_model: advantage_estimator 'rloo' uses no value model"):
        make(tiny_models, tok, data, tmp_path, value_model=value)
    with pytest.raises(UserInputError, match="^value_model: None, but advantage_estimator 'gae' needs"):
        make(tiny_models, tok, data, tmp_path, advantage_estimator="gae", num_samples_per_prompt=1)


def test_gae_keeps_its_value_model_and_one_sample_per_prompt_keeps_the_batch():
    from trl_ext.ppo.objective.critic import check_value_model
    from trl_ext.ppo.rollout.prompt_stream import repeat_prompts

    value = object()
    assert check_value_model(SimpleNamespace(critic_free=False), value) is value
    batch = {"input_ids": torch.tensor([[1, 2], [3, 4]]), "answer": ["a", "b"], "split": "train"}
    assert repeat_prompts(batch, 1) is batch
    assert repeat_prompts(batch, 2)["answer"] == ["a", "a", "b", "b"] and repeat_prompts(batch, 2)["split"] == "train"


def test_grouped_prompts_come_in_the_parents_order_without_a_partial_batch(tiny_models, tok, tmp_path):
    """k = 2 rebuilds the prompt loader (2 prompts per update instead of 4): over 9 prompts it must give the
    shuffled order of the parent's loader (k = 1, same seed) and drop the odd one out, as the parent does."""
    data = prompt_dataset(tok, n=9), prompt_dataset(tok, n=4, seed=5)
    orders = {}
    for k, estimator in ((1, "reinforce_pp"), (2, "grpo")):
        trainer = make(tiny_models, tok, data, tmp_path / str(k), advantage_estimator=estimator,
                       num_samples_per_prompt=k)
        orders[k] = [tuple(t for t in row.tolist() if t != tok.pad_token_id)  # the collator's left padding out
                     for batch in trainer.dataloader for row in batch["input_ids"]]
    dataset_order = [tuple(row) for row in data[0]["input_ids"]]
    assert len(orders[2]) == 8 and len(set(orders[2])) == 8 and set(orders[2]) <= set(dataset_order)
    assert orders[2] == orders[1]
    assert orders[1] != dataset_order[:8]  # shuffled


def recording_trainer():
    import trl_ext

    class Recording(trl_ext.PPOTrainer):
        rollouts = []

        def compute_advantages(self, rollout):
            super().compute_advantages(rollout)
            self.rollouts.append(rollout)

    Recording.rollouts = []
    return Recording


@pytest.mark.parametrize("estimator", ["rloo", "grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_groups_and_advantages_in_the_trainer(tiny_models, tok, data, tmp_path, estimator):
    """Each prompt sampled k = 2 times in consecutive rows; the advantages are the estimator's on the trainer's own
    scores and KL; no value model is trained, saved or logged."""
    from trl_ext.ppo.objective.advantages import grpo_advantages, reinforce_pp_advantages, rloo_advantages
    from trl_ext.ppo.objective.critic import NoValueModel

    cls = recording_trainer()
    trainer = make(tiny_models, tok, data, tmp_path, trainer_cls=cls, advantage_estimator=estimator,
                   save_strategy="steps", save_steps=2)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    assert isinstance(unwrapped.value_model, NoValueModel)
    trainable = {id(p) for p in unwrapped.policy.parameters()}
    assert all(id(p) in trainable for group in trainer.optimizer.param_groups for p in group["params"])
    assert trainer.dataloader.total_batch_size == 2  # local_batch_size 4 episodes = 2 prompts x 2 samples
    trainer.train()
    assert len(cls.rollouts) == 2 and trainer.state.episode == 8
    for rollout in cls.rollouts:
        assert rollout.queries.shape[0] == 4
        assert torch.equal(rollout.queries[0::2], rollout.queries[1::2])  # groups: consecutive rows
        assert not torch.equal(rollout.queries[0], rollout.queries[2])
        mask = ~rollout.padding_mask
        kl_coef = trainer.args.kl_coef if trainer.args.kl_in == "reward" else 0.0  # the fixed controller's
        if estimator.startswith("reinforce_pp"):  # the score (minus its group's mean) on the last counted token
            scores = rollout.scores
            if estimator == "reinforce_pp_baseline":
                scores = scores - scores.view(-1, 2).mean(1).repeat_interleave(2)
            rewards = -kl_coef * rollout.kl * mask
            rewards[torch.arange(4), mask.sum(1) - 1] += scores
            expected = reinforce_pp_advantages(rewards, mask)
        else:
            rewards = rollout.scores - kl_coef * (rollout.kl * mask).sum(1)
            fn = rloo_advantages if estimator == "rloo" else grpo_advantages
            expected = fn(rewards, 2).unsqueeze(1) * mask
        torch.testing.assert_close(rollout.advantages, expected)
        assert rollout.advantages.abs().sum() > 0
    if estimator == "rloo":  # the leave-one-out advantages of a pair are opposite
        per_seq = cls.rollouts[0].estimator_stats["sequence_advantages"].view(-1, 2)
        torch.testing.assert_close(per_seq[:, 0], -per_seq[:, 1])
    logs = update_logs(trainer)
    for entry in logs:
        assert not [key for key in entry if key.startswith("val/") or key == "loss/value_avg"]
        for key in ("objective/group_scores_std", "objective/frac_groups_equal_scores", "objective/advantages_abs",
                    "policy/ratio_avg", "policy/ratio_var", "objective/num_eos_tokens"):
            assert key in entry, key
        assert ("loss/kl_avg" in entry) == (estimator == "grpo")
    scores = cls.rollouts[0].scores.view(-1, 2)
    assert logs[0]["objective/group_scores_std"] == pytest.approx(scores.std(1).mean().item(), abs=1e-6)
    checkpoint = tmp_path / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file() and not (checkpoint / "value_model").exists()


def test_group_metrics_count_groups_with_equal_scores():
    from trl_ext.ppo.objective.critic import critic_free_metrics

    metrics = {"loss/value_avg": 1.0, "val/clipfrac_avg": 0.0, "val/ratio": 1.0, "val/ratio_var": 0.0,
               "val/num_eos_tokens": 3}
    rollout = SimpleNamespace(scores=torch.tensor([1.0, 1.0, 2.0, 3.0]), estimator_stats={}, turn_rewards=None,
                              advantages=torch.tensor([[0.0, 0.0], [0.0, 0.0], [-1.0, -1.0], [1.0, 0.0]]),
                              padding_mask=torch.tensor([[False, False]] * 3 + [[False, True]]))
    stats = SimpleNamespace(kl_losses=[])
    metrics = critic_free_metrics(metrics, rollout, stats, 2, lambda t: t)
    assert metrics["objective/frac_groups_equal_scores"] == 0.5
    assert metrics["objective/group_scores_std"] == pytest.approx((0 + 2**-0.5) / 2)
    assert metrics["objective/advantages_abs"] == pytest.approx(3 / 7)
    assert not [key for key in metrics if key.startswith("val/")] and metrics["objective/num_eos_tokens"] == 3
    single = {"loss/value_avg": 1.0, "val/clipfrac_avg": 0.0, "val/ratio": 1.0, "val/ratio_var": 0.0,
              "val/num_eos_tokens": 3}  # one sample per prompt (reinforce_pp): no groups, no group metrics
    single = critic_free_metrics(single, rollout, stats, 1, lambda t: t)
    assert not [key for key in single if "group" in key]


def test_kl_in_loss_follows_the_adaptive_controller(tiny_models, tok, data, tmp_path):
    """GRPO's k3 term in the loss, its coefficient from the adaptive controller: the coefficient moves by the
    controller's formula from the logged KL, and the loss term is 0 at the first micro-batch (policy = reference)."""
    from trl_ext.ppo.objective.kl_controllers import AdaptiveKLController

    trainer = make(tiny_models, tok, data, tmp_path, advantage_estimator="grpo", total_episodes=12,
                   kl_controller="adaptive", kl_target=0.01, kl_horizon=8)
    trainer.train()
    logs = update_logs(trainer)
    controller = AdaptiveKLController(0.05, 0.01, 8)
    for entry in logs:
        assert entry["objective/kl_coef"] == pytest.approx(controller.value)
        assert entry["loss/kl_avg"] >= 0
        controller.update(entry["objective/kl"], 4)
    assert len({e["objective/kl_coef"] for e in logs}) == 3
    assert logs[-1]["loss/kl_avg"] > 0
