"""The reward-function contract and the scorer, without a trainer: hand-made functions, trl.rewards, the tiny
tokenizer."""

import asyncio
import math

import pytest
import torch

from trl_ext.rewards.columns import ColumnsCollator, batch_columns
from trl_ext.rewards.contract import RewardFunctionError, call_reward_funcs, check_rewards, reward_func_names
from trl_ext.rewards.metrics import nanstd, reward_metrics
from trl_ext.rewards.scoring import RewardScorer, build_reward_list


def inputs(n=3):
    return {"prompts": [f"p{i}" for i in range(n)], "completions": [f"c{i}" for i in range(n)],
            "completion_ids": [[i] for i in range(n)], "answer": [str(10 + i) for i in range(n)]}


def test_check_rewards_turns_none_into_nan_and_refuses_what_breaks_the_contract():
    values = check_rewards("f", [1, None, torch.tensor(0.5)], inputs())
    assert values[0] == 1.0 and math.isnan(values[1]) and values[2] == 0.5
    with pytest.raises(RewardFunctionError, match=r"reward function 'f': returned 2 rewards for 3 completions"):
        check_rewards("f", [1.0, 2.0], inputs())
    with pytest.raises(RewardFunctionError, match=r"'f': reward 1 is str '1'.*completion: prompts='p1'.*answer='11'"):
        check_rewards("f", [1.0, "1", 2.0], inputs())
    with pytest.raises(RewardFunctionError, match=r"'f': reward 2 is nan .*never NaN"):
        check_rewards("f", [1.0, 2.0, float("nan")], inputs())
    with pytest.raises(RewardFunctionError, match=r"'f': returned float"):
        check_rewards("f", 1.0, inputs())


def test_names_are_trl_names_made_unique():
    from functools import partial

    def acc(completions, **kw):
        return [0.0] * len(completions)

    model = torch.nn.Linear(1, 1)
    model.config = type("C", (), {"_name_or_path": "org/my-rm"})()
    assert reward_func_names([acc, acc, partial(acc), model]) == ["acc", "acc_2", "acc_3", "my-rm"]


def test_async_functions_run_together_and_exceptions_name_the_function_and_input():
    both_started = asyncio.Event

    state = {}

    async def first(completions, **kw):  # finishes only if `second` runs at the same time
        state.setdefault("e1", both_started())
        state.setdefault("e2", both_started())
        state["e1"].set()
        await asyncio.wait_for(state["e2"].wait(), timeout=5)
        return [1.0] * len(completions)

    async def second(completions, **kw):
        state.setdefault("e1", both_started())
        state.setdefault("e2", both_started())
        state["e2"].set()
        await asyncio.wait_for(state["e1"].wait(), timeout=5)
        return [2.0] * len(completions)

    def sync(completions, answer, **kw):
        return [float(a) for a in answer]

    out = call_reward_funcs({0: ("first", first), 1: ("sync", sync), 2: ("second", second)}, inputs())
    assert out == {0: [1.0] * 3, 1: [10.0, 11.0, 12.0], 2: [2.0] * 3}

    def broken(completions, **kw):
        raise KeyError("answer")

    with pytest.raises(RewardFunctionError, match=r"'broken' raised KeyError: 'answer'; first completion of the "
                                                   r"call: prompts='p0', completions='c0'"):
        call_reward_funcs({0: ("broken", broken)}, inputs())


def test_build_reward_list_and_weights():
    def f(completions, **kw):
        return [0.0] * len(completions)

    rewards, weights, names = build_reward_list(None, f, None)
    assert rewards == [f] and weights == [1.0] and names == ["f"]
    assert build_reward_list(torch.nn.Linear(1, 1), [f, f], [1, 2, 3])[1:] == ([1.0, 2.0, 3.0],
                                                                              ["reward_model", "f", "f_2"])
    with pytest.raises(Exception, match=r"reward_weights: 1 weights for 2 rewards \(reward_model, f"):
        build_reward_list(torch.nn.Linear(1, 1), [f], [0.5])
    with pytest.raises(Exception, match="reward_model: None and no reward_funcs"):
        build_reward_list(None, [], None)
    with pytest.raises(Exception, match=r"reward_funcs\[1\]: 3 is neither"):
        build_reward_list(None, [f, 3], None)
    with pytest.raises(Exception, match=r"^reward_funcs\[0\]: 3 is neither a callable"):  # not a TypeError from list(3)
        build_reward_list(None, 3, None)


