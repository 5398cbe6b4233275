"""The real-model recipes (every shipped recipe whose model is a Hub id): the first comment line names the GPU; a PPO
recipe's plan figure in its comment is what `trl-ext plan` gives for that GPU with the checkpoint's published
config.json (tests/data/configs), and it fits; `trl-ext check` passes and two updates run with each model replaced
by a tiny random model of the same family (the published config.json with small sizes: trl_ext.testing's
build_tiny_like) and each Hub dataset by a few local rows of its format. A PPO recipe trains against the output of
the reward recipe whose output_dir it names, itself run the same way. `trl-ext plan` of a Hub id reads its config.json
from the Hub (here a local stand-in) and, offline, asks for a path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trl_ext.cli import main
from trl_ext.models.paths import looks_local
from trl_ext.recipe_loader.plan import GIB, make_plan

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "data" / "configs"


def read(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


REAL = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").glob("*/*.yaml")
              if read(p).get("trainer") and not looks_local(str(read(p).get("model_name_or_path", "x/x"))))
PPO = [r for r in REAL if read(ROOT / r)["trainer"] == "ppo"]
PLAN_LINE = re.compile(r"^# trl-ext plan (\S+) \((\d+)-token prompts\): peak ([\d.]+) GiB of (\d+) \(fits\)", re.M)


def config_of(model_id: str) -> Path:
    """The published config.json of a Hub checkpoint (cleanrl's Pythia checkpoints: their architecture's)."""
    return CONFIGS / model_id.split("/")[-1].replace("__reward__", "__sft__") / "config.json"


def test_the_real_model_recipes_are_all_here():
    assert {"recipes/qwen2.5-0.5b/ppo.yaml", "recipes/qwen2.5-0.5b/ppo_shared.yaml", "recipes/qwen2.5-0.5b/gae_gsm8k.yaml",
            "recipes/qwen2.5-0.5b/grpo_gsm8k.yaml", "recipes/qwen2.5-7b/reward.yaml",
            "recipes/qwen2.5-7b/ppo_shared.yaml", "recipes/pythia-1b-tldr/ppo.yaml"} <= set(REAL)
    assert not any(r.startswith(("recipes/demo/", "recipes/gold/", "recipes/verifiable/")) for r in REAL)


@pytest.mark.parametrize("recipe", REAL)
def test_first_line_names_the_gpu(recipe):
    first = (ROOT / recipe).read_text().splitlines()[0]
    assert re.match(r"# GPU: (one|\d+ x) \d+ GB GPU", first), first


@pytest.mark.parametrize("recipe", PPO)
def test_the_plan_figure_in_the_comment_is_the_planners_and_fits(recipe):
    text = (ROOT / recipe).read_text()
    (named, prompt, peak, gpu), = PLAN_LINE.findall(text)
    assert named == recipe and f"{gpu} GB GPU" in text.splitlines()[0]
    model = read(ROOT / recipe)["model_name_or_path"]
    plan = make_plan(recipe, ["--model_name_or_path", str(config_of(model))], gpu_memory=float(gpu),
                     prompt_length=int(prompt))
    assert f"{plan.budget.peak / GIB:.2f}" == peak and plan.fits


# ---------------------------------------------------------------------------------------------------------------
# Two updates of each recipe at tiny size


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

    def model(self, model_id: str, scalar: bool = False) -> str:
        from trl_ext.testing import build_tiny_like

        return str(build_tiny_like(config_of(model_id), self.root / "models" / model_id.replace("/", "--"),
                                   scalar=scalar))

    def data(self, name: str) -> str:
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
            assert main(["check", recipe, *argv]) == 0, recipe
            assert main(["train", recipe, *argv]) == 0, recipe
            self.done[recipe] = out
        return self.done[recipe]


@pytest.fixture(scope="module")
def world(tiny_env, tmp_path_factory):
    return TinyWorld(tmp_path_factory.mktemp("real_recipes"))


@pytest.mark.parametrize("recipe", REAL)
def test_check_and_two_updates_at_tiny_size(world, recipe, capsys):
    out = world.run(recipe)
    capsys.readouterr()
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    if read(ROOT / recipe)["trainer"] == "ppo":
        scores = [h["objective/scores"] for h in history if "objective/scores" in h]
        assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
    else:
        assert max(h.get("step", 0) for h in history) == 2
    recipe_keys = read(out / "trl_ext_recipe.yaml")
    written = read(ROOT / recipe)
    for key in ("load_in_4bit", "use_peft", "shared_base", "advantage_estimator", "upcast_non_quantized",
                "local_rollout_forward_batch_size"):  # the recipe's own settings ran, only names and sizes changed
        assert recipe_keys.get(key) == written.get(key), (recipe, key)


def test_plan_reads_a_hub_ids_config_json(tiny_env, tmp_path):
    """Reachable (a local stand-in for the Hub serving the published config.json): planned from it; the same figure
    as from the file."""
    sys.path.insert(0, str(ROOT / "tests"))
    from hub_stand_in import HubStandIn

    recipe = "recipes/qwen2.5-0.5b/ppo_shared.yaml"
    config = config_of("Qwen/Qwen2.5-0.5B-Instruct")
    with HubStandIn(files={"Qwen/Qwen2.5-0.5B-Instruct": {"config.json": config.read_bytes()}}) as hub:
        proc = subprocess.run([sys.executable, "-m", "trl_ext", "plan", recipe], capture_output=True, text=True,
                              env=hub.env(tiny_env, tmp_path / "hf_home"), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ("GET", "/Qwen/Qwen2.5-0.5B-Instruct/resolve/main/config.json", b"") in hub.requests
    peak = make_plan(recipe, ["--model_name_or_path", str(config)]).budget.peak
    assert f"As written the run fits in 24 GiB (peak {peak / GIB:.2f} GiB" in proc.stdout
    assert "Qwen2.5-0.5B-Instruct (qwen2) (0.49B parameters)" in proc.stdout
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # this process stays offline: `plan` asks for a path (test_plan)
