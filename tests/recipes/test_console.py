"""What a `trl-ext train` run shows on the console and says at its end (what a newcomer sees first).

One short PPO run of the demo recipe through the CLI in a subprocess (2 updates, one PPO epoch: a single ratio per
update, `log_completions` on with its default console count) is read by several tests: the summary's paths, no
DeepSpeed import, no third-party warning on the console, `val/ratio_var` 0 for one value, the completions' console
lines. The warning filters themselves are checked in process: each hides its own message from its own module only.
"""

import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "recipes" / "demo"
RUN = """
import sys
from trl_ext.cli import main
rc = main(sys.argv[1:])
print("deepspeed imported:", "deepspeed" in sys.modules)
sys.exit(rc)
"""


@pytest.fixture(scope="module")
def ppo_cli_run(tiny_models, tmp_path_factory):
    out = tmp_path_factory.mktemp("console") / "ppo"
    env = {**__import__("os").environ, "TRL_EXT_TINY_DIR": str(tiny_models.root), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", RUN, "train", str(DEMO / "ppo.yaml"), "--output_dir", str(out),
         "--reward_model_path", "tiny://reward", "--total_episodes", "16", "--num_ppo_epochs", "1",
         "--log_completions", "true"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout, proc.stderr


def test_summary_names_paths_that_exist_and_the_next_commands(ppo_cli_run):
    out, stdout, _ = ppo_cli_run
    summary = stdout[stdout.index("trl-ext: ppo run done in"):].splitlines()
    paths = [Path(m.group(1)) for m in map(re.compile(r"  [a-z ()]+:\s+(/\S+)$").match, summary) if m]
    assert [p.name for p in paths] == ["ppo", "trl_ext_recipe.yaml", "trainer_state.json", "completions.jsonl"]
    assert all(p.exists() for p in paths) and paths[0] == out
    scores = [e["objective/scores"] for e in json.loads((out / "trainer_state.json").read_text())["log_history"]
              if "objective/scores" in e]
    assert len(scores) == 2
    head = next(line for line in summary if line.startswith("  objective/scores:"))
    assert head.startswith(f"  objective/scores: {scores[0]:.4g} (first of 2 logged) -> {scores[1]:.4g} (last)")
    commands = [line for line in summary[summary.index("next:") + 1:] if line.startswith("  trl-ext ")]
    assert [c.split()[:3] for c in commands] == [["trl-ext", "export", str(out)], ["trl-ext", "sample", str(out)],
                                                 ["trl-ext", "plot", str(out)]]
    assert "--prompts recipes/demo/data/prompts.jsonl" in commands[1]


def test_ppo_metric_names_are_explained_before_they_are_printed(ppo_cli_run):
    _, stdout, _ = ppo_cli_run
    legend = next(i for i, line in enumerate(stdout.splitlines()) if line.startswith("trl-ext: one line of metrics"))
    first = next(i for i, line in enumerate(stdout.splitlines()) if line.startswith("{'eps'"))
    assert legend < first and "eps: episodes (responses) per second" in stdout.splitlines()[legend]
    assert (ROOT / "docs" / "metrics.md").read_text().count("| `eps` |") == 1


def test_plain_cpu_run_imports_no_deepspeed_and_shows_no_library_warning(ppo_cli_run):
    _, stdout, stderr = ppo_cli_run
    assert "deepspeed imported: False" in stdout
    assert "Setting accelerator to CPU" not in stdout + stderr
    assert "Warning" not in stderr, [line for line in stderr.splitlines() if "Warning" in line]
    assert "degrees of freedom" not in stderr


def test_ratio_var_of_one_value_is_zero(ppo_cli_run):
    out, _, _ = ppo_cli_run
    logs = [e for e in json.loads((out / "trainer_state.json").read_text())["log_history"] if "val/ratio" in e]
    assert len(logs) == 2 and [e["val/ratio_var"] for e in logs] == [0.0, 0.0]


def test_log_completions_prints_a_few_and_writes_all(ppo_cli_run):
    from trl_ext import PPOConfig

    out, stdout, _ = ppo_cli_run
    shown = PPOConfig.__dataclass_fields__["num_completions_to_print"].default
    assert shown == 4
    lines = [line for line in stdout.splitlines() if re.match(r"\[step \d+\] ", line)]
    assert [line.split("]")[0] for line in lines] == ["[step 1"] * shown + ["[step 2"] * shown
    rows = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1] * 8 + [2] * 8  # every completion of both updates
    for line, row in zip(lines, rows[:shown]):  # the update's first rows, as written to the file
        assert line.startswith(f"[step 1] {row['prompt']!r} -> {row['completion']!r} | score=")


def _shown(module: str, message: str, category=FutureWarning, verbose: bool = False) -> bool:
    from trl_ext.runtime.quiet_console import quiet_console

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_console(verbose=verbose)
        warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)
    return len(caught) == 1


def test_warning_filters_match_message_and_module_only():
    message = "`is_gradient_checkpointing` is deprecated and will be removed in v6."
    assert not _shown("transformers.modeling_utils", message)
    assert _shown("transformers.modeling_utils", message, verbose=True)  # --verbose shows it
    assert _shown("mypackage.models", message)  # the same words from elsewhere: not ours to hide
    assert _shown("transformers.modeling_utils", "`some_other_api` is deprecated")
    saved = "Setting `save_embedding_layers` to `True` as embedding layers found in `target_modules`."
    assert not _shown("peft.utils.save_and_load", saved, UserWarning)
    assert _shown("peft.utils.save_and_load", "Could not identify embedding layer(s)", UserWarning)


@pytest.mark.parametrize("row, prompts", [({"prompt": "1 + 1 =", "completion": " 2"}, "data.jsonl"),
                                          ({"text": "some text"}, "PROMPTS.jsonl")])
def test_sft_summary_suggests_its_data_as_prompts_only_with_a_prompt_column(tmp_path, monkeypatch, row, prompts):
    from trl_ext.recipe_loader import resolve_recipe
    from trl_ext.recipe_loader.summary import next_commands

    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.jsonl").write_text(json.dumps(row) + "\n")
    recipe = resolve_recipe(ROOT / "recipes" / "verifiable" / "sft.yaml", [
        "--model_name_or_path", "tiny://policy", "--dataset_name", "data.jsonl", "--output_dir", "runs/sft"])
    assert next_commands(recipe) == [
        "trl-ext export runs/sft runs/sft-export",
        f"trl-ext sample runs/sft --prompts {prompts} --limit 4 --out runs/sft/samples.jsonl --overwrite",
        "trl-ext plot runs/sft"]


def test_policy_value_wrapper_toggles_checkpointing_without_deprecation_warnings(tiny_models):
    """TRL's generation context turns checkpointing off and on through the wrapper's old-named methods: the policy
    gets transformers' current API, so no FutureWarning (and the state really changes)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from trl_ext.ppo.base.base_trainer import PolicyAndValueWrapper

    policy = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    value = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward, num_labels=1)
    policy.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wrapper = PolicyAndValueWrapper(policy, value)
        assert wrapper.is_gradient_checkpointing and policy.is_activation_checkpointing
        wrapper.gradient_checkpointing_disable()
        assert not wrapper.is_gradient_checkpointing and not policy.is_activation_checkpointing
        wrapper.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        assert wrapper.is_gradient_checkpointing and policy.is_activation_checkpointing
