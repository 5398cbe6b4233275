"""Recipes with `tools` and `environment_factory` (trl_ext.recipe_loader.tool_keys): what `trl-ext check` verifies
before any model loads (one line naming the culprit, exit 2), what the resolved recipe holds, and one update of
`trl-ext train` on a tiny model whose chat template renders and parses tool calls."""

import json
from pathlib import Path

import pytest
import yaml

from trl_ext.cli import main
from trl_ext.recipe_loader.loader import resolve_recipe

TOOLS_PY = '''
NOT_CALLABLE = 3


def add(a: int, b: int) -> int:
    """Adds two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def untyped(a, b):
    """Adds two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def answer_reward(completions, environments, **kwargs):  # reads the environments the trainer passes
    return [float(env.target) for env in environments]


class Guess:
    """Guess the sum; scored at the end with the row's answer (a number the test knows)."""

    def reset(self, **row):
        self.target = row["answer"]
        return " Guess!"

    def guess(self, n: int) -> str:
        """Checks a guess.

        Args:
            n: The guess.
        """
        return "yes" if n == self.target else "no"

    def get_reward(self):
        return float(self.target)


class Warmer(Guess):
    """Per-turn rewards too (trl-ext's get_turn_reward): not a tool."""

    def get_turn_reward(self):
        return None


class Quiet:
    """An environment without get_reward: the rewards come from elsewhere."""

    def reset(self, **row):
        return None

    def look(self) -> str:
        """Looks around."""
        return "nothing"


class NoReset:
    def look(self) -> str:
        """Looks around."""
        return "nothing"


class Broken:
    def __init__(self):
        raise RuntimeError("sandbox unavailable")


class Untyped:
    def reset(self, **row):
        return None

    def poke(self, x):
        return x


class Counted(Guess):
    """Counts its instances."""

    built = 0

    def __init__(self):
        Counted.built += 1


class Idle:
    def reset(self, **row):
        return None

    def get_reward(self):
        return 1.0
'''

ANSWERS = {(2, 3): 5, (4, 1): 5, (7, 5): 12, (6, 6): 12}


def transcript(a: int, b: int) -> list:
    """An episode as the recipe's tools and environment make it: the user's question with reset's text, a call of
    `add`, its result, the answer."""
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    return [{"role": "user", "content": f"Add {a} and {b}. Guess!"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "add", "content": str(a + b)},
            {"role": "assistant", "content": f"The sum is {a + b}."}]


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    """A tiny causal LM with a tokenizer whose chat template (TRL's Qwen2.5) renders and parses tool calls, fitted
    to the four episodes of `transcript` (rendered with the recipe's tools, `add` and the environment's `guess`), so
    that it calls `add` when it samples (~15 s)."""
    from trl_ext.testing import build_causal_lm
    from trl_ext.testing.tools import build_tool_tokenizer, fit_to_conversations

    path = tmp_path_factory.mktemp("tool_model")
    tokenizer = build_tool_tokenizer(["Add 2 and 3.", "The sum is 5."])
    model = build_causal_lm(tokenizer, max_position_embeddings=1024)
    namespace: dict = {}
    exec(TOOLS_PY, namespace)  # the schemas the trainer renders: the same functions' docstrings and types
    tools = [namespace["add"], namespace["Guess"]().guess]
    fit_to_conversations(model, tokenizer, [transcript(a, b) for a, b in ANSWERS], tools, steps=150, lr=3e-3)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def recipe_dir(tmp_path, monkeypatch, tiny_models):
    """A recipe folder: chat prompts with an `answer` column, a tools file next to the recipe."""
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    write_rows(tmp_path / "sums.jsonl", [{"prompt": [{"role": "user", "content": f"Add {a} and {b}."}], "answer": s}
                                         for (a, b), s in ANSWERS.items()])
    return tmp_path


