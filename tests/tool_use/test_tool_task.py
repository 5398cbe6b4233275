"""The tool-use task's pieces (recipes/tool_use): the tool, the reward on TRL's multi-turn completions, the data, and
that an SFT transcript is token for token the episode RL plays with ``tools=[add]``, its loss on the policy's own
tokens only; the careless demonstrator the tool SFT set imitates.

What must hold: ``add`` is a tool TRL accepts (its JSON schema comes from the type hints and docstring); the reward
reads the last assistant message of a message list (or a plain string); the pre-tokenized SFT transcripts start
with exactly the prompt tokens RL renders with the tool and go on with exactly the tokens an RL episode concatenates
(the tool call, TRL's tool-result suffix, the answer; or the answer at once where the demonstrator skips the tool),
and SFTTrainer's labels cover the call and the answer only; TRL's ``parse_response`` reads the transcript's
tool-call turn back as the call it was written from."""

from __future__ import annotations

import json

import pytest
from recipe_modules import read_jsonl, recipe_module

tool_task = recipe_module("tool_use", "tool_task")


@pytest.fixture(scope="module")
def modules():
    return tool_task, recipe_module("tool_use", "make_data"), recipe_module("tool_use", "evaluate")


def operands(row: dict) -> tuple[int, int]:
    """``(a, b)`` read back from a row's prompt ``What is a + b?``."""
    return tuple(int(x) for x in row["prompt"][0]["content"][len("What is "):-1].split(" + "))


def test_add_is_a_tool_trl_accepts():
    from transformers.utils import get_json_schema

    assert tool_task.add(48213, 90577) == 138790
    schema = get_json_schema(tool_task.add)["function"]
    assert schema["name"] == "add"
    assert schema["parameters"]["properties"] == {"a": {"type": "integer", "description": "The first number."},
                                                  "b": {"type": "integer", "description": "The second number."}}
    assert json.loads(tool_task.tools_json()) == [get_json_schema(tool_task.add)]


def test_exact_match_on_message_lists_and_strings():
    episode = tool_task.tool_transcript(48213, 90577)
    assert tool_task.exact_match([episode], ["138790"]) == [1.0]
    assert tool_task.exact_match([episode], [138791]) == [0.0]
    # the answer is read from the LAST assistant message only: the tool's correct result does not count
    wrong_final = episode[:2] + [{"role": "assistant", "content": "The sum is 138780."}]
    assert tool_task.exact_match([wrong_final], ["138790"]) == [0.0]
    cut_after_tool = episode[:2]  # truncated: the last assistant message is the call, whose content is empty
    assert tool_task.exact_match([cut_after_tool], ["138790"]) == [0.0]
    # plain text, the last integer, none at all
    assert tool_task.exact_match(["The sum is 138790.", "48213 + 90577 = 138790", "no idea", "138790 or 5"],
                                 ["138790"] * 4) == [1.0, 1.0, 0.0, 0.0]
    assert tool_task.exact_match([tool_task.direct_transcript(1, 2)], ["3"]) == [1.0]
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        tool_task.exact_match(["1", "2"], ["1"])


def test_split_is_disjoint_and_deterministic():
    train, heldout = tool_task.split(seed=0, train=50, heldout=20)
    assert (len(train), len(heldout)) == (50, 20) and not set(train) & set(heldout)
    assert all(10_000 <= x <= 99_999 for pair in train + heldout for x in pair)
    assert tool_task.split(seed=0, train=50, heldout=20) == (train, heldout)


def test_data_files(tool_use_data):
    rows = {name: read_jsonl(tool_use_data / "data" / f"{name}.jsonl")
            for name in ("train", "heldout", "sft_tools", "sft_no_tools")}
    assert [len(rows[n]) for n in rows] == [6, 3, 6, 6]
    for rl, with_tool, without in zip(rows["train"], rows["sft_tools"], rows["sft_no_tools"]):
        assert without["prompt"] == rl["prompt"]
        a, b = operands(rl)
        assert rl["answer"] == str(a + b)
        assert tool_task.exact_match([without["completion"]], [rl["answer"]]) == [1.0]
        assert sorted(with_tool) == ["completion_mask", "input_ids"]  # pre-tokenized (tokens: the tests below)
        assert len(with_tool["input_ids"]) == len(with_tool["completion_mask"]) <= tool_task.MAX_POSITIONS


def sft_tools_trainer(tool_use_data):
    """trl_ext.SFTTrainer on the pre-tokenized tool transcripts, with ``sft_tools.yaml``'s completion_only_loss
    (without it TRL ignores the data's completion_mask and the labels cover the whole sequence)."""
    import yaml
    from datasets import load_dataset
    from recipe_modules import RECIPES
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import trl_ext

    recipe = yaml.safe_load(open(RECIPES / "tool_use" / "sft_tools.yaml"))
    base = tool_use_data / "base"
    tok = AutoTokenizer.from_pretrained(base)
    ds = load_dataset("json", data_files=str(tool_use_data / "data" / "sft_tools.jsonl"), split="train")
    args = trl_ext.SFTConfig(output_dir=str(tool_use_data / "sft"), max_length=tool_task.MAX_POSITIONS, use_cpu=True,
                             report_to="none",
                             completion_only_loss=recipe.get("completion_only_loss"))
    return tok, trl_ext.SFTTrainer(model=AutoModelForCausalLM.from_pretrained(base), args=args, train_dataset=ds,
                                   processing_class=tok)


