"""The model card of an export (``OUT_DIR/README.md``: base model, trainer, data, the key settings, the last metrics,
the versions, how to load each model) and ``trl-ext export --push-to-hub REPO``: the export uploaded with
huggingface_hub. How it works: docs/export-sample-score.md."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserInputError
from ..models.paths import looks_local

__all__ = ["KEY_SETTINGS", "model_card", "push_export"]

KEY_SETTINGS = {
    "all": ("dataset_name", "dtype", "load_in_4bit", "load_in_8bit", "use_peft", "lora_r", "lora_alpha",
            "lora_target_modules", "learning_rate", "num_train_epochs", "max_steps", "per_device_train_batch_size",
            "gradient_accumulation_steps", "seed"),
    "ppo": ("reward_model_path", "reward_funcs", "advantage_estimator", "shared_base", "total_episodes",
            "num_ppo_epochs", "num_mini_batches", "num_samples_per_prompt", "response_length", "temperature",
            "kl_coef", "kl_in", "cliprange", "vf_coef", "value_model_path"),
    "dpo": ("beta", "loss_type", "label_smoothing", "max_length"),
    "reward": ("max_length", "center_rewards_coefficient"),
    "sft": ("max_length", "packing"),
}
"""The recipe keys the card's settings table shows (those the run's resolved recipe sets), per kind of run."""
MAIN_METRICS = {
    "ppo": ("objective/scores", "objective/rlhf_reward", "objective/kl", "objective/entropy", "loss/policy_avg",
            "loss/value_avg", "episode"),
    "reward": ("loss", "accuracy", "margin", "eval_loss", "eval_accuracy"),
    "dpo": ("loss", "rewards/margins", "rewards/accuracies", "eval_loss"),
    "sft": ("loss", "mean_token_accuracy", "eval_loss"),
}
"""The metrics whose last logged values the card gives, per kind of run (docs/metrics.md)."""
TRAINERS = {"ppo": "PPO", "reward": "reward modelling", "dpo": "DPO", "sft": "SFT"}


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from .. import __version__

    parts = [f"trl-ext {__version__}"]
    for name in ("trl", "transformers", "peft", "torch"):
        try:
            parts.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            continue
    return ", ".join(parts)


def _last_metrics(run_path: Path, kind: str) -> dict:
    """The last logged value of each of the kind's main metrics (``trainer_state.json``'s log history)."""
    state = run_path / "trainer_state.json"
    if not state.is_file():
        return {}
    history = json.loads(state.read_text()).get("log_history", [])
    last = {}
    for entry in history:
        for key in MAIN_METRICS.get(kind, ("loss",)) + ("step",):
            if isinstance(entry.get(key), (int, float)):
                last[key] = entry[key]
    return last


def _front_matter(recipe: dict, kind: str) -> list[str]:
    base = str(recipe.get("model_name_or_path") or "")
    data = recipe.get("dataset_name")
    lines = ["---", "library_name: transformers"]
    if base and not looks_local(base) and not base.startswith("tiny://"):
        lines.append(f"base_model: {base}")
    if isinstance(data, str) and data and not looks_local(data):
        lines += ["datasets:", f"- {data}"]
    peft = ["lora"] if recipe.get("use_peft") else []
    peft += ["qlora"] if peft and (recipe.get("load_in_4bit") or recipe.get("load_in_8bit")) else []
    lines += ["tags:"] + [f"- {tag}" for tag in ["trl", "trl-ext", kind, *peft]] + ["---", ""]
    return lines


def _load_lines(roles: dict, where: str) -> list[str]:
    lines = ["```python", "from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, "
             "AutoTokenizer", ""]
    for role, entry in roles.items():
        extra = ", trust_remote_code=True" if entry.get("trust_remote_code") else ""
        lines.append(f'{role} = {entry["class"]}.from_pretrained("{where}", subfolder="{role}"{extra})')
    first = next(iter(roles), "policy")
    lines += [f'tokenizer = AutoTokenizer.from_pretrained("{where}", subfolder="{first}")', "```"]
    return lines


def model_card(info: dict, run_path: Path, where: str) -> str:
    """The README.md of an export: ``info`` is what ``trl_ext_export.json`` says, ``run_path`` the run it came
    from, ``where`` the name to load it by (the Hub repo or the folder)."""
    recipe, kind = info.get("recipe") or {}, info["trainer"]
    base = recipe.get("model_name_or_path", "?")
    data = recipe.get("dataset_name", "?")
    lines = _front_matter(recipe, kind)
    lines += [f"# {where.rstrip('/').split('/')[-1]}", "",
              f"{TRAINERS.get(kind, kind)} of `{base}` on `{data}` with trl-ext (Hugging Face TRL's trainers plus "
              "trl-ext's extensions), exported as standalone full-precision transformers models (adapters merged; "
              f"no peft or trl-ext needed to load them): {', '.join(f'`{r}/`' for r in info['roles'])}.", ""]
    lines += ["## How to load", ""] + _load_lines(info["roles"], where) + [""]
    settings = [(key, recipe[key]) for key in KEY_SETTINGS["all"] + KEY_SETTINGS.get(kind, ()) if key in recipe]
    if settings:
        lines += ["## Training settings", "", "| key | value |", "|---|---|"]
        lines += [f"| `{key}` | `{json.dumps(value) if not isinstance(value, str) else value}` |"
                  for key, value in settings]
        lines += ["", "The whole resolved recipe is in `trl_ext_export.json` (`recipe`): `trl-ext train` runs it "
                  "again.", ""]
    metrics = _last_metrics(run_path, kind)
    if metrics:
        lines += ["## Last logged metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| `{key}` | {value:.4g} |" for key, value in metrics.items()] + [""]
    lines += ["## Versions", "", f"Exported with {_versions()}.", ""]
    return "\n".join(lines)


def push_export(out_dir: str | Path, repo_id: str, *, private: bool = False) -> str:
    """Upload an export folder to the Hub model repo ``repo_id`` (created if needed) with huggingface_hub; returns
    the commit's URL. The endpoint and token are huggingface_hub's own (``HF_ENDPOINT``, ``HF_TOKEN`` or
    ``hf auth login``)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi()
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(folder_path=str(out_dir), repo_id=repo_id,
                                   commit_message=f"trl-ext export ({Path(out_dir).name})")
    except (HfHubHTTPError, OSError, ValueError) as err:
        first = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise UserInputError(f"--push-to-hub {repo_id}: the upload failed: {first}") from None
    return str(commit.commit_url)
