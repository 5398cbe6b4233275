"""Fixtures of the PPO trainer tests; a module's own fixture of the same name overrides one."""

import pytest

from ppo_helpers import left_tokenizer, prompt_dataset


@pytest.fixture(scope="module")
def tok(tiny_models):
    """The tiny policy's tokenizer, padding on the left."""
    return left_tokenizer(tiny_models)


@pytest.fixture(scope="module")
def data(tok):
    """8 train prompts and 4 evaluation prompts."""
    return prompt_dataset(tok, n=8), prompt_dataset(tok, n=4, seed=5)
