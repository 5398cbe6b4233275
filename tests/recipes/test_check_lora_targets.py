"""`trl-ext check` matches LoRA `target_modules` against the model built on the meta device (no weights loaded)."""

import pytest
import yaml

from trl_ext.cli import main


@pytest.fixture
def check(tmp_path, monkeypatch, capsys, tiny_models):
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))

    def run(**extra):
        keys = dict(trainer="ppo", model_name_or_path="tiny://policy", reward_model_path="tiny://reward",
                    dataset_name="recipes/demo/data/prompts.jsonl", output_dir=str(tmp_path / "out"),
                    use_cpu=True, report_to="none", use_peft=True, lora_r=4, lora_target_modules=["q_proj", "v_proj"])
        keys.update(extra)
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(keys))
        rc = main(["check", str(path)])
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        return rc, captured.out, err[-1] if err else ""

    return run


def test_targets_that_exist_pass(check, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    assert check()[0] == 0
    assert check(lora_target_modules="all-linear")[0] == 0
    assert check(lora_target_modules=r".*\.mlp\.up_proj")[0] == 0  # a regex over full module names
    assert check(value_use_peft=True, value_lora_target_modules=["score", "k_proj"])[0] == 0


@pytest.mark.parametrize("extra, key, needle", [
    (dict(lora_target_modules=["q_proj", "query_key_value"]), "lora_target_modules",
     "['query_key_value'] not found in the model; its Linear modules are: down_proj, gate_proj, k_proj, lm_head, "
     "o_proj, q_proj, up_proj, v_proj ('tiny://policy', built without weights)"),
    (dict(lora_target_modules=r".*\.attention\.dense"), "lora_target_modules", "matches no module of the model"),
    (dict(value_use_peft=True, value_lora_target_modules=["c_attn"]), "value_lora_target_modules",
     "['c_attn'] not found in the model; its Linear modules are: down_proj, gate_proj, k_proj, o_proj, q_proj, "
     "score, up_proj, v_proj ('tiny://reward', built without weights)"),
])
def test_a_target_that_matches_nothing_is_one_line_exit_2(check, monkeypatch, extra, key, needle):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    rc, _, err = check(**extra)
    assert rc == 2 and err.startswith(f"trl-ext: error: recipe: key '{key}': ") and needle in err, err


def test_a_model_not_on_this_machine_is_noted(check, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parents[2])
    rc, out, _ = check(model_name_or_path="someone/not-downloaded-model-xyz")
    assert rc == 0
    assert "# note: lora_target_modules not matched against 'someone/not-downloaded-model-xyz'" in out
