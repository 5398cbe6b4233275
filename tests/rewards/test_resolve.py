"""Recipe entries of `reward_funcs` -> callables (trl_ext.rewards.resolve), and the signature check against the
calling contract of TRL's GRPOTrainer."""

import importlib.util

import pytest

from trl_ext.errors import UserInputError
from trl_ext.rewards.resolve import (
    check_requirements, check_reward_func, parse_reward_spec, resolve_reward_funcs, reward_func_name,
)



def one_line_error(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_module_function_dotted_file_and_factory(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def ends_with_answer(completions, answer, **kwargs):\n"
        "    return [1.0 if c.endswith(a) else 0.0 for c, a in zip(completions, answer)]\n"
        "def make_bonus(value):\n"
        "    def bonus(completions, **kwargs):\n"
        "        return [value] * len(completions)\n"
        "    return bonus\n")
    funcs = resolve_reward_funcs(
        ["trl.rewards:think_format_reward", "trl.rewards.think_format_reward", "my_rewards.py:ends_with_answer",
         {"name": "trl.rewards.get_soft_overlong_punishment",
          "kwargs": {"max_completion_len": 10, "soft_punish_cache": 4}},
         {"name": "my_rewards.py:make_bonus", "kwargs": {"value": 0.25}}],
        base_dir=tmp_path)
    from trl.rewards import think_format_reward

    assert funcs[0] is think_format_reward and funcs[1] is think_format_reward
    assert funcs[2](completions=["x 4", "x 5"], answer=["4", "4"]) == [1.0, 0.0]
    # soft overlong punishment: 0 up to 10 - 4 = 6 tokens, then -(len - 6) / 4, -1 beyond 10
    assert funcs[3](completion_ids=[[1] * 6, [1] * 8, [1] * 11]) == [0.0, -0.5, -1.0]
    assert funcs[4](completions=["a", "b", "c"]) == [0.25] * 3
    assert [reward_func_name(f) for f in funcs] == [
        "think_format_reward", "think_format_reward", "ends_with_answer", "soft_overlong_punishment_reward", "bonus"]
    # the same file imported once, under a module name of its own
    again = resolve_reward_funcs(["my_rewards.py:ends_with_answer"], base_dir=tmp_path)[0]
    assert again is funcs[2] and funcs[2].__module__.startswith("trl_ext_file_my_rewards_")


@pytest.mark.parametrize("spec, needle", [
    ("no_such_module_xyz:f", "no module named 'no_such_module_xyz'"),
    ("trl.rewards:think_format_rewrd", "has no function 'think_format_rewrd' (did you mean 'think_format_reward'?)"),
    ("missing.py:f", "file '"),
    ("rewards.py:nope", "file 'rewards.py' has no function 'nope'"),
    ("broken.py:f", "importing 'broken.py' failed: SyntaxError"),
    ("rewards.py", "name the function in the file"),
    ("justaname", "expected 'module:function' or 'module.function'"),
    ("", "empty"),
    ({"name": "trl.rewards.get_soft_overlong_punishment", "kwargs": {"max_len": 3}}, "do not fit the factory"),
    ({"name": "rewards.py:value", "kwargs": {}}, "'value' in file 'rewards.py' is not callable"),
    ({"nme": "trl.rewards.think_format_reward"}, "a mapping needs 'name'"),
    ({"name": "trl.rewards.think_format_reward", "kwarg": {}}, "unknown field 'kwarg'"),
    ({"url": "localhost:8000/reward"}, "'url' must be an http(s)://host[:port]/path address"),
    ({"url": "http://localhost:8000/r", "timeout_s": 0}, "'timeout_s' must be a number of seconds > 0"),
    ({"url": "http://localhost:8000/r", "retries": -1}, "'retries' must be an integer >= 0"),
    ({"url": "http://localhost:8000/r", "retry": 1}, "unknown field 'retry'"),
    (3, "give 'module:function'"),
])
def test_each_bad_entry_is_one_line_naming_it(tmp_path, spec, needle):
    (tmp_path / "rewards.py").write_text("value = 3\n")
    (tmp_path / "broken.py").write_text("def f(:\n")
    with pytest.raises(UserInputError) as excinfo:
        resolve_reward_funcs(["trl.rewards:think_format_reward", spec], base_dir=tmp_path)
    message = one_line_error(excinfo)
    assert message.startswith("recipe: key 'reward_funcs' entry 2 "), message
    assert needle in message, message


def test_remote_entry_parses_with_defaults_and_settings():
    spec = parse_reward_spec({"url": "http://127.0.0.1:8123/score", "timeout_s": 5, "label_column": "answer"}, 0)
    assert (spec.kind, spec.target) == ("remote", "http://127.0.0.1:8123/score")
    assert spec.kwargs == {"timeout_s": 5.0, "retries": 2, "label_column": "answer", "name": None}
    assert parse_reward_spec("http://h:1/p", 0).kwargs["timeout_s"] == 30.0


def test_remote_entry_builds_a_remote_reward():
    func = resolve_reward_funcs([{"url": "http://127.0.0.1:8123/score", "retries": 0, "name": "judge",
                                  "label_column": "solution", "timeout_s": 5}])[0]
    assert type(func).__name__ == "RemoteReward" and reward_func_name(func) == "judge"
    assert (func.url, func.retries, func.label_column, func.timeout_s) == ("http://127.0.0.1:8123/score", 0,
                                                                            "solution", 5.0)
    check_reward_func(func, "entry", ["prompt", "solution"])
    with pytest.raises(UserInputError, match="^entry: label_column 'solution' is not a column of the dataset "
                                             r"\(the dataset's columns: prompt, answer\)$"):
        check_reward_func(func, "entry", ["prompt", "answer"])
    check_reward_func(resolve_reward_funcs(["http://127.0.0.1:8123/score"])[0], "entry", ["prompt"])  # no labels


def test_command_line_entries_are_named_by_their_option():
    with pytest.raises(UserInputError, match=r"^--reward-funcs entry 1 'nope:f': no module named 'nope'$"):
        resolve_reward_funcs(["nope:f"], key="--reward-funcs")


# ---- the signature check ------------------------------------------------------------------------------------


def needs_solution(completions, solution, **kwargs):
    return [0.0] * len(completions)


def no_kwargs(prompts, completions, completion_ids, trainer_state, log_extra, log_metric):
    return [0.0] * len(completions)


def takes_prompt(prompt, completions, **kwargs):
    return [0.0] * len(completions)


def positional_only(completions, /, **kwargs):
    return [0.0] * len(completions)


def test_signature_fits_the_contract():
    columns = ["prompt", "solution"]
    check_reward_func(needs_solution, "entry", columns)
    check_reward_func(no_kwargs, "entry", ["prompt"])  # takes exactly what is passed
    from trl.rewards import accuracy_reward, think_format_reward

    check_reward_func(think_format_reward, "entry", columns)
    check_reward_func(accuracy_reward, "entry", columns)


@pytest.mark.parametrize("func, columns, needle", [
    (needs_solution, ["prompt", "answer"], "function 'needs_solution' needs 'solution', which is neither an argument "
     "the trainer passes nor a column of the dataset (the dataset's columns: prompt, answer)"),
    (no_kwargs, ["prompt", "answer"], "takes no **kwargs but would receive 'answer'; add **kwargs"),
    (takes_prompt, ["prompt"], "needs 'prompt', which is neither an argument the trainer passes nor a column of the "
     "dataset ('prompt' arrives as 'prompts')"),
    (positional_only, ["prompt"], "parameter 'completions' is positional-only"),
])
def test_signature_problems_name_the_function_parameter_and_columns(func, columns, needle):
    with pytest.raises(UserInputError) as excinfo:
        check_reward_func(func, "recipe: key 'reward_funcs' entry 1 'f.py:f'", columns)
    message = one_line_error(excinfo)
    assert message.startswith("recipe: key 'reward_funcs' entry 1 'f.py:f': ") and needle in message, message


def test_unknown_columns_check_only_the_trainer_keywords():
    check_reward_func(needs_solution, "entry", None)  # perhaps a column of a hub dataset
    with pytest.raises(UserInputError, match="takes no \\*\\*kwargs but would receive 'trainer_state'"):
        check_reward_func(lambda completions, prompts, completion_ids: [], "entry", None)


def test_accuracy_reward_runs_with_math_verify():
    from trl.rewards import accuracy_reward

    check_requirements(accuracy_reward, "entry")  # math_verify: the `dev` extra
    assert accuracy_reward([[{"content": r"\boxed{4}"}], [{"content": r"\boxed{5}"}]], ["4", "4"]) == [1.0, 0.0]


def test_accuracy_reward_says_in_one_line_when_it_cannot_run_here(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("math_verify", "latex2sympy2_extended") else real(name, *a))
    with pytest.raises(UserInputError) as excinfo:
        resolve_reward_funcs(["trl.rewards:accuracy_reward"])
    assert one_line_error(excinfo) == (
        "recipe: key 'reward_funcs' entry 1 'trl.rewards:accuracy_reward': cannot run here: it needs the math_verify "
        "and latex2sympy2_extended packages, not installed (pip install \"math-verify[antlr4_13_2]\")")