def rl_pieces(tok, a: int, b: int, modules, calls: bool = True):
    """The RL view of problem (a, b): the prompt rendered with tools=[add], the call the model writes, TRL's
    tool-result suffix, the answer; without ``calls`` (the demonstrator answers at once) no call and no suffix, and
    the answer is the carry-free sum."""
    _, _, evaluate = modules
    prompt = tok.apply_chat_template(tool_task.prompt_messages(a, b), tools=tool_task.TOOLS,
                                     add_generation_prompt=True, tokenize=True, return_dict=False)
    if not calls:
        return prompt, [], [], tok(f"The sum is {tool_task.carry_free_sum(a, b)}.<|im_end|>")["input_ids"]
    call = tok('<tool_call>\n{"name": "add", "arguments": {"a": %d, "b": %d}}\n</tool_call><|im_end|>'
               % (a, b))["input_ids"]
    suffix = evaluate.tool_suffix_ids(tok, [{"role": "tool", "name": "add", "content": str(a + b)}])
    answer = tok(f"The sum is {a + b}.<|im_end|>")["input_ids"]
    return prompt, call, suffix, answer


def demonstrated(tool_use_data):
    """(a, b, whether the demonstrator called the tool) of each SFT transcript, from the training problems."""
    pairs = [operands(row) for row in read_jsonl(tool_use_data / "data" / "train.jsonl")]
    return [(a, b, len(c) == 3) for (a, b), c in zip(pairs, tool_task.demonstrator_transcripts(pairs, seed=0))]


def test_the_demonstrator_skips_the_tool_below_careful_from_most_of_the_time():
    """The tool SFT set's demonstrator: the tool on every first operand >= 50000; below, on 254 of the 880 (0.289,
    TOOL_RATE 0.3) of the 2000 training problems, the carry-free sum at once on the others (right only where no
    column carries)."""
    assert tool_task.carry_free_sum(48213, 30577) == 78780 and tool_task.carry_free_sum(12345, 54321) == 66666
    assert tool_task.carry_free_sum(99999, 99999) == 88888 and tool_task.carry_free_sum(10000, 90000) == 0
    train, _ = tool_task.split(seed=0)
    done = tool_task.demonstrator_transcripts(train, seed=0)
    assert done == tool_task.demonstrator_transcripts(train, seed=0)  # deterministic
    assert all(c == tool_task.tool_transcript(a, b) for (a, b), c in zip(train, done) if a >= tool_task.CAREFUL_FROM)
    small = [((a, b), c) for (a, b), c in zip(train, done) if a < tool_task.CAREFUL_FROM]
    called = [c == tool_task.tool_transcript(a, b) for (a, b), c in small]
    assert (len(small), sum(called)) == (880, 254)
    assert all(c == tool_task.direct_transcript(a, b, tool_task.carry_free_sum(a, b))
               for ((a, b), c), call in zip(small, called) if not call)


def test_sft_transcript_is_the_rl_episode(tool_use_data, modules):
    """The pre-tokenized tool transcripts are the RL prompt rendered with tools=[add] then the RL episode's tokens:
    the call the model writes, TRL's tool-result suffix, the answer through its end of turn."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import add_response_schema

    from trl_ext.ppo.episodes.toolbox import parse_turn  # TRL's parse_response on TRL 1.12 too

    tok = AutoTokenizer.from_pretrained(tool_use_data / "base")
    add_response_schema(tok)
    kinds = demonstrated(tool_use_data)
    assert {calls for _, _, calls in kinds} == {True, False}  # both kinds among the 6 problems
    for (a, b, calls), example in zip(kinds, read_jsonl(tool_use_data / "data" / "sft_tools.jsonl")):
        prompt, call, suffix, answer = rl_pieces(tok, a, b, modules, calls)
        assert example["input_ids"] == prompt + call + suffix + answer
        if not calls:
            assert parse_turn(tok, answer, prompt, tool_task.TOOLS) == tool_task.direct_transcript(
                a, b, tool_task.carry_free_sum(a, b))[0]
            continue
        assert parse_turn(tok, call, prompt, tool_task.TOOLS) == tool_task.tool_call_message(a, b)
        assert tok.decode(suffix) == f"\n<|im_start|>user\n<tool_response>\n{a + b}\n</tool_response><|im_end|>\n" \
                                     "<|im_start|>assistant\n"


def test_sft_loss_covers_only_the_policys_tokens(tool_use_data, modules):
    """completion_mask is 0 exactly on the prompt and on the tool-result suffix (the tool's result is not the
    policy's to predict, as RL masks it), 1 on the call and the answer; TRL's SFTTrainer with
    completion_only_loss (sft_tools.yaml) turns it into labels -100 on exactly those tokens."""
    tok, trainer = sft_tools_trainer(tool_use_data)
    examples = read_jsonl(tool_use_data / "data" / "sft_tools.jsonl")
    for (a, b, calls), example in zip(demonstrated(tool_use_data), examples):
        prompt, call, suffix, answer = rl_pieces(tok, a, b, modules, calls)
        assert example["completion_mask"] == [0] * len(prompt) + [1] * len(call) + [0] * len(suffix) + [1] * len(answer)
    for k, example in enumerate(read_jsonl(tool_use_data / "data" / "sft_tools.jsonl")):
        ids, mask = example["input_ids"], example["completion_mask"]
        labels = trainer.data_collator([dict(trainer.train_dataset[k])])["labels"][0].tolist()
        assert labels == [t if m else -100 for t, m in zip(ids, mask)]
        # the labelled tokens are the call and the answer (or the answer alone), the tool's result nowhere among them
        kept = tok.decode([t for t in labels if t != -100])
        calls = demonstrated(tool_use_data)[k][2]
        assert "<tool_response>" not in kept and kept.count("<|im_end|>") == 1 + calls
        assert kept.startswith("<tool_call>" if calls else "The sum is")
