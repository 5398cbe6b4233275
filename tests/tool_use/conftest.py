"""Fixtures of the tool-use task's tests."""

import pytest

from recipe_modules import recipe_module


@pytest.fixture(scope="module")
def tool_use_data(tmp_path_factory):
    """recipes/tool_use/make_data.py's files with 6 training problems and 3 held out, in a folder of the module's own
    (the tests write their runs beside them)."""
    work = tmp_path_factory.mktemp("tool_use")
    recipe_module("tool_use", "make_data").make_data(work, train=6, heldout=3)
    return work
