"""Shared fixtures: tiny offline models built once per test session."""

import os

# Nothing in the tests may reach a hub or the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

# Tiny models: one thread is as fast as two and keeps runs reproducible and the machine responsive.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """Paths of a tiny tokenizer, causal LM and scalar-headed model (see `trl_ext.testing`)."""
    from trl_ext.testing import build_tiny_models

    return build_tiny_models(tmp_path_factory.mktemp("tiny_models"))


@pytest.fixture(scope="session")
def tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models.tokenizer)
