"""The objective keys inside trl_ext.PPOTrainer on the tiny models: with a critic-free estimator (dynamic sampling
with a binary reward, every clip, entropy bonus, low_var_kl in the loss, masked truncations, the global token mean)
and with GAE (CISPO, GSPO, Dr. GRPO aggregation, k2 in the reward), across a resume and with a shared base."""

from __future__ import annotations

import pytest
import torch

from ppo_helpers import config_kwargs, left_tokenizer, load_models, prompt_dataset, seed_all, update_logs

CRITIC_FREE = dict(advantage_estimator="grpo", num_samples_per_prompt=2, loss_aggregation="global_token_mean",
                   cliprange_high=0.28, dual_clip=3.0, delta=4.0, entropy_coef=0.01, kl_estimator="low_var_kl",
                   mask_truncated_completions=True, dynamic_sampling=True, max_sampling_rounds=3)
GAE = dict(loss_aggregation="seq_mean_token_sum_norm", policy_loss="cispo", cliprange_high=1.0,
           ratio_level="sequence", kl_estimator="k2", entropy_coef=0.01)


@pytest.fixture(scope="module")
def tok(tiny_models):
    return left_tokenizer(tiny_models)


@pytest.fixture(scope="module")
def data(tok):
    return prompt_dataset(tok, n=8), prompt_dataset(tok, n=4, seed=5)


def recording_trainer():
    """Records each update's rollout; the score is binary (reward model's score > 0), so groups of equal scores
    are frequent with 2 samples per prompt, as with a verifiable reward."""
    import trl_ext

    class Recording(trl_ext.PPOTrainer):
        rollouts = []

        def compute_scores(self, postprocessed_query_response, context_length):
            return (super().compute_scores(postprocessed_query_response, context_length) > 0).float()

        def compute_advantages(self, rollout):
            super().compute_advantages(rollout)
            type(self).rollouts.append(rollout)

    return Recording


def make(tiny_models, tok, data, out, keys, cls=None, **overrides):
    import trl_ext

    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    kwargs = dict(dict(keys, total_episodes=8, num_sample_generations=0), **overrides)
    return (cls or recording_trainer())(
        args=trl_ext.PPOConfig(**config_kwargs(out, **kwargs)), processing_class=tok, model=policy, ref_model=None,
        reward_model=reward, train_dataset=data[0], value_model=None if "advantage_estimator" in keys else value,
        eval_dataset=data[1],
    )


def test_critic_free_with_every_objective_key_and_dynamic_sampling(tiny_models, tok, data, tmp_path):
    trainer = make(tiny_models, tok, data, tmp_path, CRITIC_FREE)
    trainer.train()
    logs, rollouts = update_logs(trainer), type(trainer).rollouts
    assert len(logs) == len(rollouts) == 2 and trainer.state.episode == 8
    for entry, rollout in zip(logs, rollouts):
        assert rollout.responses.shape[0] == 4 and torch.equal(rollout.queries[0::2], rollout.queries[1::2])
        groups = rollout.scores.view(-1, 2)
        informative = (groups[:, 0] != groups[:, 1]).sum().item()
        # the informative groups come first; the rest refills a batch still short after the last round
        assert informative == 2 - entry["sampling/groups_refilled"]
        assert (groups[:informative, 0] != groups[:informative, 1]).all()
        assert entry["sampling/completions"] == 4 * entry["sampling/rounds"]
        assert entry["sampling/rounds"] == 1 or informative < 2 or entry["sampling/groups_dropped"] > 0
        for key in ("policy/clipfrac_low", "policy/clipfrac_high", "policy/dual_clipfrac", "loss/entropy_avg",
                    "objective/frac_truncated", "loss/kl_avg"):
            assert key in entry and entry[key] == entry[key], key  # logged and not NaN
        assert entry["objective/frac_truncated"] == pytest.approx((~rollout.contain_eos_token).float().mean().item())
        # most completions of the tiny model miss the stop token: only the others count in the loss
        assert entry["loss/kl_avg"] >= 0 and (entry["loss/entropy_avg"] > 0) == (entry["objective/frac_truncated"] < 1)
        # objective/kl (what the controller reads) is the sum of the loss's low_var_kl over the response
        kl, mask = rollout.kl, ~rollout.padding_mask
        logr = (rollout.ref_logprobs - rollout.logprobs).clamp(-20, 20)
        torch.testing.assert_close(kl[mask], ((logr.exp() - 1) - logr).clamp(-10, 10)[mask])
    # with a binary reward some round met a group of equal scores: the loop resampled or refilled
    assert any(e["sampling/rounds"] > 1 or e["sampling/groups_refilled"] > 0 for e in logs)


def test_gae_with_cispo_gspo_dr_grpo_and_k2(tiny_models, tok, data, tmp_path):
    trainer = make(tiny_models, tok, data, tmp_path, GAE)
    trainer.train()
    logs, rollouts = update_logs(trainer), type(trainer).rollouts
    assert len(logs) == 2 and "loss/value_avg" in logs[0]
    for entry, rollout in zip(logs, rollouts):
        mask = ~rollout.padding_mask
        half_sq = 0.5 * (rollout.ref_logprobs - rollout.logprobs) ** 2  # k2 in the reward
        torch.testing.assert_close(rollout.kl[mask], half_sq[mask])
        assert entry["objective/kl"] == pytest.approx((rollout.kl * mask).sum(1).mean().item(), rel=1e-5)
        assert "policy/cispo_clipfrac" in entry and "policy/clipfrac_high" not in entry
        assert entry["loss/entropy_avg"] > 0 and entry["loss/policy_avg"] == entry["loss/policy_avg"]


