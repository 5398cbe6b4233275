"""Loading models from a ``trl.ModelConfig``: tokenizer, policy and scalar-headed (reward/value) models. How it
works: docs/internals.md#models."""

from .loaders import load_policy, load_scalar_model, load_tokenizer, score_head_name, set_pad_token

__all__ = ["load_policy", "load_scalar_model", "load_tokenizer", "score_head_name", "set_pad_token"]
