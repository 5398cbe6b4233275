"""Bad data found before training: one line naming the file, the row and the column (trl_ext/recipe_loader/data_rows.py).

`trl-ext check` reads local datasets' rows; `trl-ext train` checks every split it opens before any model loads.
In-process CLI calls on the tiny models.
"""

import json

import pytest
import yaml

from trl_ext.cli import main

PAIR = {"prompt": "Say something:", "chosen": " good happy", "rejected": " bad sad"}


@pytest.fixture
def cli(tmp_path, monkeypatch, capsys, tiny_models):
    """Run a command on a recipe; returns (exit code, last stderr line)."""
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))

    def run(command, trainer="reward", dataset=None, **extra):
        model = "tiny://reward" if trainer == "reward" else "tiny://policy"
        keys = dict(trainer=trainer, model_name_or_path=model, dataset_name=str(dataset),
                    output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", max_steps=1,
                    save_strategy="no", logging_steps=1)
        if trainer == "ppo":
            keys.update(reward_model_path="tiny://reward", total_episodes=4, per_device_train_batch_size=2,
                        num_sample_generations=0, response_length=4)
            keys.pop("max_steps")
        keys.update(extra)
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(keys))
        rc = main([command, str(path)])
        err = capsys.readouterr().err.strip().splitlines()
        assert not (tmp_path / "out").exists(), "nothing may be written"
        assert not any("Traceback" in line for line in err)
        return rc, (err[-1] if err else "")

    return run


def jsonl(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("trainer, rows, expected", [
    ("reward", [PAIR, {"prompt": "x", "chosen": " a"}], "row 1 (line 2) column 'rejected': missing (null)"),
    ("reward", [PAIR, {**PAIR, "chosen": ""}], "row 1 (line 2) column 'chosen': empty text"),
    ("dpo", [PAIR, PAIR, {**PAIR, "prompt": " \t "}], "row 2 (line 3) column 'prompt': whitespace-only text"),
    ("dpo", [PAIR, {**PAIR, "rejected": PAIR["chosen"]}],
     "row 1 (line 2) column 'rejected': identical to 'chosen' (a pair must differ)"),
    ("ppo", [{"prompt": "Say"}, {"prompt": "   "}], "row 1 (line 2) column 'prompt': whitespace-only text"),
    ("sft", [{"prompt": "a", "completion": " b"}, {"prompt": "a", "completion": "\n"}],
     "row 1 (line 2) column 'completion': whitespace-only text"),
    ("reward", [{"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " "}],
                 "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no"}]}],
     "row 0 (line 1) column 'chosen': whitespace-only text"),
])
def test_bad_rows_of_a_jsonl_file(tmp_path, cli, trainer, rows, expected):
    path = jsonl(tmp_path, rows)
    for command in ("check", "train"):
        rc, line = cli(command, trainer, path)
        assert rc == 2 and line == f"trl-ext: error: dataset '{path}' split 'train' {expected}", line


def test_empty_responses_on_request(tmp_path, cli):
    """allow_empty_responses: true accepts empty responses (sampled data), never an empty prompt or a missing value."""
    path = jsonl(tmp_path, [PAIR, {**PAIR, "rejected": " "}])
    assert cli("check", "reward", path)[0] == 2
    assert cli("check", "reward", path, allow_empty_responses=True)[0] == 0
    path = jsonl(tmp_path, [PAIR, {**PAIR, "prompt": ""}])
    rc, line = cli("check", "reward", path, allow_empty_responses=True)
    assert rc == 2 and line.endswith("row 1 (line 2) column 'prompt': empty text")
    path = jsonl(tmp_path, [PAIR, {"prompt": "x", "chosen": "a"}])
    assert cli("check", "dpo", path, allow_empty_responses=True)[0] == 2


def test_undecodable_text_and_broken_lines(tmp_path, cli):
    path = tmp_path / "data.jsonl"
    path.write_bytes(json.dumps(PAIR).encode() + b"\n\n" + b'{"prompt": "x", "chosen": "caf\xe9", "rejected": "b"}\n')
    rc, line = cli("check", "reward", path)
    assert rc == 2 and line == (f"trl-ext: error: dataset '{path}' row 1 (line 3) column 'chosen': undecodable text "
                                "(byte 0xe9 is not UTF-8)")
    path.write_text(json.dumps(PAIR) + "\n" + '{"prompt": "x", "chosen": \n')
    rc, line = cli("check", "reward", path)
    assert rc == 2 and line.startswith(f"trl-ext: error: dataset '{path}' row 1 (line 2): not valid JSON")
    path.write_text("\n")
    rc, line = cli("check", "reward", path)
    assert rc == 2 and line == f"trl-ext: error: dataset '{path}' is empty: no rows to train on"


