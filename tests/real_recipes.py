"""The shipped recipes on real models (their model a Hub id), run offline at tiny size: tiny random models of each
checkpoint's family (its published config.json, tests/data/configs, with small sizes), local rows in the format of
each Hub dataset, and a PPO recipe's reward model the tiny run of the reward recipe whose output_dir it names. Used by
tests/recipes/test_real_model_recipes.py and tests/test_readme.py."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from trl_ext.cli import main
from trl_ext.models.paths import looks_local

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "tests" / "data" / "configs"


def read(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


REAL = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").glob("*/*.yaml")
              if read(p).get("trainer") and not looks_local(str(read(p).get("model_name_or_path", "x/x"))))

def config_of(model_id: str) -> Path:
    """The published config.json of a Hub checkpoint (cleanrl's Pythia checkpoints: their architecture's)."""
    return CONFIGS / model_id.split("/")[-1].replace("__reward__", "__sft__") / "config.json"


def _sentence(i: int) -> str:
    from trl_ext.testing import tiny_corpus

    return tiny_corpus(64)[i % 64]


STAND_INS = {  # Hub dataset -> (splits, one row of its format)
    "trl-lib/ultrafeedback_binarized": (("train", "test"), lambda i: {
        "chosen": [{"role": "user", "content": _sentence(i)}, {"role": "assistant", "content": _sentence(i + 1)}],
        "rejected": [{"role": "user", "content": _sentence(i)}, {"role": "assistant", "content": _sentence(i + 2)}]}),
    "trl-lib/ultrafeedback-prompt": (("train", "test"), lambda i: {
        "prompt": [{"role": "user", "content": _sentence(i)}]}),
    "trl-lib/Capybara": (("train", "test"), lambda i: {
        "messages": [{"role": "user", "content": _sentence(i)}, {"role": "assistant", "content": _sentence(i + 1)}]}),
    "trl-internal-testing/tldr-preference-sft-trl-style": (("train", "validation"), lambda i: {
        "prompt": f"SUBREDDIT: r/tifu\nPOST: {_sentence(i)}\nTL;DR:"}),
}


def gsm8k_rows(i: int) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_gsm8k_real", ROOT / "recipes" / "qwen2.5-0.5b" / "make_gsm8k.py")
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    return make.to_row({"question": f"{_sentence(i)}: what is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"})


class TinyWorld:
    """Tiny stand-ins, built once: models by Hub id, datasets by name, reward runs by their recipe's output_dir."""

    def __init__(self, root: Path):
        self.root = root
        self.outputs = {read(ROOT / r).get("output_dir"): r for r in REAL}
        self.done: dict[str, Path] = {}
        self.datasets: dict[str, str] = {}  # dataset name -> a folder made otherwise (a data script's output)

    def model(self, model_id: str, scalar: bool = False) -> str:
        from trl_ext.testing import build_tiny_like

        return str(build_tiny_like(config_of(model_id), self.root / "models" / model_id.replace("/", "--"),
                                   scalar=scalar))

    def data(self, name: str) -> str:
        if name in self.datasets:
            return self.datasets[name]
        folder = self.root / "data" / name.replace("/", "--")
        if not folder.is_dir():
            folder.mkdir(parents=True)
            splits, row = STAND_INS.get(name, (("train", "test"), gsm8k_rows))
            for split in splits:
                (folder / f"{split}.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in range(8)))
        return str(folder)

    def path(self, value: str, scalar: bool) -> str:
        """A model path of a recipe: another recipe's output (run it first) or a Hub checkpoint's tiny stand-in."""
        if value in self.outputs:
            return str(self.run(self.outputs[value]))
        return self.model(value, scalar=scalar)

    def overrides(self, recipe: str, out: Path) -> list[str]:
        keys = read(ROOT / recipe)
        argv = ["--output_dir", str(out), "--use_cpu", "true", "--bf16", "false", "--report_to", "none",
                "--save_strategy", "no", "--model_name_or_path", self.model(keys["model_name_or_path"]),
                "--dataset_name", self.data(keys["dataset_name"])]
        for key in ("reward_model_path", "value_model_path"):
            if keys.get(key):
                argv += [f"--{key}", self.path(keys[key], scalar=True)]
        if keys["trainer"] == "ppo":  # two updates of the smallest batch the recipe's groups allow
            batch = max(2, keys.get("num_samples_per_prompt", 1))
            argv += ["--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", "1",
                     "--total_episodes", str(2 * batch), "--response_length", "4", "--num_sample_generations", "0"]
        else:
            argv += ["--max_steps", "2", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "1",
                     "--max_length", "64", "--per_device_eval_batch_size", "2"]
        return argv

    def run(self, recipe: str) -> Path:
        """`trl-ext check` then `trl-ext train` of the recipe at tiny size; its output_dir (once per recipe)."""
        if recipe not in self.done:
            out = self.root / "runs" / recipe.replace("/", "--")
            argv = self.overrides(recipe, out)
            assert main(["check", str(ROOT / recipe), *argv]) == 0, recipe
            assert main(["train", str(ROOT / recipe), *argv]) == 0, recipe
            self.done[recipe] = out
        return self.done[recipe]
