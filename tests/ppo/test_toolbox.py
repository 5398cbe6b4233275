"""TRL GRPOTrainer's tools / environment_factory contract as trl_ext's Toolbox holds it
(trl_ext/ppo/episodes/toolbox.py): environments' tools, reset, get_reward, several environments, the refusals."""

import pytest

from trl_ext.errors import UserInputError
from trl_ext.ppo.episodes.toolbox import Toolbox
from trl_ext.testing.tools import add, build_tool_tokenizer


class Counter:
    """An environment: one tool (`bump`), a reset that greets, a reward from its state."""

    def __init__(self):
        self.count, self.reset_with = 0, None

    def reset(self, **row):
        self.count, self.reset_with = 0, row
        return f" Start at {row['start']}."

    def bump(self, by: int) -> int:
        """Adds to the counter.

        Args:
            by: How much.
        """
        self.count += by
        return self.count

    def get_reward(self) -> float:
        return float(self.count)

    def _private(self):
        return None


class Quiet:
    def reset(self, **row):
        return None

    def ping(self) -> str:
        """Answers pong."""
        return "pong"


@pytest.fixture(scope="module")
def tok():
    return build_tool_tokenizer()


def rows(n, environment=None):
    return [{"prompt": [{"role": "user", "content": f"q{i}"}], "start": i,
             **({"environment": environment[i]} if environment else {})} for i in range(n)]


def test_environment_methods_are_tools_and_reset_text_joins_the_last_user_message(tok):
    box = Toolbox([add], Counter, tok)
    batch = rows(3)
    prompts = box.start_batch(batch, [r["prompt"] for r in batch])
    assert [t.__name__ for t in box.tools] == ["add", "bump"]  # not reset, get_reward, _private
    assert [p[-1]["content"] for p in prompts] == ["q0 Start at 0.", "q1 Start at 1.", "q2 Start at 2."]
    assert batch[0]["prompt"][-1]["content"] == "q0"  # the rows are left untouched
    assert len({id(e) for e in box.environments}) == 3  # one instance per episode
    assert box.environments[1].reset_with == batch[1]
    assert sorted(box.tool_dict(1)) == ["add", "bump"] and box.tool_dict(1)["bump"].__self__ is box.environments[1]
    box.environments[2].bump(5)
    funcs, names = box.reward_functions()
    assert names == ["Counter"]
    assert funcs[0](environments=box.environments) == [0.0, 0.0, 5.0]
    again = box.start_batch(batch, [r["prompt"] for r in batch])  # pooled: the same instances, reset
    assert again == prompts and box.environments[2].count == 0 and len(box.pool[None]) == 3



def test_an_environment_whose_method_timed_out_is_replaced_in_the_pool(tok):
    """Its thread cannot be stopped: the next batches get a fresh instance in its place, the others stay."""
    box = Toolbox(None, Counter, tok)
    batch = rows(3)
    box.start_batch(batch, [r["prompt"] for r in batch])
    hung, kept = box.environments[1], [box.environments[0], box.environments[2]]
    box.replace_environment(1)
    pool = box.pool[None]
    assert hung not in pool and len(pool) == 3 and pool[0] is kept[0] and pool[2] is kept[1]
    assert isinstance(pool[1], Counter)
    box.start_batch(batch, [r["prompt"] for r in batch])
    assert box.environments[1] is pool[1] and box.environments[1] is not hung

def test_several_environments_by_the_environment_column(tok):
    box = Toolbox(None, {"count": Counter, "quiet": Quiet}, tok)
    batch = rows(3, environment=["quiet", "count", "quiet"])
    prompts = box.start_batch(batch, [r["prompt"] for r in batch])
    assert [type(e).__name__ for e in box.environments] == ["Quiet", "Counter", "Quiet"]
    assert [p[-1]["content"] for p in prompts] == ["q0", "q1 Start at 1.", "q2"]
    assert "environment" not in box.environments[1].reset_with  # a control column, not reset's
    assert [t.__name__ for t in box.row_tools[0]] == ["ping"] and [t.__name__ for t in box.row_tools[1]] == ["bump"]
    funcs, names = box.reward_functions()
    assert names == ["Counter"] and funcs[0](environments=box.environments) == [None, 0.0, None]
    rendered = tok.decode(box.render_prompt(prompts[0], 0))
    assert '"name": "ping"' in rendered and '"name": "bump"' not in rendered  # each row's own tools
    with pytest.raises(UserInputError, match=r"environment column: 'other' not among"):
        box.start_batch(rows(1, environment=["other"]), [[{"role": "user", "content": "x"}]])


def test_refusals_name_the_culprit(tok):
    from trl_ext.testing import build_tokenizer

    class NoReset:
        def act(self) -> str:
            """Acts."""
            return ""

    class Silent:
        def reset(self, **row):
            return None

        def poke(self, x):
            return x

    class Idle:
        def reset(self, **row):
            return None

    def untyped(a, b):
        return a + b

    # the recipe loader's rules (tests/recipes/test_tool_recipes.py), named as the trainer's arguments
    with pytest.raises(UserInputError, match=r"^environment_factory: its instance \(NoReset\) has no reset method"):
        Toolbox(None, NoReset, tok)
    with pytest.raises(UserInputError, match=r"^environment_factory\['silent'\]: method 'poke': the chat template "
                                             r"cannot describe it"):
        Toolbox(None, {"count": Counter, "silent": Silent}, tok)
    with pytest.raises(UserInputError, match=r"^environment_factory: its environments have no public method and "
                                             r"there are no tools: the model would have nothing to call$"):
        Toolbox(None, Idle, tok)
    with pytest.raises(UserInputError, match=r"^environment_factory: calling it failed: ZeroDivisionError"):
        Toolbox([add], lambda: 1 / 0, tok)
    with pytest.raises(UserInputError, match=r"tools\[1\]: 3 is not a function"):
        Toolbox([add, 3], None, tok)
    with pytest.raises(UserInputError, match=r"^tools\[0\]: the chat template cannot describe it"):
        Toolbox([untyped], None, tok)
    with pytest.raises(UserInputError, match="does not render a tool-calling conversation"):
        Toolbox([add], None, build_tokenizer())  # the plain tiny tokenizer's template has no tools