def test_json_and_parquet_files(tmp_path, cli):
    import datasets

    path = tmp_path / "pairs.json"
    path.write_text(json.dumps([PAIR, {**PAIR, "prompt": None}, {**PAIR, "rejected": None}]))
    rc, line = cli("check", "reward", path)  # a null prompt is allowed (pairs without one); a null response is not
    assert rc == 2 and line == f"trl-ext: error: dataset '{path}' split 'train' row 2 column 'rejected': missing (null)"
    path = tmp_path / "pairs.parquet"
    datasets.Dataset.from_list([PAIR, PAIR, {**PAIR, "chosen": "  "}]).to_parquet(str(path))
    rc, line = cli("check", "dpo", path)
    assert rc == 2
    assert line == f"trl-ext: error: dataset '{path}' split 'train' row 2 column 'chosen': whitespace-only text"


def test_prompt_alone_over_the_length_limit(tmp_path, cli):
    long_prompt = "word " * 40
    path = jsonl(tmp_path, [PAIR, {**PAIR, "prompt": long_prompt}])
    for command in ("check", "train"):
        rc, line = cli(command, "dpo", path, max_length=24)
        assert rc == 2, line
        assert line.startswith(f"trl-ext: error: dataset '{path}' split 'train' row 1 (line 2) column 'prompt': "
                               "the prompt alone has ")
        assert "over the limit (max_length: 24)" in line
    assert cli("check", "dpo", path, max_length=256)[0] == 0
    # PPO: the tiny policy has 256 positions; prompt + response_length must fit
    path = jsonl(tmp_path, [{"prompt": "Say"}, {"prompt": "word " * 300}], name="prompts.jsonl")
    rc, line = cli("check", "ppo", path)
    assert rc == 2 and "row 1 (line 2) column 'prompt': the prompt alone has" in line
    assert "(the model's max_position_embeddings 256 - response_length 4)" in line
    # the checkpoint's config.json alone: a response that leaves no room for a prompt
    rc, line = cli("check", "ppo", path, response_length=256)
    assert rc == 2 and line == ("trl-ext: error: recipe: key 'response_length': 256 leaves no room for a prompt in the "
                                "model's max_position_embeddings 256 (valid: an integer < 256)")


def test_train_checks_what_check_cannot_see(tmp_path, cli):
    """A bad row in the eval split: `check` reads the train split only; `train` refuses before any model loads."""
    data = tmp_path / "pairs"
    data.mkdir()
    jsonl(data, [PAIR, PAIR], name="train.jsonl")
    jsonl(data, [PAIR, {**PAIR, "rejected": ""}], name="test.jsonl")
    keys = dict(eval_strategy="steps", eval_steps=1)
    rc, line = cli("check", "reward", data, **keys)
    assert rc == 0
    rc, line = cli("train", "reward", data, **keys)
    assert rc == 2 and line == f"trl-ext: error: dataset '{data}' split 'test' row 1 column 'rejected': empty text"


def test_a_dataset_left_empty_by_trls_length_filter_is_refused(tmp_path, cli):
    """TRL's reward trainer drops pairs longer than max_length: with none left the run is refused, not 'trained'."""
    path = jsonl(tmp_path, [{"chosen": "word " * 30, "rejected": "other " * 30}] * 2)
    rc, line = cli("train", "reward", path, max_length=16)
    assert rc == 2 and line == (f"trl-ext: error: dataset '{path}': no row fits max_length: 16 (TRL drops longer "
                                "rows); raise max_length or shorten the rows")


def test_chat_messages(tmp_path, cli):
    """Conversational SFT data: an empty system prompt is fine, an empty user or assistant turn is not."""
    turns = [{"role": "system", "content": ""}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "hello"}]
    path = jsonl(tmp_path, [{"messages": turns}])
    assert cli("check", "sft", path)[0] == 0
    path = jsonl(tmp_path, [{"messages": turns}, {"messages": [*turns[:2], {"role": "assistant", "content": " "}]}])
    rc, line = cli("check", "sft", path)
    assert rc == 2 and line.endswith("row 1 (line 2) column 'messages': whitespace-only text")


def test_evaluation_without_evaluation_data_is_refused_before_any_model_loads(tmp_path, cli):
    """`eval_strategy: steps` with a local file (its only split is train) and no eval_dataset_name: `check` and
    `train` refuse it in the same line (exit 2); eval_dataset_name names the data and the run trains."""
    path = jsonl(tmp_path, [{"prompt": "Say"}, {"prompt": "Tell"}], name="prompts.jsonl")
    keys = dict(eval_strategy="steps", eval_steps=1)
    expected = (f"trl-ext: error: eval_strategy: evaluation needs its data, and dataset '{path}' has no split 'test' "
                "(splits: train); name it with dataset_test_split or eval_dataset_name, or set eval_strategy 'no'")
    assert cli("check", "ppo", path, **keys) == (2, expected)
    assert cli("train", "ppo", path, **keys) == (2, expected)
    rc, line = cli("check", "ppo", path, eval_dataset_name=str(tmp_path / "none.jsonl"), **keys)
    assert rc == 2 and "recipe: key 'eval_dataset_name': local path" in line and "does not exist" in line
    assert cli("check", "ppo", path, eval_dataset_name=str(path), **keys)[0] == 0
