"""`module:function` entries (trl_ext/user_code/entries.py), the one loader of reward functions, tools and
environment factories: the forms, the file imported once, a URL refused where Python code is needed, command-line
JSON, absolute paths for the resolved recipe. The reward-specific forms and messages: tests/rewards/test_resolve.py."""

import pytest

from trl_ext.errors import UserInputError
from trl_ext.user_code.entries import absolute_entry, entry_from_text, load_entry, parse_entry

TOOLS_PY = '''
def add(a: int, b: int) -> int:
    return a + b


def make_adder(offset):
    def add_offset(a: int) -> int:
        return a + offset
    return add_offset


class Game:
    def reset(self, **row):
        return None
'''


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "my_tools.py").write_text(TOOLS_PY)
    return tmp_path


def test_each_form_loads_the_callable_it_names(folder):
    add = load_entry(parse_entry("my_tools.py:add", key="tools"), folder, what="a tool")
    assert add(a=2, b=3) == 5 and add.__module__.startswith("trl_ext_file_my_tools_")
    again = load_entry(parse_entry("my_tools.py:add", 1, key="tools"), folder, what="a tool")
    assert again is add  # the file is imported once
    adder = load_entry(parse_entry({"name": "my_tools.py:make_adder", "kwargs": {"offset": 10}}, key="tools"), folder,
                       what="a tool")
    assert adder(a=1) == 11 and adder.__name__ == "add_offset"
    game = load_entry(parse_entry("my_tools.py:Game", key="environment_factory"), folder, what="an environment")
    assert type(game()).__name__ == "Game"
    import json

    assert load_entry(parse_entry("json:dumps", key="tools"), what="a tool") is json.dumps
    assert load_entry(parse_entry("json.dumps", key="tools"), what="a tool") is json.dumps


def test_a_file_imports_its_siblings(tmp_path, monkeypatch):
    """An environment file that imports a module beside it (recipes/tool_use/dice_quiz_env.py imports quiz_env.py)
    loads from a recipe anywhere, as `python file.py` would run it."""
    import sys

    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "rules_of_my_game.py").write_text("ROUNDS = 4\n")
    (tmp_path / "my_env.py").write_text("from rules_of_my_game import ROUNDS\n\n\nclass Env:\n    rounds = ROUNDS\n")
    env = load_entry(parse_entry("my_env.py:Env", key="environment_factory"), tmp_path, what="an environment")
    assert env.rounds == 4


@pytest.mark.parametrize("value, expected", [
    ("http://localhost:1/add", "recipe: key 'tools' entry 1 'http://localhost:1/add': a tool is a Python function "
     "called in the training process; give 'module:function' or 'path/to/file.py:function'"),
    ({"url": "http://localhost:1/add"}, "recipe: key 'tools' entry 1 'http://localhost:1/add': a tool is a Python "
     "function"),
    ({"name": "my_tools.py:add", "kwargs": {"a": 1, "b": 2}}, "recipe: key 'tools' entry 1 'my_tools.py:add': the "
     "factory returned int, not a tool"),
    ("my_tools.py:ad", "recipe: key 'tools' entry 1 'my_tools.py:ad': file 'my_tools.py' has no function 'ad' (did "
     "you mean 'add'?)"),
    (3, "recipe: key 'tools' entry 1 '3': give 'module:function' or 'path/to/file.py:function'"),
])
def test_each_problem_is_one_line_naming_the_entry(folder, value, expected):
    with pytest.raises(UserInputError) as caught:
        load_entry(parse_entry(value, key="tools"), folder, what="a tool")
    assert str(caught.value).startswith(expected) and "\n" not in str(caught.value), str(caught.value)


def test_command_line_text_and_absolute_paths(folder, monkeypatch):
    assert entry_from_text('{"name": "m:f", "kwargs": {"x": 1}}', "--tools") == {"name": "m:f", "kwargs": {"x": 1}}
    assert entry_from_text("my_tools.py:add", "--tools") == "my_tools.py:add"
    with pytest.raises(UserInputError, match=r"^--tools: not valid JSON \("):
        entry_from_text("{name: m:f}", "--tools")
    monkeypatch.chdir(folder.parent)
    path = (folder / "my_tools.py").resolve()
    assert absolute_entry("my_tools.py:add", folder) == f"{path}:add"
    assert absolute_entry({"name": "my_tools.py:make_adder", "kwargs": {"offset": 1}}, folder) == {
        "name": f"{path}:make_adder", "kwargs": {"offset": 1}}
    assert absolute_entry("json:dumps", folder) == "json:dumps" and absolute_entry(3, folder) == 3
