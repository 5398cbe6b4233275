"""trl_ext.PPOTrainer(reward_funcs=...): TRL GRPO's reward functions inside the real trainer on the tiny models.

What the functions receive (prompts, columns in row order with k samples per prompt, completion ids, the trainer
state), weights and None, unscorable completions, the metrics and the completions log, a reward model given as a
reward function giving the reward-model run's numbers exactly, and an exception that stops the run cleanly.
"""

from __future__ import annotations

import json
import math

import pytest

from ppo_helpers import config_kwargs, load_models, seed_all, update_logs


@pytest.fixture(scope="module")
def dataset(tok):
    """Prompts with an `answer` column that names the row (`answer` = the prompt's index)."""
    from datasets import Dataset

    from trl_ext.testing import tiny_corpus

    texts = [" ".join(line.split()[:3]) for line in tiny_corpus(8, seed=4)]
    return Dataset.from_dict({"input_ids": [tok(t)["input_ids"] for t in texts], "prompt": texts,
                              "answer": [str(i) for i in range(len(texts))]})


def make(tiny_models, tok, train_dataset, out, reward_model=None, reward_funcs=None, value=False, **overrides):
    import trl_ext

    seed_all(0)
    policy, value_model, reward = load_models(tiny_models)
    kwargs = dict(total_episodes=8, num_sample_generations=0, per_device_train_batch_size=4,
                  gradient_accumulation_steps=1)
    kwargs.update(overrides)
    return trl_ext.PPOTrainer(
        args=trl_ext.PPOConfig(**config_kwargs(out, **kwargs)), processing_class=tok, model=policy, ref_model=None,
        reward_model=reward if reward_model == "model" else reward_model, train_dataset=train_dataset,
        value_model=value_model if value else None, reward_funcs=reward_funcs,
    )


def test_a_reward_model_given_as_a_reward_function_gives_the_reward_model_run_exactly(tiny_models, tok, dataset,
                                                                                       tmp_path):
    """GAE with a value model: scores, KL, losses and weights identical, bit for bit, whether the reward model is
    `reward_model` (today's path) or the only entry of `reward_funcs` (the scorer's path)."""
    from ppo_helpers import load_models as load

    plain = make(tiny_models, tok, dataset.select_columns(["input_ids"]), tmp_path / "a", reward_model="model",
                 value=True)
    plain.train()
    reward = load(tiny_models)[2]
    via_funcs = make(tiny_models, tok, dataset, tmp_path / "b", reward_funcs=[reward], value=True)
    via_funcs.train()
    keys = ("objective/scores", "objective/kl", "loss/policy_avg", "loss/value_avg", "policy/approxkl_avg")
    a, b = update_logs(plain), update_logs(via_funcs)
    assert len(a) == len(b) == 2
    for key in keys:
        assert [e[key] for e in a] == [e[key] for e in b], key
    assert b[0]["rewards/reward/mean"] == pytest.approx(  # named after its checkpoint folder, as TRL names models
        b[0]["objective/scores"] + b[0]["completions/clipped_ratio"] * 1.0)  # missing_eos_penalty 1.0 on clipped
    for p, q in zip(plain.model.parameters(), via_funcs.model.parameters()):
        assert p.equal(q)


def test_what_reward_functions_receive_weights_none_and_the_metrics(tiny_models, tok, dataset, tmp_path,
                                                                    monkeypatch):
    import wandb

    wandb.teardown()  # wandb reads WANDB_DIR once per process
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    calls = []

    def recorder(prompts, completions, completion_ids, answer, trainer_state, log_extra, log_metric, **kwargs):
        calls.append(dict(prompts=list(prompts), completions=list(completions), ids=completion_ids,
                          answer=list(answer), step=trainer_state.global_step, extra=sorted(kwargs)))
        log_metric("custom/calls", 1.0)
        log_extra("answer_again", list(answer))
        return [None if int(a) % 4 == 3 else float(len(ids)) for a, ids in zip(answer, completion_ids)]

    async def odd_is_none(completions, answer, **kwargs):  # async: run with asyncio as in TRL
        return [None if int(a) % 2 else 1.0 for a in answer]

    trainer = make(tiny_models, tok, dataset, tmp_path, reward_funcs=[recorder, odd_is_none],
                   advantage_estimator="grpo", num_samples_per_prompt=2, reward_weights=[0.5, 2.0],
                   missing_eos_penalty=None, log_completions=True, num_completions_to_print=0, report_to="wandb")
    trainer.train()
    wandb.finish()  # HF's callback leaves the run open: a stale wandb.run would break the next wandb test here
    wandb.teardown()
    tables = sorted(tmp_path.glob("wandb/offline-run-*/files/media/table/completions_*.table.json"))
    assert len(tables) == 2  # one wandb.Table per update
    table = json.loads(tables[0].read_text())
    assert {"prompt", "completion", "recorder", "odd_is_none", "score", "advantage"} <= set(table["columns"])
    assert len(table["data"]) == 4
    logs = update_logs(trainer)
    assert [c["step"] for c in calls] == [0, 1]  # once per update, before the update counts
    prompt_of = dict(zip(dataset["answer"], dataset["prompt"]))
    for call, log in zip(calls, logs):
        assert call["extra"] == []  # nothing but the contract's keywords and the dataset's columns
        assert call["answer"][0::2] == call["answer"][1::2]  # k = 2 samples of a prompt in a row, columns alike
        assert call["prompts"] == [prompt_of[a] for a in call["answer"]]  # each row's columns with its prompt
        assert call["completions"] == tok.batch_decode(call["ids"], skip_special_tokens=True)
        first = [None if int(a) % 4 == 3 else float(len(i)) for a, i in zip(call["answer"], call["ids"])]
        second = [None if int(a) % 2 else 1.0 for a in call["answer"]]
        expected = [sum(w * v for w, v in ((0.5, r1), (2.0, r2)) if v is not None) for r1, r2 in zip(first, second)]
        unscorable = sum(r1 is None and r2 is None for r1, r2 in zip(first, second))
        assert log["objective/scores"] == pytest.approx(sum(expected) / len(expected))
        assert log["rewards/recorder/mean"] == pytest.approx(
            sum(v for v in first if v is not None) / sum(v is not None for v in first))
        if any(v is not None for v in second):
            assert log["rewards/odd_is_none/mean"] == 1.0
        else:  # no row it applies to: NaN, as TRL's nanmean
            assert math.isnan(log["rewards/odd_is_none/mean"])
        assert log["rewards/unscorable"] == unscorable
        scorable = [e for e, r1, r2 in zip(expected, first, second) if r1 is not None or r2 is not None]
        assert log["reward"] == pytest.approx(sum(scorable) / len(scorable))
        assert log["completions/mean_length"] == pytest.approx(sum(map(len, call["ids"])) / len(call["ids"]))
        assert log["custom/calls"] == 1.0
    assert any(log["rewards/unscorable"] for log in logs)  # the data makes rows 3 and 7 unscorable

    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and [r["step"] for r in rows] == [1] * 4 + [2] * 4  # the update logged
    for row in rows:
        assert row["answer_again"] == str(row["answer_again"]) and row["prompt"] == prompt_of[row["answer_again"]]
        if int(row["answer_again"]) % 4 == 3:  # every reward said None: no signal
            assert row["recorder"] is None and row["odd_is_none"] is None and row["advantage"] == 0.0
        elif row["odd_is_none"] is not None:
            assert row["score"] == pytest.approx(0.5 * row["recorder"] + 2.0)


