"""Fixtures of the verifiable task's tests."""

import pytest

from recipe_modules import recipe_module


@pytest.fixture(scope="module")
def verifiable_modules():
    """recipes/verifiable's addition_task, make_data and evaluate modules."""
    return tuple(recipe_module("verifiable", name) for name in ("addition_task", "make_data", "evaluate"))