def test_collator_carries_columns_in_row_order_and_leaves_input_ids_alone(tokenizer):
    from transformers import DataCollatorWithPadding

    inner = DataCollatorWithPadding(tokenizer)
    rows = [{"input_ids": [5, 6, 7], "answer": "a", "meta": {"k": 1}}, {"input_ids": [8], "answer": "b", "meta": {}}]
    batch = ColumnsCollator(inner)(rows)
    plain = inner([{"input_ids": r["input_ids"]} for r in rows])
    assert torch.equal(batch["input_ids"], plain["input_ids"])
    assert batch_columns(batch) == {"answer": ["a", "b"], "meta": [{"k": 1}, {}]}


def test_scorer_weights_none_and_decoding(tokenizer):
    """Weighted nansum per completion, a row where every reward says None is unscorable (score 0), completion ids
    stop at the first pad, chat prompts get assistant messages."""
    pad = tokenizer.pad_token_id
    texts = ["happy dog", "sad cat", "the sun"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids)) + 2
    responses = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    seen = {}

    def has_happy(prompts, completions, completion_ids, answer, **kw):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids, answer=answer)
        return [1.0 if "happy" in c else (None if "sun" in c else 0.0) for c in completions]

    def length(completions, completion_ids, **kw):
        return [None if "sun" in text else float(len(c)) for text, c in zip(completions, completion_ids)]

    scorer = RewardScorer([has_happy, length], [2.0, 0.5], ["has_happy", "length"], tokenizer, pad)
    queries = torch.tensor([[pad, 5], [6, 7], [pad, 8]])
    scorer.begin(queries, {"prompt": ["a", "b", "c"], "answer": ["x", "y", "z"]})
    scores = scorer.score(responses, {})
    assert seen["completion_ids"] == ids and seen["answer"] == ["x", "y", "z"] and seen["prompts"] == ["a", "b", "c"]
    assert seen["completions"] == [tokenizer.decode(i, skip_special_tokens=True) for i in ids]
    expected = [2.0 * 1 + 0.5 * len(ids[0]), 2.0 * 0 + 0.5 * len(ids[1]), 0.0]
    assert scores.score.tolist() == pytest.approx(expected)
    assert scores.unscorable.tolist() == [False, False, True]

    scorer.begin(queries, {"prompt": [[{"role": "user", "content": "hi"}]] * 3, "answer": ["x", "y", "z"]})
    scorer.score(responses, {})
    assert seen["completions"][0] == [{"role": "assistant", "content": "happy dog"}]


def worker_reward(completions, completion_ids, trainer_state, log_extra, log_metric, **kw):
    """Module level: the pool's workers are forked and call it by reference. Fails on "sad" completions, hangs on
    "sun" ones, logs a column and a metric."""
    import os
    import time

    if "sad" in completions[0]:
        raise ValueError("sad")
    if "sun" in completions[0]:
        time.sleep(30)
    log_extra("length", [len(completion_ids[0])])
    log_metric("checker/calls", 1.0)
    return [os.getpid() + 1000 * len(completion_ids[0]) + (0.5 if trainer_state.log_history == [] else 0.25)]


def test_scorer_with_one_worker_scores_each_row_in_another_process_and_closes_it(tokenizer):
    """`reward_num_workers: 1` runs the functions in a worker process, one call per completion: rows submitted early
    (`submit`, while the rest is generated) and the others at `score`; an error or a timeout is NaN and counted;
    logged columns and metrics come back; the trainer
    state reaches the worker without its log history; close() stops the worker. Reward models are listed apart;
    prompts without a `prompt` column are the decoded queries without padding."""
    import os
    import types

    pad = tokenizer.pad_token_id
    model = torch.nn.Linear(1, 1)
    scorer = RewardScorer([model, worker_reward], [1.0, 2.0], ["reward_model", "worker_reward"], tokenizer, pad,
                          num_workers=1, timeout_s=2)
    texts = ["happy dog", "sad cat", "the sun is up", "a big cat"]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, ids)) + 1
    responses = torch.tensor([row + [pad] * (width - len(row)) for row in ids])
    hello = tokenizer("hello", add_special_tokens=False)["input_ids"]
    try:
        assert scorer.reward_models == [model] and scorer.pool is not None
        scorer.begin(torch.tensor([[pad] + hello] * 4), {},
                     trainer_state=types.SimpleNamespace(log_history=[{"loss": 1.0}]))
        assert scorer._prompts == ["hello"] * 4
        scorer.submit(0, responses[:2])
        assert sorted(scorer._pending) == [(0, 0), (1, 0)]
        scores = scorer.score(responses, {0: torch.tensor([0.1, 0.2, 0.3, 0.4])})
        # an update of one-token completions, none submitted early: more rows than tokens, all scored
        one_token = torch.tensor([[ids[0][0]], [ids[3][0]], [ids[0][0]]])
        scorer.begin(torch.tensor([hello] * 3), {}, trainer_state=types.SimpleNamespace(log_history=[]))
        assert not math.isnan(scorer.score(one_token, {0: torch.zeros(3)}).per_reward[:, 1].sum().item())
    finally:
        pool = scorer.pool
        scorer.close()
    assert scorer.pool is None and pool.closed
    scorer.close()  # twice, and without a pool: nothing to do
    values = scores.per_reward[:, 1].tolist()
    assert math.isnan(values[1]) and math.isnan(values[2]) and scores.errors == [0, 1] and scores.timeouts == [0, 1]
    for row in (0, 3):
        pid = values[row] - 1000 * len(ids[row]) - 0.5
        assert pid == int(pid) and int(pid) != os.getpid()
    assert scores.score.tolist() == pytest.approx([0.1 + 2 * values[0], 0.2, 0.3, 0.4 + 2 * values[3]])
    assert scores.extra_columns == {"length": [len(ids[0]), len(ids[3])]}
    assert scores.logged_metrics == {"checker/calls": [1.0, 1.0]}


