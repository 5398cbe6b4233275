"""The objective keys inside trl_ext.PPOTrainer on the tiny models: with a critic-free estimator (dynamic sampling
with a binary reward, every clip, entropy bonus, low_var_kl in the loss, masked truncations, the global token mean)
and with GAE (CISPO, GSPO, Dr. GRPO aggregation, k2 in the reward), across a resume and with a shared base; and
for each aggregation, policy loss, ratio level and clip, and for the KL in the loss, the logged value of the first
mini-batch (ratios planted off-policy) against the papers' formulas by hand."""

from __future__ import annotations

import pytest
import torch

from ppo_helpers import config_kwargs, load_models, seed_all, update_logs

CRITIC_FREE = dict(advantage_estimator="grpo", num_samples_per_prompt=2, loss_aggregation="global_token_mean",
                   cliprange_high=0.28, dual_clip=3.0, delta=4.0, entropy_coef=0.01, kl_estimator="low_var_kl",
                   mask_truncated_completions=True, dynamic_sampling=True, max_sampling_rounds=3)
GAE = dict(loss_aggregation="seq_mean_token_sum_norm", policy_loss="cispo", cliprange_high=1.0,
           ratio_level="sequence", kl_estimator="k2", entropy_coef=0.01)


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
        # the metrics this combination logs (their values by hand: test_logged_policy_loss_of_each_objective_key...)
        assert {"policy/clipfrac_low", "policy/clipfrac_high", "policy/dual_clipfrac", "loss/entropy_avg",
                "objective/frac_truncated", "loss/kl_avg"} <= entry.keys()
        assert entry["objective/frac_truncated"] == pytest.approx((~rollout.contain_eos_token).float().mean().item())
        # most completions of the tiny model miss the stop token: only the others count in the loss
        assert (entry["loss/entropy_avg"] > 0) == (entry["objective/frac_truncated"] < 1)
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
        assert entry["loss/entropy_avg"] > 0


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
    keeps its own completion, prompt, answer and reward (`rollout.reward_scores` follows the selection). A completion
    is the response's tokens before its first pad (the tiny model samples its pad token now and then)."""
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
        return [float(ids[0] % 2) if ids else 0.0 for ids in completion_ids]

    def before_pad(row):
        row = row.tolist()
        return row[:row.index(tok.pad_token_id)] if tok.pad_token_id in row else row

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
        completion_ids = [before_pad(row) for row in rollout.postprocessed_responses]
        assert scores.per_reward[:, 0].tolist() == [float(ids[0] % 2) if ids else 0.0 for ids in completion_ids]
        row_of_prompt = {text: i for i, text in enumerate(texts)}
        assert scores.extra_columns["answer_seen"] == [f"#{row_of_prompt[p]}" for p in scores.prompts]
        assert tok.batch_decode(rollout.queries, skip_special_tokens=True) == scores.prompts  # same rows
        assert tok.batch_decode(completion_ids, skip_special_tokens=True) == scores.completions


# ------------------------------------------------------------------ the logged loss of each objective key, by hand

# log-ratio log pi - log pi_old planted on the response tokens: ratios 0.50 .. 4.95 cross every clip edge below
SHIFTS = torch.tensor([-0.7, 0.9, -0.3, 1.6, -0.1, 0.4, 0.05, 0.15])
# log pi_ref - log pi planted the same way: up to 3, where low_var_kl's clamp of k3 at 10 binds
REF_SHIFTS = torch.tensor([3.0, -0.5, 0.2, -1.0, 2.8, 0.0, -2.0, 0.7])
SETTINGS = {  # name -> PPOConfig keys; cliprange is 0.2
    "token_mean": {},
    "global_token_mean": dict(loss_aggregation="global_token_mean"),
    "seq_mean_token_mean": dict(loss_aggregation="seq_mean_token_mean"),
    "seq_mean_token_sum_norm": dict(loss_aggregation="seq_mean_token_sum_norm"),
    "cispo": dict(policy_loss="cispo", cliprange_high=0.28),
    "sequence_ratio": dict(ratio_level="sequence"),
    "clip_higher": dict(cliprange_high=0.28),
    "dual_clip": dict(dual_clip=3.0),
    "delta": dict(delta=2.0),
}


