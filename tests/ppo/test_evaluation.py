"""Evaluation during training (trl_ext/ppo/evaluation.py) in the real trainer on the tiny models: `eval_strategy:
steps` logs GRPOTrainer's `eval_*` metrics exactly at the asked updates; they are the run's rewards of the greedy
completions of the eval prompts, recomputed here with `generate` one prompt at a time; and the training numbers of a
run with evaluation (sampled, which draws from the RNG) are those of the run without."""

from __future__ import annotations

import statistics

import pytest
import torch

from ppo_helpers import config_kwargs, load_models, seed_all, update_logs

EVAL_KEYS = ("eval_reward", "eval_reward_std", "eval_runtime")


def rows(tok, n: int, seed: int, tag: str, length: int | None = None) -> dict:
    """`n` prompts (of `length` tokens when given, so that no batch pads) with `prompt` and `answer` columns."""
    from trl_ext.testing import tiny_corpus

    texts = []
    for line in tiny_corpus(20 * n, seed=seed):
        text = " ".join(line.split()[:3])
        if length is None or len(tok(text)["input_ids"]) == length:
            texts.append(text)
        if len(texts) == n:
            break
    assert len(texts) == n
    return {"input_ids": [tok(t)["input_ids"] for t in texts], "prompt": texts,
            "answer": [f"{tag}{i}" for i in range(n)]}


def make(tiny_models, tok, out, reward_funcs=None, eval_dataset=None, callbacks=None, **overrides):
    import trl_ext
    from datasets import Dataset

    seed_all(0)
    policy, value_model, reward = load_models(tiny_models)
    kwargs = dict(total_episodes=16, num_sample_generations=0, per_device_train_batch_size=4,
                  gradient_accumulation_steps=1, per_device_eval_batch_size=2)
    kwargs.update(overrides)
    train = rows(tok, 8, seed=4, tag="t")
    if reward_funcs is None:  # the reward model scores: the dataset is token ids only
        train = {"input_ids": train["input_ids"]}
    return trl_ext.PPOTrainer(
        args=trl_ext.PPOConfig(**config_kwargs(out, **kwargs)), processing_class=tok, model=policy, ref_model=None,
        reward_model=None if reward_funcs else reward, train_dataset=Dataset.from_dict(train),
        value_model=value_model, reward_funcs=reward_funcs, eval_dataset=eval_dataset, callbacks=callbacks,
    )


def greedy_ids(policy, tok, prompt_ids: list[int], response_length: int) -> list[int]:
    """One prompt alone, greedy, truncated after the first EOS: the ids a reward function receives."""
    query = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = policy.generate(query, attention_mask=torch.ones_like(query), do_sample=False,
                              max_new_tokens=response_length, pad_token_id=tok.pad_token_id)
    ids = out[0, query.shape[1]:].tolist()
    if tok.eos_token_id in ids:
        ids = ids[: ids.index(tok.eos_token_id) + 1]
    return ids[: ids.index(tok.pad_token_id)] if tok.pad_token_id in ids else ids


