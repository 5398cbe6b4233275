"""``trl-ext export RUN_DIR OUT_DIR``: a run's models as standalone full-precision ``transformers`` models. How it
works: docs/internals-recipes.md#trl-ext-export."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ..errors import UserInputError
from .model_card import model_card, push_export
from .run_dir import DTYPES, EXPORT_FILENAME, ROLES, Run, load_merged, load_run_tokenizer, open_run

__all__ = ["export_run", "ppo_sampling_settings"]


def ppo_sampling_settings(recipe: dict) -> dict:
    """The generation settings of a PPO recipe's rollouts, as :class:`trl_ext.PPOTrainer` samples them:
    ``max_new_tokens=response_length``, ``temperature``, the sampling keys (``top_k``, ``top_p``, ``min_p``,
    ``repetition_penalty``; off by default), sampling; the stop token is the recipe's ``stop_token``/``stop_token_id``
    (none by default: responses run to ``response_length``). The recipe's ``generation_kwargs`` are not carried."""
    import dataclasses

    from ..ppo.config import PPOConfig

    defaults = {f.name: f.default for f in dataclasses.fields(PPOConfig)}

    def get(key):
        return recipe.get(key, defaults[key])

    return {"max_new_tokens": int(get("response_length")), "temperature": float(get("temperature")),
            "top_k": int(get("top_k")), "top_p": float(get("top_p")), "min_p": get("min_p"),
            "repetition_penalty": float(get("repetition_penalty")), "do_sample": True,
            "stop_token": get("stop_token"), "stop_token_id": get("stop_token_id")}


def _check_out_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise UserInputError(f"OUT_DIR {out}: is a file; give a folder")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise UserInputError(f"OUT_DIR {out}: exists and is not empty; give a new folder, or --overwrite to replace it")


def export_run(run_dir: str | os.PathLike, out_dir: str | os.PathLike, *, roles: list[str] | None = None,
               dtype: str | None = None, overwrite: bool = False, base: str | None = None,
               card_name: str | None = None) -> dict:
    """Export the models of a trl-ext run or checkpoint into ``out_dir``; returns what ``trl_ext_export.json`` says.

    Args:
        run_dir: the ``output_dir`` of a ``trl-ext train`` run, or one of its ``checkpoint-N`` folders.
        out_dir: a new (or empty) folder; with ``overwrite`` an existing one is replaced once the export succeeded.
        roles: which of ``policy``, ``reward``, ``value`` to export (default: every role the run has).
        base: the base model of the adapters trained on the policy's base, when it is no longer where the run
            recorded it (see :func:`~trl_ext.export.run_dir.open_run`).
        dtype: ``float32``, ``bfloat16``, ``float16`` or ``auto`` (the base checkpoint's); default: the recipe's
            ``dtype`` (``float32`` unless it says otherwise).
        card_name: the name the model card's loading code uses (a Hub repo it will be pushed to); default the
            folder ``out_dir``.

    Raises:
        UserInputError: not a run, a role it lacks, a missing base, a bad dtype, a non-empty ``out_dir``.
    """
    run = open_run(run_dir, base=base)
    out = Path(os.path.expanduser(str(out_dir)))
    _check_out_dir(out, overwrite)
    dtype = dtype or run.dtype
    if dtype not in DTYPES + ("auto",):
        raise UserInputError(f"--dtype {dtype!r}: use one of {', '.join(DTYPES)} or auto")
    for role in roles or []:
        if role not in ROLES:
            raise UserInputError(f"--roles: unknown role {role!r}; the roles are {', '.join(ROLES)}")
    chosen = [role for role in ROLES if role in (roles or run.roles)]
    sources = {role: run.source(role) for role in chosen}

    staging = out.parent / f".{out.name}.tmp-export"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        info = {"source": str(run.path.resolve()), "trainer": run.trainer, "dtype": dtype,
                "quantized_in_training": run.quantized, "roles": {}, "recipe": run.recipe}
        for role, source in sources.items():
            info["roles"][role] = _export_role(run, role, source, staging / role, dtype)
        (staging / EXPORT_FILENAME).write_text(json.dumps(info, indent=2, default=str) + "\n")
        (staging / "README.md").write_text(model_card(info, run.path, card_name or str(out)))
        if out.exists():  # empty, or --overwrite: replaced only now that the export is complete
            shutil.rmtree(out)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return info


def _export_role(run: Run, role: str, source, target: Path, dtype: str) -> dict:
    tokenizer = load_run_tokenizer(run, source)
    model = load_merged(source, dtype=dtype, tokenizer=tokenizer)
    if role == "policy" and run.trainer == "ppo":
        settings = ppo_sampling_settings(run.recipe)
        config = model.generation_config
        for key in ("max_new_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "do_sample"):
            setattr(config, key, settings[key])
        stop = tokenizer.eos_token_id if settings["stop_token"] == "eos" else settings["stop_token_id"]
        config.eos_token_id = stop
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    head = getattr(model, "score", None)
    return {
        "class": "AutoModelForSequenceClassification" if source.scalar else "AutoModelForCausalLM",
        "architecture": type(model).__mro__[1 if type(model).__name__.startswith("BiasedScore") else 0].__name__,
        "from": str(source.path.resolve()),
        "merged_adapter_on": source.base,
        "score_bias": (float(head.bias.item()) if head is not None and head.bias is not None else None),
        "trust_remote_code": bool(getattr(model.config, "auto_map", None)),
    }


def main(args) -> int:
    """``trl-ext export`` (parsed arguments from :mod:`trl_ext.cli`)."""
    repo = getattr(args, "push_to_hub", None)
    if repo:  # a bad repo id stops before anything is exported
        from huggingface_hub.utils import HFValidationError, validate_repo_id

        try:
            validate_repo_id(repo)
        except HFValidationError as err:
            raise UserInputError(f"--push-to-hub {repo!r}: {str(err).splitlines()[0]}") from None
    info = export_run(args.run, args.out, roles=args.roles, dtype=args.dtype, overwrite=args.overwrite,
                      base=args.base, card_name=repo)
    if info["trainer"] == "ppo" and "reward" not in info["roles"] and not args.roles:
        print(f"note: the run's reward model ({info['recipe'].get('reward_model_path')}) was not found from this "
              "directory; export it from its own run")
    for role, entry in info["roles"].items():
        note = " (load with trust_remote_code=True: centred score head with a bias)" if entry["trust_remote_code"] else ""
        merged = f", adapter merged into {entry['merged_adapter_on']}" if entry["merged_adapter_on"] else ""
        print(f"{Path(args.out) / role}: {entry['class']} ({info['dtype']}{merged}){note}")
    print(f"{Path(args.out) / 'README.md'}: the model card")
    if repo:
        print(f"pushed to the Hub: {push_export(args.out, repo, private=args.private)}")
    return 0
