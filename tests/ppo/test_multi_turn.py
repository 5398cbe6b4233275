"""The turn loop (trl_ext/ppo/episodes/multi_turn.py) driven by a scripted sampler: the rounds cap, the length cap
with TRL's rollback of a tool result that does not fit, the layout of actions, observations and log-probs; and the
prompts an update starts from (the dataset's, rendered again only where an environment's reset added text)."""

from types import SimpleNamespace

import pytest
import torch

from trl_ext.ppo.episodes.multi_turn import MultiTurnRollout, left_pad
from trl_ext.ppo.episodes.toolbox import Toolbox
from trl_ext.testing.tools import add, build_tool_tokenizer

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
CALL_AGAIN = '<tool_call>\n{"name": "add", "arguments": {"a": 10, "b": 1}}\n</tool_call><|im_end|>'
ANSWER = "The sum is 5.<|im_end|>"


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer()


def rollout(tok, response_length, max_iterations, script):
    """Two episodes; ``script(row, turn)`` is the text row ``row`` writes at its turn ``turn`` (0-based)."""
    args = SimpleNamespace(response_length=response_length, max_tool_calling_iterations=max_iterations,
                           tool_timeout_s=None, tool_num_workers=0)
    loop = MultiTurnRollout(Toolbox([add], None, tok), args, tok)
    prompts = [[{"role": "user", "content": "Add 2 and 3."}], [{"role": "user", "content": "Say hi."}]]
    data = loop.begin({"input_ids": torch.zeros(2, 1, dtype=torch.long), "prompt": prompts})
    turns = [0, 0]
    budgets = []
    rows_of_call = []

    def sample(queries, max_new_tokens):
        budgets.append(max_new_tokens)
        rows = [0, 1] if not rows_of_call else [r for r in (0, 1) if turns[r] > 0 and r in active_rows()]
        rows_of_call.append(rows)
        out = []
        for row in rows:
            ids = tok(script(row, turns[row]), add_special_tokens=False)["input_ids"][:max_new_tokens]
            turns[row] += 1
            out.append(ids)
        width = max(len(ids) for ids in out)
        responses = torch.full((len(out), width), tok.pad_token_id)
        for k, ids in enumerate(out):
            responses[k, : len(ids)] = torch.tensor(ids)
        return torch.cat((queries, responses), 1), torch.full((len(out), width), -0.5)

    def active_rows():
        return [r for r in (0, 1) if script(r, 0).startswith("<tool_call>")]

    query_responses, logprobs, batch = loop.run(data["input_ids"], sample)
    batch.budgets = budgets
    return query_responses, logprobs, batch, data["input_ids"].shape[1]