RECORD = {}  # the last off-policy run's rollout, on-policy log-probs and micro-batch rows


def off_policy_trainer():
    """Plants known log-ratios: after the advantages, the rollout's old log-probs are shifted by -SHIFTS, as if a
    stale policy had sampled it; the first mini-batch (policy not yet stepped) then sees ``r = exp(SHIFTS)``. Records
    the rollout, its on-policy log-probs and each micro-batch's rows. The reference log-probs are set to the
    on-policy ones plus REF_SHIFTS (after the rewards: only a KL in the loss reads them)."""
    import trl_ext

    class OffPolicy(trl_ext.PPOTrainer):
        record = RECORD

        def compute_advantages(self, rollout):
            super().compute_advantages(rollout)
            type(self).record.update(rollout=rollout, on_policy=rollout.logprobs.clone(), micro_batches=[])
            on_policy, padding = rollout.logprobs, rollout.padding_mask
            rollout.logprobs = torch.where(padding, on_policy, on_policy - planted(SHIFTS, on_policy))
            ref = on_policy + planted(REF_SHIFTS, on_policy)
            rollout.ref_logprobs = torch.where(padding, rollout.ref_logprobs, ref)

        def compute_micro_batch_loss(self, model, rollout, micro_batch_inds, ptx_batch=None, **step):
            type(self).record["micro_batches"].append(torch.as_tensor(micro_batch_inds).clone())
            return super().compute_micro_batch_loss(model, rollout, micro_batch_inds, ptx_batch, **step)

    return OffPolicy


