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

import pytest

from real_recipes import REAL, ROOT, TinyWorld, config_of, read
from trl_ext.recipe_loader.plan import GIB, make_plan

PPO = [r for r in REAL if read(ROOT / r)["trainer"] == "ppo"]
PLAN_LINE = re.compile(r"^# trl-ext plan (\S+) \((\d+)-token prompts\): peak ([\d.]+) GiB of (\d+) \(fits\)", re.M)


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