def keys(recipe_dir, tool_model, **extra):
    out = dict(trainer="ppo", model_name_or_path=str(tool_model), dataset_name=str(recipe_dir / "sums.jsonl"),
               output_dir=str(recipe_dir / "out"), tools=["my_tools.py:add"], environment_factory="my_tools.py:Guess",
               total_episodes=4, per_device_train_batch_size=4, num_mini_batches=1, num_ppo_epochs=1,
               response_length=16, stop_token="eos", num_sample_generations=0, use_cpu=True, report_to="none",
               save_strategy="no", logging_steps=1, seed=0)
    out.update(extra)
    return {k: v for k, v in out.items() if v is not None}


def write(recipe_dir, tool_model, **extra):
    path = recipe_dir / "recipe.yaml"
    path.write_text(yaml.safe_dump(keys(recipe_dir, tool_model, **extra), sort_keys=False))
    return path


def cli(capsys, command, path, *overrides):
    rc = main([command, str(path), *overrides])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()  # the last line: datasets may draw a progress bar before it
    assert not any("Traceback" in line for line in err)
    return rc, captured.out, err[-1] if err else ""


def test_check_prints_the_tools_and_environment_it_checked(recipe_dir, tool_model, capsys):
    path = write(recipe_dir, tool_model)
    rc, out, err = cli(capsys, "check", path)
    assert rc == 0, err
    assert "# tools: add (imported; JSON schemas for the chat template)" in out
    assert "# environment: Guess (reset; tools: guess; reward: get_reward)" in out
    resolved = yaml.safe_load(out[out.index("trainer:"):])
    # the files by their absolute paths (the copy in the output directory runs from anywhere)
    tools_py = (recipe_dir / "my_tools.py").resolve()
    assert resolved["tools"] == [f"{tools_py}:add"] and resolved["environment_factory"] == f"{tools_py}:Guess"
    # the environment's get_reward is the reward: no reward model, no reward functions
    assert "reward_model_path" not in resolved and "reward_funcs" not in resolved

    recipe = resolve_recipe(path, for_check=True)
    assert recipe.tools[0](a=2, b=3) == 5 and recipe.environment_factory.__name__ == "Guess"
    assert recipe.tool_entries == ["recipe: key 'tools' entry 1 'my_tools.py:add'"]
    assert recipe.reward_model_args is None and recipe.reward_funcs == []
    copy = recipe_dir / "elsewhere" / "copy.yaml"
    copy.parent.mkdir()
    copy.write_text(recipe.to_yaml())
    assert resolve_recipe(copy, for_check=True).tools[0](a=4, b=1) == 5
    # GRPO (a PPO recipe with advantage_estimator: grpo) takes the same keys, also on the command line; a reward
    # function that needs `environments` is accepted in a run with environments (the trainer passes them)
    rc, out, err = cli(capsys, "check", write(recipe_dir, tool_model, advantage_estimator="grpo",
                                              num_samples_per_prompt=2),
                       "--environment_factory", "my_tools.py:Quiet", "--reward_funcs", "my_tools.py:answer_reward")
    assert rc == 0, err
    assert "# environment: Quiet (reset; tools: look; reward: none)" in out
    assert "# reward functions: answer_reward" in out
    rc, out, err = cli(capsys, "check", path, "--environment_factory", "my_tools.py:Warmer")
    assert rc == 0, err
    assert "# environment: Warmer (reset; tools: guess; reward: get_reward, get_turn_reward)" in out
    rc, out, err = cli(capsys, "check", path, "--tools", "my_tools.py:add", "my_tools.py:untyped")  # replaces the list
    assert rc == 2 and "recipe: key 'tools' entry 2 'my_tools.py:untyped': the chat template cannot" in err, err


def test_several_environments_chosen_by_the_environment_column(recipe_dir, tool_model, capsys):
    rows = [{"prompt": [{"role": "user", "content": "Add 2 and 3."}], "answer": 5, "environment": env}
            for env in ("guess", "quiet")]
    data = write_rows(recipe_dir / "mixed.jsonl", rows)
    envs = {"guess": "my_tools.py:Guess", "quiet": "my_tools.py:Quiet"}
    rc, out, err = cli(capsys, "check", write(recipe_dir, tool_model, dataset_name=data, environment_factory=envs,
                                              tools=None))
    assert rc == 0, err
    assert "# environment: guess: Guess (reset; tools: guess; reward: get_reward)" in out
    assert "# environment: quiet: Quiet (reset; tools: look; reward: none)" in out
    resolved = yaml.safe_load(out[out.index("trainer:"):])
    tools_py = (recipe_dir / "my_tools.py").resolve()
    assert resolved["environment_factory"] == {"guess": f"{tools_py}:Guess", "quiet": f"{tools_py}:Quiet"}
    recipe = resolve_recipe(recipe_dir / "recipe.yaml", for_check=True)
    assert {k: f.__name__ for k, f in recipe.environment_factory.items()} == {"guess": "Guess", "quiet": "Quiet"}