def test_tool_suffix_is_what_the_template_renders_after_a_tool_call(tok):
    box = Toolbox([add], None, tok)
    suffix = box.tool_suffix_ids([{"role": "tool", "name": "add", "content": "5"}])
    assert tok.decode(suffix) == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def test_launches_where_turns_cannot_differ_between_processes_are_refused():
    from types import SimpleNamespace

    from trl_ext.ppo.episodes.multi_turn import MultiTurnRollout

    class Accelerator:
        distributed_type = "MULTI_CPU"

    with pytest.raises(UserInputError, match="tools: not supported under FSDP"):
        MultiTurnRollout.check_launch(Accelerator(), True, True)
    MultiTurnRollout.check_launch(Accelerator(), False, True)
    from accelerate.utils import DistributedType

    zero3 = SimpleNamespace(distributed_type=DistributedType.DEEPSPEED,
                            state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3)))
    with pytest.raises(UserInputError, match="ds3_gather_for_generation: false with tools under ZeRO-3"):
        MultiTurnRollout.check_launch(zero3, False, False)
    MultiTurnRollout.check_launch(zero3, False, True)


@pytest.mark.parametrize("settings, data, message", [
    ({}, {"input_ids": [[1, 2]]}, "train_dataset has no column 'prompt' (columns: input_ids); tools and "
     "environment_factory need the prompts as chat messages"),
    ({}, {"prompt": ["Add 2 and 3."]}, "train_dataset row 0: with tools and environment_factory 'prompt' must be chat "
     "messages"),
    ({"stop_token_id": 5}, None, "stop_token_id: 5 with tools; each turn ends at the tokenizer's EOS"),
    ({"dynamic_sampling": True, "advantage_estimator": "grpo", "num_samples_per_prompt": 2}, None,
     "dynamic_sampling: not supported with tools yet"),
    ({"reward_num_workers": 1}, None, "reward_num_workers: reward functions receive the environments"),
])
def test_what_the_trainer_refuses_with_tools(tok, tmp_path, settings, data, message):
    from datasets import Dataset

    from trl_ext import PPOConfig

    args = PPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **settings)
    dataset = Dataset.from_dict(data or {"prompt": [[{"role": "user", "content": "Add 2 and 3."}]]})
    with pytest.raises(UserInputError) as caught:
        Toolbox.for_trainer([add], Counter, tok, args, dataset)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_the_trainer_refuses_rows_that_name_no_given_environment(tok, tmp_path):
    """With several environments the dataset's ``environment`` column is checked when the trainer is built (the
    recipe loader's rule, before any episode), naming the first row that names an unknown one."""
    from datasets import Dataset

    from trl_ext import PPOConfig

    args = PPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    prompt = [{"role": "user", "content": "Add 2 and 3."}]
    factories = {"count": Counter, "quiet": Quiet}
    with pytest.raises(UserInputError, match="^train_dataset has no column 'environment' .*names several"):
        Toolbox.for_trainer([add], factories, tok, args, Dataset.from_dict({"prompt": [prompt]}))
    rows = Dataset.from_dict({"prompt": [prompt] * 3, "environment": ["count", "chess", "quiet"]})
    with pytest.raises(UserInputError, match=r"^train_dataset row 1: environment 'chess' is not one of "
                                             r"environment_factory's \(count, quiet\)$"):
        Toolbox.for_trainer([add], factories, tok, args, rows)


def test_reward_sources_prompt_rendering_and_the_tokenizers_own_parser(tok):
    import asyncio
    import functools

    from datasets import Dataset

    class AsyncCounter(Counter):
        async def get_reward(self) -> float:
            return float(self.count) + 0.5

    with pytest.raises(UserInputError, match="is not a function"):
        Toolbox([functools.partial(add, 1)], None, tok)  # callable, but no name the model could call
    box = Toolbox([add], AsyncCounter, tok)
    f = lambda **kw: [0.0]  # noqa: E731
    assert box.with_environment_rewards(None)[0].__name__ == "AsyncCounter"
    assert box.with_environment_rewards(f)[0] is f and len(box.with_environment_rewards([f, f])) == 3
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]
    prompts = box.start_batch([{"prompt": prompt, "start": 4}], [prompt])
    assert prompts[0] == [prompt[0], {"role": "user", "content": "q Start at 4."}]  # the last message, not the first
    assert asyncio.run(box.reward_functions()[0][0](environments=box.environments)) == [0.5]
    ids = box.render_dataset(Dataset.from_list([{"prompt": prompt}]))["input_ids"][0]
    assert ids == box.render_prompt(prompt, 0)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n") and '"name": "bump"' in tok.decode(ids)
    plain = Toolbox([add], None, tok)
    assert plain.start_batch([{"prompt": prompt}] * 2, [prompt] * 2) == [prompt] * 2
    assert plain.row_tools == [[add], [add]] and plain.environments is None
    own = build_tool_tokenizer()
    own.response_template = tok.response_template  # a tokenizer that brings its own parser keeps it
    marker = object()
    own.response_template = marker
    try:
        Toolbox([add], None, own)
    except Exception:  # noqa: BLE001 - the marker is no parser; only whether it was replaced matters here
        pass
    assert own.response_template is marker