def test_the_rounds_cap_ends_an_episode_that_keeps_calling(tok):
    script = lambda row, turn: (CALL if turn == 0 else CALL_AGAIN) if row == 0 else "hi<|im_end|>"  # noqa: E731
    _, logprobs, batch, _ = rollout(tok, 400, 2, script)
    calls, hi = batch.episodes
    assert [m["role"] for m in calls.messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert [m["content"] for m in calls.messages if m["role"] == "tool"] == ["5", "11"]  # each turn's own call
    assert calls.turns == 3 and calls.truncated == "iterations" and calls.ids[-1] == tok.eos_token_id
    assert hi.turns == 1 and hi.truncated is None and hi.messages == [{"role": "assistant", "content": "hi"}]
    assert batch.counts.calls == 2
    obs = batch.observation_mask
    box = Toolbox([add], None, tok)
    suffixes = [box.tool_suffix_ids([{"role": "tool", "name": "add", "content": c}]) for c in ("5", "11")]
    calls_ids = [tok(c, add_special_tokens=False)["input_ids"] for c in (CALL, CALL_AGAIN)]
    layout = [False] * len(calls_ids[0]) + [True] * len(suffixes[0]) + [False] * len(calls_ids[1]) + \
        [True] * len(suffixes[1])
    assert obs[0].tolist()[: len(layout)] == layout
    assert obs[0].sum() == len(suffixes[0]) + len(suffixes[1]) and not obs[1].any()
    assert torch.all(logprobs[0][obs[0]] == 0) and torch.all(logprobs[0][: len(calls.ids)][~obs[0][: len(calls.ids)]]
                                                              == -0.5)
    metrics = batch.metrics(lambda t: t)
    assert metrics["episodes/turns_mean"] == 2.0 and metrics["episodes/truncated_iterations_frac"] == 0.5
    assert metrics["episodes/truncated_length_frac"] == 0.0
    assert metrics["tools/call_frequency"] == 1.0


def test_a_tool_result_that_does_not_fit_is_dropped_and_the_episode_ends(tok):
    script = lambda row, turn: CALL if row == 0 else ANSWER  # noqa: E731
    n_call = len(tok(CALL, add_special_tokens=False)["input_ids"])
    query_responses, _, batch, context = rollout(tok, n_call + 5, None, script)  # no room for the result
    calls = batch.episodes[0]
    assert calls.messages[-1]["tool_calls"] and len(calls.messages) == 1  # rolled back, as TRL does
    assert calls.truncated == "length" and calls.turns == 1 and len(calls.ids) == n_call
    assert batch.counts.calls == 1  # the call ran; its result did not fit
    assert query_responses.shape[1] - context == n_call  # nothing appended
    assert batch.metrics(lambda t: t)["episodes/truncated_length_frac"] == 0.5


def test_a_later_turn_gets_only_the_tokens_left(tok):
    script = lambda row, turn: (CALL if turn == 0 else ANSWER) if row == 0 else ANSWER  # noqa: E731
    n_call = len(tok(CALL, add_special_tokens=False)["input_ids"])
    suffix = Toolbox([add], None, tok).tool_suffix_ids([{"role": "tool", "name": "add", "content": "5"}])
    budget = n_call + len(suffix) + 3
    _, _, batch, _ = rollout(tok, budget, None, script)
    episode = batch.episodes[0]
    assert len(episode.ids) == budget and episode.truncated == "length" and episode.turns == 2
    assert batch.budgets == [budget, 3]  # the first turn may use all of it; the next, what is left
    assert episode.ids[-3:] == tok(ANSWER, add_special_tokens=False)["input_ids"][:3]
    assert not batch.ends_with_eos[0] and batch.ends_with_eos[1]



def test_a_tool_result_that_fills_the_budget_exactly_is_kept_and_no_turn_follows(tok):
    script = lambda row, turn: CALL if row == 0 else ANSWER  # noqa: E731
    n_call = len(tok(CALL, add_special_tokens=False)["input_ids"])
    suffix = Toolbox([add], None, tok).tool_suffix_ids([{"role": "tool", "name": "add", "content": "5"}])
    _, _, batch, _ = rollout(tok, n_call + len(suffix), None, script)  # the result fits, with no token left
    episode = batch.episodes[0]
    assert [m["role"] for m in episode.messages] == ["assistant", "tool"] and len(episode.ids) == n_call + len(suffix)
    assert episode.truncated == "length" and episode.turns == 1
    assert batch.budgets == [n_call + len(suffix)]  # no next turn sampled with nothing left


def test_each_later_turn_is_cut_to_its_own_episodes_tokens_left(tok):
    """Two episodes continue with different room (row 1's call and result are longer): the turn is sampled with
    the larger budget, and each episode keeps only what fits its own."""
    script = lambda row, turn: ((CALL if row == 0 else CALL_AGAIN) if turn == 0 else ANSWER)  # noqa: E731
    box = Toolbox([add], None, tok)
    used = [len(tok(c, add_special_tokens=False)["input_ids"]) + len(box.tool_suffix_ids(
        [{"role": "tool", "name": "add", "content": r}])) for c, r in ((CALL, "5"), (CALL_AGAIN, "11"))]
    assert used[1] > used[0]
    budget = used[1] + 3
    _, _, batch, _ = rollout(tok, budget, None, script)
    assert batch.budgets == [budget, budget - used[0]]
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"]
    for episode, room in zip(batch.episodes, (budget - used[0], 3)):
        assert len(episode.ids) == budget and episode.ids[-room:] == answer[:room] and episode.turns == 2


def test_an_answer_that_ends_with_eos_exactly_at_the_budget_is_not_truncated(tok):
    n_answer = len(tok(ANSWER, add_special_tokens=False)["input_ids"])
    _, _, batch, _ = rollout(tok, n_answer, None, lambda row, turn: ANSWER)
    assert [(len(e.ids), e.ids[-1], e.truncated) for e in batch.episodes] == [(n_answer, tok.eos_token_id, None)] * 2

class HintEnv:
    """Its reset adds text to the prompt of the rows with ``hint``, and leaves the others as they are."""

    def reset(self, **row):
        return " Use the tool." if row["hint"] else None


@pytest.mark.parametrize("padding_side", ["left", "right"])
def test_begin_keeps_the_datasets_prompts_and_renders_only_those_reset_changed(tok, padding_side):
    from datasets import Dataset
    from transformers import DataCollatorWithPadding

    from trl_ext.rewards.columns import ColumnsCollator

    args = SimpleNamespace(response_length=64, max_tool_calling_iterations=1, tool_timeout_s=None, tool_num_workers=0)
    box = Toolbox([add], HintEnv, tok)
    loop = MultiTurnRollout(box, args, tok)
    prompts = [[{"role": "user", "content": "Add 2 and 3."}], [{"role": "user", "content": "Say hi."}],
               [{"role": "user", "content": "Add 40 and 2, then say the sum."}]]
    dataset = box.render_dataset(Dataset.from_list([{"prompt": p, "hint": h}
                                                    for p, h in zip(prompts, (False, True, False))]))
    side, tok.padding_side = tok.padding_side, padding_side
    try:
        batch = ColumnsCollator(DataCollatorWithPadding(tok))(list(dataset))
    finally:
        tok.padding_side = side
    rendered, render = [], box.render_prompt
    box.render_prompt = lambda prompt, row: rendered.append(row) or render(prompt, row)
    data = loop.begin(batch)
    assert rendered == [1]  # only the prompt the reset text changed
    expected = [render(prompt, i) for i, prompt in enumerate(data["prompt"])]  # each rendered here, as it is now
    assert loop.prompt_ids == expected
    assert tok.decode(expected[1]).count("Say hi. Use the tool.") == 1
    assert data["input_ids"].tolist() == left_pad(expected, tok.pad_token_id, batch["input_ids"]).tolist()


def hand_batch(calls=3, failures=1, timeouts=1):
    """Three episodes written out by hand: a call and an answer; a length-truncated call; a single-turn answer."""
    from trl_ext.ppo.episodes.multi_turn import Episode, EpisodeBatch
    from trl_ext.ppo.episodes.tool_calls import ToolCallCounts

    def episode(layout, turns, truncated=None):  # layout: (ids, action) runs
        e = Episode(prompt_ids=[1], ids=[], action=[], logprobs=[], messages=[], turns=turns, truncated=truncated)
        for ids, action in layout:
            e.append(ids, action)
        return e

    return EpisodeBatch([episode([([11, 12], True), ([21, 22, 23], False), ([13], True)], turns=2),
                         episode([([14, 15, 16], True), ([24], False)], turns=2, truncated="length"),
                         episode([([17], True)], turns=1, truncated="iterations")],
                        ToolCallCounts(calls, failures, timeouts))


def test_episode_metrics_are_the_hand_counted_means():
    metrics = hand_batch().metrics(lambda t: t)  # one process: gather is the identity
    assert metrics == pytest.approx({
        "tools/call_frequency": 3 / 3, "tools/failure_frequency": 1 / 3, "tools/timeout_frequency": 1 / 3,
        "episodes/turns_mean": 5 / 3, "episodes/action_tokens_mean": (3 + 3 + 1) / 3,
        "episodes/observation_tokens_mean": (3 + 1 + 0) / 3, "episodes/truncated_length_frac": 1 / 3,
        "episodes/truncated_iterations_frac": 1 / 3})
    no_calls = hand_batch(calls=0, failures=0, timeouts=0).metrics(lambda t: t)
    assert (no_calls["tools/call_frequency"], no_calls["tools/failure_frequency"],
            no_calls["tools/timeout_frequency"]) == (0.0, 0.0, 0.0)


def test_marked_texts_wrap_each_observation_span(tok):
    texts = hand_batch().marked_texts(tok)

    def text(ids):
        return tok.decode(ids, skip_special_tokens=False)

    assert texts == [text([11, 12]) + f"[observation]{text([21, 22, 23])}[/observation]" + text([13]),
                     text([14, 15, 16]) + f"[observation]{text([24])}[/observation]",
                     text([17])]
