"""Tiny, offline, deterministic models for tests, demos and benchmarks. How it works: docs/internals.md#testing."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)

SPECIAL_TOKENS = ["<pad>", "</s>", "<s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]

# A small corpus: enough for a few hundred BPE merges, with the words the demo data uses.
_WORDS = (
    "the a an and or but if then so very good bad great terrible happy sad kind rude helpful useless "
    "cat dog bird fish tree sun moon star sky sea river mountain city road house garden book story "
    "i you he she it we they am is are was were be been have has had do does did will would can could "
    "please thanks thank hello hi yes no maybe sure sorry okay fine nice lovely awful wonderful bright "
    "what why how when where who which tell me about write say give answer question help explain "
    "one two three four five six seven eight nine ten red blue green yellow black white small big "
    "love like hate enjoy want need make made go went come came see saw know knew think thought day "
    "night morning evening today tomorrow yesterday food water music song poem joke fact idea world"
).split()


def tiny_corpus(n_lines: int = 400, seed: int = 0) -> list[str]:
    """Deterministic pseudo-sentences over the built-in vocabulary."""
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 12))) for _ in range(n_lines)]


def build_tokenizer(vocab_size: int = 512, seed: int = 0):
    """Train a tiny BPE tokenizer on :func:`tiny_corpus` and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tok.train_from_iterator(tiny_corpus(seed=seed) + [" ".join(_WORDS)], trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="</s>",
        bos_token="<s>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


#: The special tokens of :func:`word_level_tokenizer`, ids 0 to 3.
WORD_SPECIAL_TOKENS = ("<pad>", "</s>", "<s>", "<unk>")


def word_level_tokenizer(words, model_max_length: int):
    """A word-level tokenizer, one token per word of ``words`` (ids in their order after :data:`WORD_SPECIAL_TOKENS`),
    with pad/eos/bos/unk and :func:`build_tokenizer`'s Metaspace pre-tokenizer and decoder, so decoded text keeps its
    spaces and ``tokenizer(prompt + completion)`` equals ``tokenizer(prompt) + tokenizer(completion)``: the tokenizer
    of the synthetic tasks (``recipes/gold``, ``recipes/verifiable``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(WORD_SPECIAL_TOKENS)}
    for word in words:
        vocab["\u2581" + word] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                   unk_token="<unk>", model_max_length=model_max_length)


def tiny_llama_config(tokenizer, *, hidden_size: int = 64, num_layers: int = 2, **overrides):
    """A ~100k-parameter Llama config matched to ``tokenizer``."""
    from transformers import LlamaConfig

    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        tie_word_embeddings=False,
    )
    kwargs.update(overrides)
    return LlamaConfig(**kwargs)


def build_causal_lm(tokenizer, seed: int = 0, **config_overrides):
    """A randomly initialised tiny ``LlamaForCausalLM`` (deterministic by ``seed``)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(tiny_llama_config(tokenizer, **config_overrides))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def build_scalar_model(tokenizer, seed: int = 1, **config_overrides):
    """A randomly initialised tiny ``LlamaForSequenceClassification`` with exactly one output."""
    import torch
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(seed)
    # num_labels=1 and no id2label/label2id: otherwise transformers warns about a 2-label map.
    return LlamaForSequenceClassification(tiny_llama_config(tokenizer, num_labels=1, **config_overrides))


@dataclass(frozen=True)
class TinyModels:
    """Paths written by :func:`build_tiny_models`."""

    root: Path
    tokenizer: Path
    policy: Path
    reward: Path


def build_tiny_models(root: str | os.PathLike, seed: int = 0, **config_overrides) -> TinyModels:
    """Write a tokenizer, a tiny causal LM and a tiny scalar-headed model under ``root``.

    Idempotent: if all three directories already exist they are reused.
    """
    root = Path(root)
    paths = TinyModels(root, root / "tokenizer", root / "policy", root / "reward")
    done = [paths.tokenizer / "tokenizer_config.json", paths.policy / "config.json", paths.reward / "config.json"]
    if all(f.exists() for f in done):
        return paths
    tokenizer = build_tokenizer(seed=seed)
    tokenizer.save_pretrained(paths.tokenizer)
    policy = build_causal_lm(tokenizer, seed=seed, **config_overrides)
    policy.save_pretrained(paths.policy)
    tokenizer.save_pretrained(paths.policy)
    reward = build_scalar_model(tokenizer, seed=seed + 1, **config_overrides)
    reward.save_pretrained(paths.reward)
    tokenizer.save_pretrained(paths.reward)
    return paths


def save_scalar_adapter(base_path: str | os.PathLike, out_dir: str | os.PathLike, *, seed: int = 2, r: int = 4,
                        target_modules=("q_proj", "v_proj")) -> Path:
    """Save a LoRA reward/value adapter with random (non-zero) weights and score head on the causal LM at
    ``base_path``, in the format a reward recipe with ``use_peft`` writes (``task_type: SEQ_CLS``, score head in
    the adapter file). For tests and benchmarks of reward/value models that share the policy's base."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(base_path, num_labels=1)
    config = LoraConfig(r=r, lora_alpha=2 * r, target_modules=list(target_modules), task_type="SEQ_CLS",
                        init_lora_weights=False)
    model = get_peft_model(model, config)
    with torch.no_grad():
        model.base_model.model.score.modules_to_save["default"].weight.normal_(std=0.5)
    model.save_pretrained(out_dir)
    return Path(out_dir)


def build_byte_level_tokenizer(vocab_size: int = 512, seed: int = 0):
    """A tiny byte-level BPE tokenizer trained on :func:`tiny_corpus`, with :data:`CHAT_TEMPLATE`: what the tiny
    stand-ins of real checkpoints (:func:`build_tiny_like`) use, since transformers reads the tokenizer of a Qwen2 or
    GPT-NeoX checkpoint as its own byte-level class (``Qwen2Tokenizer``, rebuilt from the vocabulary and merges)
    whatever class the files name: a byte-level vocabulary reads back as it was saved."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(tiny_corpus(seed=seed) + [" ".join(_WORDS)], trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", bos_token="<s>",
                                      unk_token="<unk>", additional_special_tokens=SPECIAL_TOKENS[4:])
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


#: The sizes :func:`build_tiny_like` writes over a real config (the keys a config has; others stay as published).
TINY_SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "max_window_layers": 2, "head_dim": 16}


def build_tiny_like(config_json: str | os.PathLike, out_dir: str | os.PathLike, *, scalar: bool = False,
                    seed: int = 0) -> Path:
    """A random tiny model of a real checkpoint's family, for running its recipe offline: the checkpoint's published
    ``config.json`` with the sizes of :data:`TINY_SIZES` (the vocabulary: :func:`build_byte_level_tokenizer`'s, and
    its special token ids), every other key as published; saved in bfloat16 with the tokenizer. ``scalar``: a
    one-output ``*ForSequenceClassification`` (a stand-in for a full reward checkpoint). Idempotent."""
    import json

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    tokenizer = build_byte_level_tokenizer(seed=seed)
    config = json.loads(Path(config_json).read_text())
    config.update({key: value for key, value in TINY_SIZES.items() if key in config})
    config.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                  pad_token_id=tokenizer.pad_token_id)
    if scalar:
        config.update(num_labels=1, architectures=[a.replace("ForCausalLM", "ForSequenceClassification")
                                                   for a in config.get("architectures", [])])
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)
    model_class = AutoModelForSequenceClassification if scalar else AutoModelForCausalLM
    model = model_class.from_config(AutoConfig.from_pretrained(out)).to(torch.bfloat16)
    if not scalar:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