def text_prompts(recipe_dir):
    return write_rows(recipe_dir / "text.jsonl", [{"prompt": "Add 2 and 3.", "answer": 5}])


def token_prompts(recipe_dir):
    return write_rows(recipe_dir / "ids.jsonl", [{"input_ids": [1, 2, 3]}])


def no_environment_column(recipe_dir):
    return str(recipe_dir / "sums.jsonl")


def unknown_environment(recipe_dir):
    return write_rows(recipe_dir / "unknown.jsonl", [
        {"prompt": [{"role": "user", "content": "Add 2 and 3."}], "answer": 5, "environment": env}
        for env in ("guess", "chess")])


TWO_ENVS = {"guess": "my_tools.py:Guess", "quiet": "my_tools.py:Quiet"}
MISSING_REWARD = ("recipe: missing key 'reward_model_path' (the reward model PPO optimises) or 'reward_funcs' "
                  "(reward functions)")


@pytest.mark.parametrize("extra, expected", [
    (dict(tools=["no_such_module_xyz:f"]),
     "recipe: key 'tools' entry 1 'no_such_module_xyz:f': no module named 'no_such_module_xyz'"),
    (dict(tools=["my_tools.py:ad"]),
     "recipe: key 'tools' entry 1 'my_tools.py:ad': file 'my_tools.py' has no function 'ad' (did you mean 'add'?)"),
    (dict(tools=["my_tools.py:add", "my_tools.py:NOT_CALLABLE"]),
     "recipe: key 'tools' entry 2 'my_tools.py:NOT_CALLABLE': 'NOT_CALLABLE' in file 'my_tools.py' is not callable"),
    (dict(tools=["my_tools.py:untyped"]),
     "recipe: key 'tools' entry 1 'my_tools.py:untyped': the chat template cannot describe it "
     "(TypeHintParsingException"),
    (dict(tools=[{"url": "http://localhost:1/add"}]),
     "recipe: key 'tools' entry 1 'http://localhost:1/add': a tool is a Python function"),
    (dict(environment_factory="no_such_module_xyz:Env"),
     "recipe: key 'environment_factory' 'no_such_module_xyz:Env': no module named 'no_such_module_xyz'"),
    (dict(environment_factory="my_tools.py:NOT_CALLABLE"),
     "recipe: key 'environment_factory' 'my_tools.py:NOT_CALLABLE': 'NOT_CALLABLE' in file 'my_tools.py' is not "
     "callable"),
    (dict(environment_factory="my_tools.py:NoReset"),
     "recipe: key 'environment_factory' 'my_tools.py:NoReset': its instance (NoReset) has no reset method"),
    (dict(environment_factory="my_tools.py:Broken"),
     "recipe: key 'environment_factory' 'my_tools.py:Broken': calling it failed: RuntimeError: sandbox unavailable"),
    (dict(environment_factory="my_tools.py:Untyped"),
     "recipe: key 'environment_factory' 'my_tools.py:Untyped': method 'poke': the chat template cannot describe it"),
    (dict(environment_factory="my_tools.py:Idle", tools=None),
     "recipe: key 'environment_factory': its environments have no public method and there are no tools: the model "
     "would have nothing to call"),
    (dict(environment_factory={"guess": ["my_tools.py:Guess"]}),
     "recipe: key 'environment_factory' environment 'guess': give 'module:callable'"),
    (dict(environment_factory="my_tools.py:Quiet"),
     MISSING_REWARD + "; environment_factory's environments have no get_reward method either"),
    (dict(environment_factory=None), MISSING_REWARD),
    (dict(reward_num_workers=2), "recipe: key 'reward_num_workers': reward functions receive the environments"),
    (dict(dynamic_sampling=True, advantage_estimator="grpo", num_samples_per_prompt=2),
     "recipe: key 'dynamic_sampling': not supported with tools yet"),
    (dict(environment_factory=None, reward_funcs=["my_tools.py:answer_reward"]),
     "recipe: key 'reward_funcs' entry 1 'my_tools.py:answer_reward': function 'answer_reward' needs 'environments'"),
    (dict(reward_funcs=["my_tools.py:answer_reward"], reward_weights=[1.0]),
     "recipe: key 'reward_weights' has 1 weight for 2 rewards (answer_reward, Guess); give one per reward, the reward "
     "model first, the environments' get_reward last"),
    (dict(dataset_name=text_prompts), "row 0: with tools and environment_factory 'prompt' must be chat messages"),
    (dict(dataset_name=token_prompts), "split 'train' has no column 'prompt' (columns: input_ids); tools and "
     "environment_factory need the prompts as chat messages"),
    (dict(dataset_name=no_environment_column, environment_factory=TWO_ENVS),
     "split 'train' has no column 'environment' (columns: prompt, answer); environment_factory names several"),
    (dict(dataset_name=unknown_environment, environment_factory=TWO_ENVS),
     "split 'train' row 1: environment 'chess' is not one of environment_factory's (guess, quiet)"),
    (dict(max_tool_calling_iterations=0),  # a field's own `range` metadata: field_rules reads it, argparse does not
     "recipe: key 'max_tool_calling_iterations': 0 is out of range (valid: an integer >= 1)"),
    (dict(stop_token=None, stop_token_id=999), "recipe: key 'stop_token_id': 999 with tools; each turn ends at the "
     "tokenizer's EOS"),
    (dict(model_name_or_path="tiny://policy"),
     "recipe: key 'model_name_or_path': the chat template of 'tiny://policy' does not render a tool-calling"),
    (dict(trainer="dpo", environment_factory=None, dataset_name="recipes/demo/data/preferences.jsonl",
          total_episodes=None, num_mini_batches=None, num_ppo_epochs=None, response_length=None, stop_token=None,
          num_sample_generations=None), "recipe: key 'tools' is for PPO recipes only"),
])
def test_each_problem_is_one_line_exit_2_before_any_model_loads(recipe_dir, tool_model, capsys, monkeypatch, extra,
                                                               expected):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    if callable(extra.get("dataset_name")):
        extra["dataset_name"] = extra["dataset_name"](recipe_dir)
    rc, _, err = cli(capsys, "check", write(recipe_dir, tool_model, **extra))
    assert rc == 2 and err.startswith("trl-ext: error: ") and expected in err, err
    if expected == MISSING_REWARD:
        assert err == f"trl-ext: error: {expected}"  # the message without environments is kept as it was
    assert not (recipe_dir / "out").exists()


