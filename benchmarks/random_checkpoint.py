"""The random-initialised checkpoints of ``gpu_ppo.py``: a real shape's config, a tokenizer whose vocabulary matches the
model's and that follows the architecture's tokenizer path, the words prompts are made of, and the uneven workload's
EOS bias. No hub, no network: everything is built on the spot."""

from __future__ import annotations

TEMPERATURE = 0.7
"""The sampling temperature of the benchmark's rollouts (the EOS bias is tuned at it)."""
SPECIALS = ["<pad>", "</s>", "<s>", "<unk>"]


def word_tokenizer(vocab_size: int):
    """The Llama path: a word-level tokenizer with exactly ``vocab_size`` tokens (``<pad>``, ``</s>``, ``<s>``,
    ``<unk>``, then ``w4`` ... ), loaded back as saved (``TokenizersBackend``): every id the model can sample
    decodes, and each ``w<id>`` word of a prompt is one token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    vocab.update({f"w{i}": i for i in range(len(SPECIALS), vocab_size)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>")


def letter_words(n: int) -> list[str]:
    """The first ``n`` words over a-z in shortlex order (a ... z, aa, ab, ...): each word's prefix comes first."""
    import string

    words, length = [], 1
    while len(words) < n:
        prev = [""] if length == 1 else [w for w in words if len(w) == length - 1]
        words += [w + c for w in prev for c in string.ascii_lowercase][: n - len(words)]
        length += 1
    return words


def byte_level_tokenizer(vocab_size: int):
    """The Qwen2 path: transformers reads a qwen2 checkpoint's tokenizer as ``Qwen2Tokenizer`` whatever class the
    files name (byte-level BPE rebuilt from the vocabulary and merges, with Qwen2's own pre-tokenizer; a word-level
    vocabulary then tokenizes every prompt to zero tokens). So: a byte-level BPE of exactly ``vocab_size`` tokens,
    the 4 specials, the 256 byte symbols, then `` a``, `` b``, ..., `` aa``, ... each with the merge that builds
    it from its prefix: every id decodes, and each `` <letters>`` word of a prompt is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for symbol in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[symbol] = len(vocab)
    merges = []
    for word in letter_words(vocab_size - len(vocab)):
        merges.append(("\u0120" + word[:-1], word[-1]))  # \u0120: the byte-level symbol of a space
        vocab["\u0120" + word] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>")


def prompt_words(s: dict) -> list[str]:
    """The words of which prompts are made, one token each through the architecture's tokenizer."""
    if s["arch"] == "qwen2":
        return [" " + w for w in letter_words(s["vocab"] - len(SPECIALS) - 256)]
    return [f" w{i}" for i in range(len(SPECIALS), s["vocab"])]


def model_config(s: dict):
    from transformers import LlamaConfig, Qwen2Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[s["arch"]]
    return cls(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["intermediate"],
               num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv"],
               max_position_embeddings=max(2048, s["prompt"] + s["response"]), tie_word_embeddings=s["tie"],
               pad_token_id=0, eos_token_id=1, bos_token_id=2)


def eos_step_probability(logits, eos_id: int, scale: float):
    """Mean probability of sampling EOS at ``TEMPERATURE`` when the LM head's EOS row is multiplied by ``scale``
    (``logits``: float32 ``(positions, vocab)`` of the unscaled head)."""
    import torch

    eos = logits[:, eos_id] * scale / TEMPERATURE
    rest = torch.cat([logits[:, :eos_id], logits[:, eos_id + 1:]], dim=1) / TEMPERATURE
    return torch.sigmoid(eos - torch.logsumexp(rest, dim=1)).mean().item()


def bias_eos(model, s: dict) -> dict:
    """The uneven workload: random weights rarely sample EOS, so every response runs to ``response_length``. Scale
    the LM head's EOS row (no bias parameter in these architectures) so that, on random prompts, the mean per-step
    EOS probability at ``TEMPERATURE`` is ``2 / response_length``: geometric lengths (expected mean about 43 % of the
    limit, 13 % of the responses reaching it), spread as sampled ones are. Bisection over the scale."""
    import torch

    eos_id, n = model.config.eos_token_id, s["prompt"] + s["response"]
    ids = torch.randint(len(SPECIALS), s["vocab"], (4, n), device=model.device)
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state[:, s["prompt"] - 1:]
        logits = model.lm_head(hidden).float().flatten(0, 1)
    target, lo, hi = 2 / s["response"], 0.0, 1000.0
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if eos_step_probability(logits, eos_id, mid) < target else (lo, mid)
    with torch.no_grad():
        model.lm_head.weight[eos_id] *= hi
    q = eos_step_probability(logits, eos_id, hi)
    return {"eos_row_scale": hi, "eos_step_probability": q,
            "expected_mean_response_length": (1 - (1 - q) ** s["response"]) / q}