def planted(values, like):
    """``values`` cycled along each row, shifted by one position per row, shaped and typed as ``like``."""
    row = values.repeat(like.shape[1] // len(values) + 1)[: like.shape[1]]
    return torch.stack([row.roll(i) for i in range(like.shape[0])]).to(like)


def by_hand(keys: dict, new, old, adv, mask, response_length: int, mini_batch_tokens: float, accumulation: int):
    """One micro-batch's policy loss and clip shares from the papers' formulas (PPO eq. 7, DAPO clip-higher and
    token mean, GRPO's and Dr. GRPO's aggregations, GSPO's sequence ratio, CISPO, dual clip, two-sided delta)."""
    eps_low, eps_high = 0.2, keys.get("cliprange_high", 0.2)
    log_ratio = new - old
    if keys.get("ratio_level") == "sequence":
        seq = (log_ratio * mask).sum(1) / mask.sum(1).clamp(min=1)
        log_ratio = seq[:, None].expand_as(new)
    r = log_ratio.exp()
    stats = {}
    if keys.get("policy_loss") == "cispo":
        per_token = -torch.minimum(r, torch.tensor(1 + eps_high)) * adv * new
        binds = r > 1 + eps_high
        stats["policy/cispo_clipfrac"] = binds & (adv > 0)
    else:
        unclipped = -adv * (torch.minimum(r, torch.tensor(keys["delta"])) if "delta" in keys else r)
        clipped = -adv * r.clamp(1 - eps_low, 1 + eps_high)
        per_token = torch.maximum(unclipped, clipped)
        binds = clipped > unclipped
        if eps_low != eps_high or keys.get("ratio_level") == "sequence":
            stats["policy/clipfrac_low"] = (r < 1 - eps_low) & (adv < 0)
            stats["policy/clipfrac_high"] = (r > 1 + eps_high) & (adv > 0)
    if "dual_clip" in keys:
        dual = (adv < 0) & (-keys["dual_clip"] * adv < per_token)
        per_token = torch.where(dual, -keys["dual_clip"] * adv, per_token)
        stats["policy/dual_clipfrac"] = dual
    total = (per_token * mask).sum()
    loss = {
        "token_mean": total / mask.sum(),
        "global_token_mean": total / (mini_batch_tokens / accumulation),
        "seq_mean_token_mean": ((per_token * mask).sum(1) / mask.sum(1)).mean(),
        "seq_mean_token_sum_norm": total / (mask.shape[0] * response_length),
    }[keys.get("loss_aggregation", "token_mean")]
    shares = {name: (b & mask).sum() / mask.sum() for name, b in dict(stats, **{"policy/clipfrac_avg": binds}).items()}
    return loss, shares


def first_update_by_hand(keys: dict) -> tuple[float, dict]:
    """The logged `loss/policy_avg` and clip shares of the recorded update (one PPO epoch, one mini-batch of two
    micro-batches: every micro-batch on-policy but for the planted ratios) under ``keys``."""
    record = RECORD
    rollout, new = record["rollout"], record["on_policy"]
    mask = ~rollout.padding_mask
    losses, shares = [], {}
    for inds in record["micro_batches"]:
        loss, share = by_hand(keys, new[inds], rollout.logprobs[inds], rollout.advantages[inds], mask[inds], 8,
                              mask.sum().item(), 2)
        losses.append(loss)
        for name, value in share.items():
            shares.setdefault(name, []).append(value)
    return torch.stack(losses).mean().item(), {name: torch.stack(v).mean().item() for name, v in shares.items()}


@pytest.mark.parametrize("name", list(SETTINGS))
def test_logged_policy_loss_of_each_objective_key_is_the_hand_aggregated_one(tiny_models, tok, data, tmp_path, name):
    """The first mini-batch of an update with planted ratios: `loss/policy_avg` and the clip shares are those of the
    key's formula, and that number differs from what every other setting gives on the same batch (so a key that
    does not reach the loss, or a wrong aggregation, fails here)."""
    cls = off_policy_trainer()
    trainer = make(tiny_models, tok, data, tmp_path, SETTINGS[name], cls=cls, total_episodes=4, num_ppo_epochs=1)
    trainer.train()
    (entry,) = update_logs(trainer)
    assert len(cls.record["micro_batches"]) == 2
    assert cls.record["micro_batches"][0].tolist() != cls.record["micro_batches"][1].tolist()
    expected, shares = first_update_by_hand(SETTINGS[name])
    assert entry["loss/policy_avg"] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    for key, value in shares.items():
        assert entry[key] == pytest.approx(value, abs=1e-6), key
    assert 0 < shares["policy/clipfrac_avg"] < 1  # the planted ratios make clips bind on some tokens, not all
    others = {other: first_update_by_hand(keys)[0] for other, keys in SETTINGS.items() if other != name}
    for other, value in others.items():
        assert abs(value - expected) > 1e-3, f"{name} and {other} give the same loss on this batch"


def low_var_kl(logr):
    return ((logr.clamp(-20, 20).exp() - 1) - logr.clamp(-20, 20)).clamp(-10, 10)


KL_IN_LOSS = {  # per-token KL(pi || pi_ref) from logr = log pi_ref - log pi (Schulman 2020; verl's low_var_kl)
    "k1": lambda logr: -logr,
    "k2": lambda logr: 0.5 * logr**2,
    "k3": lambda logr: logr.exp() - 1 - logr,
    "low_var_kl": low_var_kl,
}


@pytest.mark.parametrize("estimator", ["low_var_kl", "k3"])
def test_logged_kl_loss_is_the_hand_aggregated_estimate(tiny_models, tok, data, tmp_path, estimator):
    """`kl_in="loss"`: `loss/kl_avg` of the first mini-batch is the token mean of the estimator of
    ``log pi_ref - log pi`` (planted up to 3, where low_var_kl's clamp binds and it leaves k3), and no other
    estimator gives that number on this batch."""
    cls = off_policy_trainer()
    keys = dict(advantage_estimator="grpo", num_samples_per_prompt=2, kl_in="loss", kl_estimator=estimator)
    trainer = make(tiny_models, tok, data, tmp_path, keys, cls=cls, total_episodes=4, num_ppo_epochs=1)
    trainer.train()
    (entry,) = update_logs(trainer)
    rollout, new = RECORD["rollout"], RECORD["on_policy"]
    mask = ~rollout.padding_mask

    def logged(kl):
        per_micro = [(kl(rollout.ref_logprobs[i] - new[i]) * mask[i]).sum() / mask[i].sum()
                     for i in RECORD["micro_batches"]]
        return torch.stack(per_micro).mean().item()

    expected = {name: logged(kl) for name, kl in KL_IN_LOSS.items()}
    assert entry["loss/kl_avg"] == pytest.approx(expected[estimator], rel=1e-4)
    assert all(abs(value - expected[estimator]) > 1e-2 for name, value in expected.items() if name != estimator)