def test_train_refuses_text_prompts_before_loading_a_model(recipe_dir, tool_model, capsys, monkeypatch):
    """The data checks of `check` run in `train` too, before any model loads (the model's weights are removed: a
    load would fail differently)."""
    import shutil

    model = recipe_dir / "no_weights"
    shutil.copytree(tool_model, model)
    for weights in model.glob("*.safetensors"):
        weights.unlink()
    rc, _, err = cli(capsys, "train", write(recipe_dir, tool_model, model_name_or_path=str(model),
                                            dataset_name=text_prompts(recipe_dir)))
    assert rc == 2 and "row 0: with tools and environment_factory 'prompt' must be chat messages" in err, err


def test_train_one_update_with_a_tool_and_an_environment(recipe_dir, tool_model, capsys):
    """`trl-ext train`: the recipe's tool and environment reach the trainer. The environment is reset with each row
    (its text appended to the prompt); the model (fitted to call `add`) calls the tool from the recipe's file, in a
    worker process (`tool_num_workers: 1`), and reads the sum; the environment's get_reward, the row's answer, is the
    only reward: the mean of the batch's answers (5, 5, 12, 12 -> 8.5). GAE's value model starts from the policy.
    What the tiny model samples is not pinned (on another CPU one episode of four did not call the tool): the metrics
    must agree with the episodes the completions log shows, and every call that happened must come back right."""
    path = write(recipe_dir, tool_model, log_completions=True, temperature=0.1, response_length=64,
                 tool_num_workers=1, max_tool_calling_iterations=1)
    rc, out, err = cli(capsys, "train", path)
    assert rc == 0, err
    run = recipe_dir / "out"
    logs = [h for h in json.loads((run / "trainer_state.json").read_text())["log_history"] if "reward" in h]
    assert len(logs) == 1
    assert logs[0]["rewards/Guess/mean"] == pytest.approx(8.5) and logs[0]["objective/scores"] == pytest.approx(8.5)
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert sorted(r["Guess"] for r in rows) == [5.0, 5.0, 12.0, 12.0]
    # an episode that calls `add` (no failure) gets its result and one more turn (max_tool_calling_iterations 1); a
    # malformed call (seen: an unclosed `<tool_call>`) is no call, as in TRL, and ends the episode
    called = [r for r in rows if "[observation]" in r["episode"]]
    share = len(called) / len(rows)
    assert called, "the model fitted to call `add` called it in no episode"
    assert (logs[0]["tools/call_frequency"], logs[0]["tools/failure_frequency"]) == (pytest.approx(share), 0.0)
    assert logs[0]["episodes/turns_mean"] == pytest.approx(1 + share)
    for r in rows:  # reset's text after the user's; the reward is the row's answer
        a, b = map(int, r["prompt"][-1]["content"].removesuffix(". Guess!").removeprefix("Add ").split(" and "))
        assert r["prompt"][-1]["content"] == f"Add {a} and {b}. Guess!" and r["Guess"] == ANSWERS[a, b]
    for r in called:  # the observation is what the recipe's `add` returned for the arguments the model gave it
        call = json.loads(r["episode"].split("<tool_call>")[1].split("</tool_call>")[0])
        observation = r["episode"].split("[observation]")[1].split("[/observation]")[0]
        result = observation.split("<tool_response>")[1].split("</tool_response>")[0].strip()
        assert call["name"] == "add" and result == str(call["arguments"]["a"] + call["arguments"]["b"]), r["episode"]
    # the resolved recipe in the output directory names the files by absolute paths
    saved = yaml.safe_load((run / "trl_ext_recipe.yaml").read_text())
    assert saved["tools"] == [f"{(recipe_dir / 'my_tools.py').resolve()}:add"]


