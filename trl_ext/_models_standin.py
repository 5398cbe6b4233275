"""TEMPORARY STAND-IN for ``trl_ext.models`` (issue 2), used by the recipe pipeline only while that module is
absent on this branch. DELETE THIS FILE when ``trl_ext/models.py`` is merged: :mod:`trl_ext.pipeline` imports
``trl_ext.models`` first and falls back to this file only on ImportError.

Same signatures as issue 2's loaders; minimal behaviour (no bitsandbytes CPU-trap remedy, no head checks).
"""

from __future__ import annotations


def load_tokenizer(model_args, **kwargs):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision, **kwargs)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _model_kwargs(model_args):
    import torch
    from trl import get_quantization_config

    quant = get_quantization_config(model_args)
    dtype = model_args.dtype if model_args.dtype in ("auto", None) else getattr(torch, model_args.dtype)
    kw = dict(revision=model_args.model_revision, dtype=dtype, attn_implementation=model_args.attn_implementation)
    if quant is not None:
        kw.update(quantization_config=quant)
    return kw, quant


def _finish(model, model_args, quant):
    from peft import get_peft_model, prepare_model_for_kbit_training
    from trl import get_peft_config

    if quant is not None:
        model = prepare_model_for_kbit_training(model)
    peft_config = get_peft_config(model_args)
    if peft_config is not None:
        model = get_peft_model(model, peft_config)
    return model


def load_policy(model_args, *, tokenizer=None, **kwargs):
    from transformers import AutoModelForCausalLM

    kw, quant = _model_kwargs(model_args)
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kw, **kwargs)
    return _finish(model, model_args, quant)


def load_scalar_model(model_args, *, reinit_head=False, tokenizer=None, **kwargs):
    from transformers import AutoModelForSequenceClassification

    kw, quant = _model_kwargs(model_args)
    extra = {"ignore_mismatched_sizes": True} if reinit_head else {}
    model = AutoModelForSequenceClassification.from_pretrained(
        model_args.model_name_or_path, num_labels=1, **kw, **extra, **kwargs
    )
    if tokenizer is not None and model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if model_args.use_peft and model_args.lora_modules_to_save is None:
        model_args.lora_modules_to_save = ["score"]
    return _finish(model, model_args, quant)
