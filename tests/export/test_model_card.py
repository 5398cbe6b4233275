"""`trl-ext export` writes a model card (README.md: base model, trainer, data, key settings, last metrics, versions,
how to load) and `--push-to-hub REPO` uploads the export with huggingface_hub, here to a local stand-in for the Hub
API (tests/hub_stand_in.py) that records what it receives."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hub_stand_in import HubStandIn

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exported(ppo_shared_run, tmp_path_factory):
    from trl_ext.export import export_run

    out = tmp_path_factory.mktemp("card") / "export"
    export_run(ppo_shared_run[0], out)
    return ppo_shared_run[0], out


def test_the_card_says_what_was_trained_on_what_and_how_it_ended(exported):
    import transformers
    import trl

    import trl_ext

    run, out = exported
    card = (out / "README.md").read_text()
    recipe = json.loads((out / "trl_ext_export.json").read_text())["recipe"]
    assert card.startswith("---\nlibrary_name: transformers\n") and "- ppo\n- lora\n" in card
    assert f"PPO of `{recipe['model_name_or_path']}` on `{recipe['dataset_name']}`" in card
    assert "`policy/`, `reward/`, `value/`" in card
    for key in ("learning_rate", "total_episodes", "kl_coef", "shared_base", "lora_r"):
        assert f"| `{key}` | `{json.dumps(recipe[key]) if not isinstance(recipe[key], str) else recipe[key]}` |" in card
    history = json.loads((run / "trainer_state.json").read_text())["log_history"]
    last = [h["objective/scores"] for h in history if "objective/scores" in h][-1]
    assert f"| `objective/scores` | {last:.4g} |" in card
    assert f"trl-ext {trl_ext.__version__}, trl {trl.__version__}, transformers {transformers.__version__}" in card


def test_the_cards_loading_code_loads_the_exported_models(exported):
    """The card's own snippet, run as written (no peft, no trl-ext needed): each model loads and the policy
    generates."""
    _, out = exported
    (code,) = re.findall(r"```python\n(.*?)```", (out / "README.md").read_text(), re.S)
    assert f'AutoModelForCausalLM.from_pretrained("{out}", subfolder="policy")' in code
    namespace: dict = {}
    exec(code, namespace)  # noqa: S102 - the card's code, as a user would paste it
    assert type(namespace["policy"]).__name__ == "LlamaForCausalLM" and namespace["value"].config.num_labels == 1
    ids = namespace["tokenizer"]("hello", return_tensors="pt")["input_ids"]
    assert namespace["policy"].generate(ids, max_new_tokens=2, do_sample=False).shape[1] == ids.shape[1] + 2


def test_push_to_hub_uploads_the_export_and_its_card(ppo_shared_run, tiny_env, tmp_path):
    out = tmp_path / "export"
    with HubStandIn() as hub:
        proc = subprocess.run([sys.executable, "-m", "trl_ext", "export", str(ppo_shared_run[0]), str(out),
                               "--roles", "policy", "--push-to-hub", "me/ppo-tiny", "--private"],
                              env=hub.env(tiny_env, tmp_path / "hf_home"), capture_output=True, text=True,
                              cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert hub.created == [{"name": "ppo-tiny", "organization": "me", "visibility": "private"}]
    (uploaded,) = hub.commits["me/ppo-tiny"]
    local = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert uploaded == local  # every file, byte for byte: the models, the tokenizer, the card, the export record
    assert {"README.md", "policy/config.json", "policy/model.safetensors"} <= set(uploaded)
    assert b'from_pretrained("me/ppo-tiny", subfolder="policy")' in uploaded["README.md"]
    assert hub.validated == [{"library_name": "transformers", "tags": ["trl", "trl-ext", "ppo", "lora"]}]
    assert f"pushed to the Hub: {hub.url}/me/ppo-tiny/commit/" in proc.stdout


def test_a_bad_repo_id_stops_before_anything_is_exported(ppo_shared_run, tmp_path, capsys):
    from trl_ext.cli import main

    assert main(["export", str(ppo_shared_run[0]), str(tmp_path / "x"), "--push-to-hub", "a/b/c"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trl-ext: error: --push-to-hub 'a/b/c':") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()