def test_eval_metrics_at_the_asked_updates_are_the_rewards_of_greedy_completions(tiny_models, tok, tmp_path):
    """4 updates, eval_steps 2: eval entries at updates 2 and 4 only. 5 eval prompts in batches of 2 (the last one
    short): each is scored once per evaluation, and eval_reward / eval_reward_std / eval_rewards/<name>/mean are the
    mean and unbiased std of a function of the completion ids and of one that says None for some rows, with the
    completions recomputed by `generate` (one prompt at a time) from the policy at that moment."""
    from datasets import Dataset
    from transformers import TrainerCallback

    eval_rows = rows(tok, 5, seed=9, tag="e", length=3)
    calls = []

    def digest(completion_ids, answer, trainer_state, **kwargs):  # varies with the tokens
        calls.append((trainer_state.global_step, list(answer), [list(i) for i in completion_ids]))
        return [float(sum(i) % 7) for i in completion_ids]

    def odd_is_none(answer, **kwargs):
        return [None if int(a[1:]) % 2 else 2.0 for a in answer]

    expected = {}

    class Recompute(TrainerCallback):
        def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
            ids = [greedy_ids(model.policy, tok, p, args.response_length) for p in eval_rows["input_ids"]]
            expected[state.global_step] = (ids, dict(metrics))

    trainer = make(tiny_models, tok, tmp_path, reward_funcs=[digest, odd_is_none],
                   eval_dataset=Dataset.from_dict(eval_rows), callbacks=[Recompute()], eval_strategy="steps",
                   eval_steps=2, missing_eos_penalty=None)
    trainer.train()
    history = trainer.state.log_history
    assert len(update_logs(trainer)) == 4
    evals = [entry for entry in history if any(k.startswith("eval_") for k in entry)]
    assert [e["step"] for e in evals] == [2, 4] and sorted(expected) == [2, 4]
    assert all(not any(k.startswith("eval_") for k in e) for e in update_logs(trainer))
    for entry in evals:
        step = entry["step"]
        ids, metrics = expected[step]
        eval_calls = [c for c in calls if c[1][0].startswith("e")]
        seen = [(a, i) for s, answers, completions in eval_calls if s == step for a, i in zip(answers, completions)]
        assert [a for a, _ in seen] == eval_rows["answer"]  # every prompt once, in order, no padding repeat
        assert [i for _, i in seen] == ids  # the trainer's batched greedy completions are generate's
        digests = [float(sum(i) % 7) for i in ids]
        assert len(set(digests)) > 1  # rewards that differ: the mean and std below mean something
        assert entry["eval_reward"] == pytest.approx(statistics.mean(digests) + 2.0 * 3 / 5)
        assert entry["eval_rewards/digest/mean"] == pytest.approx(statistics.mean(digests))
        assert entry["eval_rewards/digest/std"] == pytest.approx(statistics.stdev(digests))
        assert entry["eval_rewards/odd_is_none/mean"] == 2.0  # rows 0, 2, 4; None elsewhere
        scores = [d + (2.0 if k % 2 == 0 else 0.0) for k, d in enumerate(digests)]
        assert entry["eval_reward_std"] == pytest.approx(statistics.stdev(scores))
        assert entry["eval_completions/mean_length"] == pytest.approx(statistics.mean(len(i) for i in ids))
        assert {k: v for k, v in entry.items() if k != "step"} == metrics  # what on_evaluate got
    assert [h["step"] for h in trainer.evaluation.history] == [2, 4]


def test_eval_on_or_off_gives_the_same_training_numbers(tiny_models, tok, tmp_path):
    """Reward-model scoring, sampled evaluation (`eval_do_sample`, draws from the RNG) every update, TRL's sample
    generations on the same eval_dataset in both runs: the update metrics and the final weights are those of the
    run without evaluation, bit for bit."""
    from datasets import Dataset

    eval_dataset = Dataset.from_dict({"input_ids": rows(tok, 3, seed=9, tag="e")["input_ids"]})
    off = make(tiny_models, tok, tmp_path / "off", eval_dataset=eval_dataset, num_sample_generations=2)
    off.train()
    on = make(tiny_models, tok, tmp_path / "on", eval_dataset=eval_dataset, eval_strategy="steps", eval_steps=1,
              eval_do_sample=True, num_sample_generations=2)
    on.train()
    a, b = update_logs(off), update_logs(on)
    assert len(a) == len(b) == 4
    timing = ("time/", "eps")  # wall-clock numbers
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.startswith(timing)} == \
            {k: v for k, v in y.items() if not k.startswith(timing)}
    evals = [e for e in on.state.log_history if "eval_reward" in e]
    assert [e["step"] for e in evals] == [1, 2, 3, 4]
    assert all(e["eval_reward"] == e["eval_rewards/reward_model/mean"] for e in evals)
    assert not any("eval_reward" in e for e in off.state.log_history)
    for p, q in zip(off.model.parameters(), on.model.parameters()):
        assert p.equal(q)


def test_evaluate_without_eval_strategy_and_multi_turn_are_refused():
    from trl_ext.errors import UserInputError
    from trl_ext.ppo.combination_rules import check_eval_inputs

    class Args:
        eval_strategy = "steps"

    with pytest.raises(UserInputError, match=r"^eval_strategy: evaluation of multi-turn episodes .* not supported"):
        check_eval_inputs(Args(), True, multi_turn=True)
    with pytest.raises(UserInputError, match=r"^eval_strategy: 'steps' needs evaluation prompts"):
        check_eval_inputs(Args(), False, multi_turn=False)
    Args.eval_strategy = "no"
    check_eval_inputs(Args(), False, multi_turn=True)  # off: nothing to check