def test_an_exception_in_a_reward_function_stops_the_run_naming_it_with_the_checkpoint_intact(
        tiny_models, tok, dataset, tmp_path):
    from trl_ext.rewards.contract import RewardFunctionError

    def flaky(completions, answer, trainer_state, **kwargs):
        if trainer_state.global_step == 1:
            raise ZeroDivisionError("verifier bug")
        return [0.0] * len(completions)

    trainer = make(tiny_models, tok, dataset, tmp_path, reward_funcs=flaky, advantage_estimator="rloo",
                   num_samples_per_prompt=2, save_strategy="steps", save_steps=1)
    with pytest.raises(RewardFunctionError, match=r"^reward function 'flaky' raised ZeroDivisionError: verifier bug; "
                                                  r"first completion of the call: prompts='"):
        trainer.train()
    checkpoint = tmp_path / "checkpoint-1"
    assert (checkpoint / "trainer_state.json").is_file() and (checkpoint / "trl_ext_ppo_state_0.pt").is_file()
    assert not list(tmp_path.glob("tmp-checkpoint-*"))
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["global_step"] == 1 and not math.isnan(state["log_history"][0]["objective/scores"])


def test_reward_weights_of_the_wrong_length_and_no_reward_at_all_are_one_line(tiny_models, tok, dataset, tmp_path):
    from trl_ext.errors import UserInputError

    def f(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(UserInputError, match=r"^reward_weights: 3 weights for 2 rewards \(reward_model, f;"):
        make(tiny_models, tok, dataset, tmp_path, reward_model="model", reward_funcs=[f], value=True,
             reward_weights=[1.0, 1.0, 1.0])
    with pytest.raises(UserInputError, match="^reward_model: None and no reward_funcs"):
        make(tiny_models, tok, dataset, tmp_path, value=True)


def test_with_workers_a_timeout_or_an_error_scores_none_is_counted_and_the_run_goes_on(tiny_models, tok, dataset,
                                                                                        tmp_path):
    """reward_num_workers: a call that hangs past reward_timeout_s or raises scores None for its completion only;
    the counts reach the metrics; the other completions keep their rewards; training finishes."""
    import time

    def verifier(completions, answer, **kwargs):
        if answer[0] == "1":
            time.sleep(60)  # hangs: killed at the timeout
        if answer[0] == "2":
            raise RuntimeError("checker crashed")
        return [float(answer[0])]

    trainer = make(tiny_models, tok, dataset, tmp_path, reward_funcs=[verifier], advantage_estimator="rloo",
                   num_samples_per_prompt=2, total_episodes=16, reward_num_workers=2, reward_timeout_s=2.0,
                   missing_eos_penalty=None, log_completions=True, num_completions_to_print=0)
    trainer.train()
    logs = update_logs(trainer)
    assert len(logs) == 4  # every prompt once (8 prompts, 2 per update): rows 1 and 2 hit the bad branches
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert sum(log["rewards/verifier/timeouts"] for log in logs) == 2  # the two samples of prompt 1
    assert sum(log["rewards/verifier/errors"] for log in logs) == 2  # the two samples of prompt 2
    scored = sorted(r["verifier"] for r in rows if r["verifier"] is not None)
    assert scored == sorted(float(a) for a in dataset["answer"] if a not in ("1", "2") for _ in range(2))
    assert sum(log["rewards/unscorable"] for log in logs) == 4
    assert trainer.reward_scorer.pool is None  # the workers were stopped at the end of train()