def test_completions_drop_special_tokens_and_one_chat_prompt_makes_a_chat_completion(tokenizer):
    seen = {}

    def record(prompts, completions, **kw):
        seen.update(completions=completions)
        return [1.0]

    scorer = RewardScorer([record], [1.0], ["record"], tokenizer, tokenizer.pad_token_id)
    scorer.submit(0, torch.tensor([[5]]))  # in process: nothing to start early
    ids = tokenizer("happy dog", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    scorer.begin(torch.tensor([[5, 6]]), {"prompt": [[{"role": "user", "content": "hi"}]]})
    scorer.score(torch.tensor([ids + [tokenizer.pad_token_id]]), {})
    assert seen["completions"] == [[{"role": "assistant", "content": "happy dog"}]]


def test_trl_reward_functions_work_as_they_are(tokenizer):
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    pad = tokenizer.pad_token_id
    lengths = [2, 5, 7]
    responses = torch.tensor([[9] * n + [pad] * (8 - n) for n in lengths])
    overlong = get_soft_overlong_punishment(max_completion_len=6, soft_punish_cache=2)
    rewards, weights, names = build_reward_list(None, [think_format_reward, overlong], None)
    scorer = RewardScorer(rewards, weights, names, tokenizer, pad)
    scorer.begin(torch.tensor([[5], [6], [7]]), {"prompt": [[{"role": "user", "content": "q"}]] * 3})
    scores = scorer.score(responses, {})
    # DAPO eq. 13: 0 up to L_max - L_cache = 4 tokens, then (4 - |y|) / 2, -1 past L_max = 6
    assert scores.per_reward[:, 1].tolist() == [0.0, -0.5, -1.0]
    assert scores.per_reward[:, 0].tolist() == [0.0, 0.0, 0.0]  # no <think> tags
    assert scores.names == ["think_format_reward", "soft_overlong_punishment_reward"]


def test_metrics_by_hand():
    from trl_ext.rewards.scoring import RewardScores

    nan = float("nan")
    per = torch.tensor([[1.0, nan], [3.0, 2.0], [nan, nan], [5.0, 4.0]])
    scores = RewardScores(names=["a", "b"], per_reward=per, score=torch.tensor([1.0, 5.0, 0.0, 9.0]),
                          unscorable=torch.tensor([False, False, True, False]), timeouts=[0, 1], errors=[2, 0],
                          logged_metrics={"my/metric": [1.0, 3.0]})
    m = reward_metrics(scores, torch.tensor([3, 0, 7, 7]), torch.tensor([True, True, False, True]), k=2,
                       gather=lambda t: t, with_workers=True)
    assert m["rewards/a/mean"] == pytest.approx(3.0) and m["rewards/a/std"] == pytest.approx(2.0)
    assert m["rewards/b/mean"] == pytest.approx(3.0) and m["rewards/b/std"] == pytest.approx(math.sqrt(2))
    assert (m["rewards/a/timeouts"], m["rewards/a/errors"], m["rewards/b/timeouts"]) == (0, 2, 1)
    assert m["reward"] == pytest.approx(5.0) and m["reward_std"] == pytest.approx(4.0)  # unscorable row left out
    assert m["rewards/unscorable"] == 1 and m["frac_reward_zero_std"] == 0.0
    assert (m["completions/mean_length"], m["completions/min_length"], m["completions/max_length"]) == (5.25, 1, 8)
    assert m["completions/clipped_ratio"] == 0.25 and m["my/metric"] == 2.0
    assert math.isnan(nanstd(torch.tensor([nan, 1.0])))