def test_train_builds_the_environment_once_for_the_loader_and_the_trainer(recipe_dir, tool_model):
    """The recipe loader of `trl-ext train` checks the environment on one instance, and the trainer's check plays
    that one instead of building another; `trl-ext check` keeps nothing."""
    from datasets import Dataset
    from transformers import AutoTokenizer

    from trl_ext.ppo.episodes.toolbox import Toolbox

    path = write(recipe_dir, tool_model, environment_factory="my_tools.py:Counted")
    recipe = resolve_recipe(path)
    counted = recipe.environment_factory
    assert counted.built == 1
    tokenizer = AutoTokenizer.from_pretrained(tool_model)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "Add 2 and 3."}]]})
    box = Toolbox.for_trainer(recipe.tools, counted, tokenizer, recipe.training_args, data)
    assert counted.built == 1 and type(box.pool[None][0]) is counted
    Toolbox.for_trainer(recipe.tools, counted, tokenizer, recipe.training_args, data)  # a second trainer: its own
    assert counted.built == 2
    resolve_recipe(path, for_check=True)
    Toolbox.for_trainer(recipe.tools, counted, tokenizer, recipe.training_args, data)
    assert counted.built == 4


def test_plan_reads_a_recipe_with_tools_and_an_environment_reward(recipe_dir, tool_model):
    from trl_ext.recipe_loader.plan import make_plan

    plan = make_plan(str(write(recipe_dir, tool_model)))
    assert "no reward model (an environment's get_reward): none budgeted" in plan.notes
