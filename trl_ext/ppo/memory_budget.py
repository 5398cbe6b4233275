"""Memory budget of a PPO run: bytes held by each part (weights, adapters, optimizer, rollout, activations), from
the model's shape and the run's settings. Used by ``benchmarks/ppo_memory.py`` (checked there against what is
measured at small scale) and meant for ``trl-ext check`` estimates.

(filled in below)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelShape", "kv_cache_bytes", "rollout_scores_bytes"]


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that its memory depends on."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    name: str = ""

    @classmethod
    def from_config(cls, config, name: str = "") -> "ModelShape":
        """From a transformers config (Llama, Qwen2, Mistral and other models with their field names)."""
        heads = config.num_attention_heads
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            name=name or getattr(config, "model_type", ""),
        )


def kv_cache_bytes(shape: ModelShape, batch: int, seq_len: int, bytes_per_value: int = 2) -> int:
    """Keys and values of every layer for ``batch`` sequences of ``seq_len`` tokens:
    ``2 * layers * batch * kv_heads * head_dim * seq_len * bytes``."""
    return 2 * shape.num_layers * batch * shape.num_kv_heads * shape.head_dim * seq_len * bytes_per_value


def rollout_scores_bytes(batch: int, response_length: int, vocab_size: int) -> int:
    """TRL's stacked rollout scores, ``(batch, response_length, vocab)`` float32: ``B * T * V * 4``."""
    return batch * response_length * vocab_size * 4