def test_critic_free_objectives_resume_to_the_same_numbers(tiny_models, tok, data, tmp_path):
    """Dynamic sampling draws extra prompt batches; a resumed run draws the same ones (prompt stream and RNG)."""
    full = make(tiny_models, tok, data, tmp_path / "full", CRITIC_FREE, total_episodes=12, save_strategy="steps",
                save_steps=1)
    full.train()
    resumed = make(tiny_models, tok, data, tmp_path / "full", CRITIC_FREE, total_episodes=12)
    resumed.train(resume_from_checkpoint=str(tmp_path / "full" / "checkpoint-2"))
    reference, logs = update_logs(full)[2], update_logs(resumed)[-1]
    for key in ("objective/kl", "objective/scores", "loss/policy_avg", "sampling/rounds", "sampling/completions",
                "loss/entropy_avg", "policy/clipfrac_high"):
        assert logs[key] == pytest.approx(reference[key], abs=1e-6), key
    weights = [dict(t.accelerator.unwrap_model(t.model).policy.named_parameters()) for t in (full, resumed)]
    for name, param in weights[0].items():
        torch.testing.assert_close(param, weights[1][name], msg=name)


def test_objective_keys_with_a_shared_base(tiny_models, reward_adapter, tok, data, tmp_path):
    """Reward and value as adapters on the policy's base, GAE with clip-higher, dual clip, entropy bonus and the
    global token mean: trains, and the policy adapter moves while the reward adapter does not."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    import trl_ext
    from trl_ext.models.shared_base import add_scalar_adapter

    seed_all(0)
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_models.policy),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    reward = add_scalar_adapter(policy, "reward", source=reward_adapter, trainable=False)
    value = add_scalar_adapter(policy, "value", source=reward_adapter, trainable=True)
    before = {n: p.detach().clone() for n, p in policy.named_parameters() if "lora" in n}
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, total_episodes=4, num_sample_generations=0,
                                             loss_aggregation="global_token_mean", cliprange_high=0.28,
                                             dual_clip=3.0, entropy_coef=0.01, kl_estimator="k3"))
    trainer = trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                                 train_dataset=data[0], value_model=value)
    assert trainer.shared_base
    trainer.train()
    (entry,) = update_logs(trainer)
    assert entry["loss/entropy_avg"] > 0 and "policy/dual_clipfrac" in entry
    moved = {n for n, p in policy.named_parameters() if "lora" in n and not torch.equal(p, before[n])}
    assert any(".default." in n for n in moved) and not any(".reward." in n for n in moved)


def test_dynamic_sampling_with_reward_functions_keeps_each_completion_with_its_rewards(tiny_models, tok, tmp_path):
    """A verifier-like binary reward function (first token's parity) with its dataset column and a logged extra
    column: every round is scored with its own prompts and columns, and after the groups are selected each episode
    keeps its own completion, prompt, answer and reward (`rollout.reward_scores` follows the selection)."""
    from datasets import Dataset

    import trl_ext
    from trl_ext.testing import tiny_corpus

    texts = [" ".join(line.split()[:3]) for line in tiny_corpus(8, seed=4)]
    dataset = Dataset.from_dict({"input_ids": [tok(t)["input_ids"] for t in texts], "prompt": texts,
                                 "answer": [f"#{i}" for i in range(len(texts))]})
    calls = []

    def parity(prompts, completions, completion_ids, answer, log_extra, **kwargs):
        calls.append(len(completions))
        log_extra("answer_seen", list(answer))
        return [float(ids[0] % 2) for ids in completion_ids]

    cls = recording_trainer()
    cls.compute_scores = trl_ext.PPOTrainer.compute_scores  # the reward function's score, not the binarised model's
    seed_all(0)
    policy = load_models(tiny_models)[0]
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, total_episodes=8, num_sample_generations=0,
                                             advantage_estimator="grpo", num_samples_per_prompt=2,
                                             dynamic_sampling=True, max_sampling_rounds=3))
    trainer = cls(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=None,
                  train_dataset=dataset, value_model=None, reward_funcs=[parity])
    trainer.train()
    logs = update_logs(trainer)
    assert sum(calls) == sum(e["sampling/completions"] for e in logs) > 8  # every round scored, some resampled
    for rollout in cls.rollouts:
        scores = rollout.reward_scores
        assert torch.equal(rollout.scores, scores.score) and len(scores.completions) == 4
        first_tokens = rollout.postprocessed_responses[:, 0] % 2
        assert scores.per_reward[:, 0].tolist() == first_tokens.float().tolist()
        row_of_prompt = {text: i for i, text in enumerate(texts)}
        assert scores.extra_columns["answer_seen"] == [f"#{row_of_prompt[p]}" for p in scores.prompts]
        assert tok.batch_decode(rollout.queries, skip_special_tokens=True) == scores.prompts  # same rows
        assert tok.batch_decode(rollout.postprocessed_responses, skip_special_tokens=True) == scores.completions
