"""`trl-ext export`: every run type gives standalone models that plain transformers loads (no peft, no trl, no
trl_ext importable) and that compute what the trained model computes.

Runs (a few steps each, tiny models): a centred full reward model, a LoRA reward adapter, a 4-bit QLoRA SFT run, an
8-bit LoRA DPO run, a PPO checkpoint with separate models (full policy, full value model started from the centred
reward model) and a shared-base PPO output (policy, reward and value adapters on one base). References: the trainer's
own models in memory where they are full precision; for quantized runs, the saved adapter on its base loaded in
float32 with peft (unmerged), which is what the export promises (the base is reloaded unquantized).
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

FP32 = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def exports(runs, tmp_path_factory):
    """name -> export directory (float32), plus a bfloat16 export of the shared-base run."""
    from trl_ext.export import export_run

    root = tmp_path_factory.mktemp("exports")
    done = {name: root / name for name in runs}
    for name, (path, _) in runs.items():
        export_run(path, done[name])
    export_run(runs["ppo_shared"][0], root / "ppo_shared_bf16", dtype="bfloat16")
    done["ppo_shared_bf16"] = root / "ppo_shared_bf16"
    return done


@pytest.fixture(scope="module")
def batch(tokenizer):
    texts = ["tell me about the cat happy good", "hello", "a very kind dog went to the sea today"]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc["input_ids"], enc["attention_mask"]


@pytest.fixture(scope="module")
def plain_outputs(exports, batch, tmp_path_factory):
    """Every exported model's outputs on `batch`, computed in a process where peft, trl and trl_ext cannot be
    imported and trl-ext is not on the path."""
    root = tmp_path_factory.mktemp("plain")
    models = {}
    for name, path in exports.items():
        info = json.loads((path / "trl_ext_export.json").read_text())
        for role, entry in info["roles"].items():
            models[f"{name}/{role}"] = {"dir": str(path / role), "scalar": role != "policy",
                                        "trust_remote_code": entry["trust_remote_code"]}
    spec = {"models": models, "input_ids": batch[0].tolist(), "attention_mask": batch[1].tolist()}
    (root / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(Path(__file__).parent / "plain_load.py"), str(root / "spec.json"),
                           str(root / "out.json")], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((root / "out.json").read_text())


def _causal_logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch[0], attention_mask=batch[1]).logits.float()


def _scores(model, batch):
    with torch.no_grad():
        return model(input_ids=batch[0], attention_mask=batch[1]).logits.float()


def _masked(logits, batch):
    return logits[batch[1].bool()]  # compare real tokens only (padding positions are not defined)


def _unwrapped(trainer):
    """The trainer's model with accelerate's mixed-precision forward wrapper removed: TRL's configs default to
    bf16, which on CPU makes accelerate run the prepared model's forward under bf16 autocast."""
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(trainer.model, keep_fp32_wrapper=False).eval()


def _plain(plain_outputs, key):
    return torch.tensor(plain_outputs[key]["logits"])


def test_exports_hold_no_adapter_and_name_their_roles(exports, runs):
    expected = {"reward_centred": {"reward"}, "reward_lora": {"reward"}, "sft_4bit": {"policy"},
                "dpo_8bit": {"policy"}, "ppo_checkpoint": {"policy", "value", "reward"},
                "ppo_lora_checkpoint": {"policy", "value", "reward"},
                "ppo_shared": {"policy", "value", "reward"}}
    for name, roles in expected.items():
        info = json.loads((exports[name] / "trl_ext_export.json").read_text())
        assert set(info["roles"]) == roles, name
        for role in roles:
            files = {p.name for p in (exports[name] / role).iterdir()}
            assert "adapter_config.json" not in files and "adapter_model.safetensors" not in files
            assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= files
            config = json.loads((exports[name] / role / "config.json").read_text())
            assert config["architectures"][0].endswith("ForSequenceClassification" if role != "policy"
                                                        else "ForCausalLM")
            if role != "policy":
                assert config["num_labels"] == 1 if "num_labels" in config else len(config["id2label"]) == 1
    # a centred model (and a value model started from it) keeps its bias through the self-contained loader
    for name, role in (("reward_centred", "reward"), ("ppo_checkpoint", "value"), ("ppo_checkpoint", "reward")):
        assert (exports[name] / role / "biased_score_model.py").is_file()
    assert json.loads((exports["sft_4bit"] / "trl_ext_export.json").read_text())["quantized_in_training"] == "4-bit"


def test_centred_reward_model_keeps_its_offset(runs, plain_outputs, batch):
    trainer = runs["reward_centred"][1]
    model = _unwrapped(trainer)
    offset = trainer.state.log_history[-1].get("reward/center_offset") or next(
        h["reward/center_offset"] for h in trainer.state.log_history if "reward/center_offset" in h)
    assert abs(offset) > 1e-3  # the test means something: the head's bias is not zero
    out = plain_outputs["reward_centred/reward"]
    assert out["bias"] == pytest.approx(model.score.bias.item(), abs=1e-7)
    torch.testing.assert_close(_plain(plain_outputs, "reward_centred/reward"), _scores(model, batch), **FP32)


def test_lora_reward_adapter_merged_with_its_head(runs, plain_outputs, batch):
    model = _unwrapped(runs["reward_lora"][1])
    torch.testing.assert_close(_plain(plain_outputs, "reward_lora/reward"), _scores(model, batch), **FP32)


def _peft_reference(base, adapter_dir, batch, scalar=False):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    if scalar:
        model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    return _scores(model, batch) if scalar else _causal_logits(model, batch)


@pytest.mark.parametrize("name", ["sft_4bit", "dpo_8bit"])
def test_quantized_run_is_merged_into_the_unquantized_base(runs, plain_outputs, batch, tiny_models, name):
    run_dir, trainer = runs[name]
    reference = _peft_reference(str(tiny_models.policy), run_dir, batch)
    exported = _plain(plain_outputs, f"{name}/policy")
    torch.testing.assert_close(_masked(exported, batch), _masked(reference, batch), **FP32)
    # the adapter trained: the export is not just the base
    from transformers import AutoModelForCausalLM

    base = _causal_logits(AutoModelForCausalLM.from_pretrained(tiny_models.policy).eval(), batch)
    assert (_masked(exported, batch) - _masked(base, batch)).abs().max() > 1e-2
    # and it is close to the quantized model that trained (the difference is the quantization error only)
    quantized = _causal_logits(_unwrapped(trainer), batch)
    assert (_masked(exported, batch) - _masked(quantized, batch)).abs().max() < 0.5


def test_ppo_checkpoint_with_separate_models(runs, plain_outputs, batch):
    trainer = runs["ppo_checkpoint"][1]
    policy, value = trainer.model.policy.eval(), trainer.model.value_model.eval()
    torch.testing.assert_close(_masked(_plain(plain_outputs, "ppo_checkpoint/policy"), batch),
                               _masked(_causal_logits(policy, batch), batch), **FP32)
    torch.testing.assert_close(_plain(plain_outputs, "ppo_checkpoint/value"), _scores(value, batch), **FP32)
    torch.testing.assert_close(_plain(plain_outputs, "ppo_checkpoint/reward"),
                               _scores(trainer.reward_model.eval(), batch), **FP32)


def test_ppo_checkpoint_with_lora_policy_and_lora_value_model(runs, plain_outputs, batch):
    """Separate models, each a LoRA adapter: the policy's on the policy base, the value model's (SEQ_CLS, with its
    head) on the centred reward model."""
    trainer = runs["ppo_lora_checkpoint"][1]
    policy, value = trainer.model.policy.eval(), trainer.model.value_model.eval()
    from peft import PeftModel

    assert isinstance(policy, PeftModel) and isinstance(value, PeftModel)
    torch.testing.assert_close(_masked(_plain(plain_outputs, "ppo_lora_checkpoint/policy"), batch),
                               _masked(_causal_logits(policy, batch), batch), **FP32)
    torch.testing.assert_close(_plain(plain_outputs, "ppo_lora_checkpoint/value"), _scores(value, batch), **FP32)
    assert plain_outputs["ppo_lora_checkpoint/value"]["bias"] is not None  # the centred head came along


def test_checkpoint_without_a_recipe(ppo_run, tiny_models, batch, tmp_path, capsys):
    """A PPO checkpoint written from Python (no recipe; the session's `ppo_run`, tests/conftest.py): its LoRA
    policy's base was a temporary folder, deleted since, so export first refuses in one line; given the base
    (`--base`), it exports the policy (merged) and the value model."""
    from trl_ext.export import export_run

    checkpoint = ppo_run["run"] / "checkpoint-3"
    assert not ppo_run["base"].exists()
    code, err = _cli(capsys, "export", checkpoint, tmp_path / "out")
    assert code == 2 and len(err.splitlines()) == 1 and str(ppo_run["base"]) in err and "does not exist" in err
    assert not (tmp_path / "out").exists()

    code, err = _cli(capsys, "export", checkpoint, tmp_path / "out", "--base", tmp_path / "nowhere")
    assert code == 2 and "--base" in err and "no such directory" in err and not (tmp_path / "out").exists()
    info = export_run(checkpoint, tmp_path / "out", base=str(tiny_models.policy))  # the same deterministic model
    assert info["trainer"] == "ppo" and sorted(info["roles"]) == ["policy", "value"] and info["recipe"] == {}
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    exported = _causal_logits(AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "policy").eval(), batch)
    reference = _peft_reference(str(tiny_models.policy), checkpoint, batch)
    torch.testing.assert_close(_masked(exported, batch), _masked(reference, batch), **FP32)
    base = _causal_logits(AutoModelForCausalLM.from_pretrained(tiny_models.policy).eval(), batch)
    assert (_masked(exported, batch) - _masked(base, batch)).abs().max() > 1e-3  # the trained adapter is merged in
    value = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out" / "value").eval()
    saved = AutoModelForSequenceClassification.from_pretrained(checkpoint / "value_model").eval()
    torch.testing.assert_close(_scores(value, batch), _scores(saved, batch), rtol=0, atol=0)


def test_shared_base_ppo_output(runs, plain_outputs, batch):
    """Policy, value and reward adapters on one base become three standalone models computing what the trainer's
    shared-base models compute."""
    from trl_ext.models.shared_base import adapter_switch

    trainer = runs["ppo_shared"][1]
    policy = trainer.model.policy.eval()
    with adapter_switch(policy).use("default"):
        reference_logits = _causal_logits(policy, batch)
    for key, model in (("value", trainer.model.value_model), ("reward", trainer.reward_model)):
        reference = _scores(model.eval(), batch)
        torch.testing.assert_close(_plain(plain_outputs, f"ppo_shared/{key}"), reference, **FP32)
        bf16 = _plain(plain_outputs, f"ppo_shared_bf16/{key}")
        torch.testing.assert_close(bf16, reference, rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(_masked(_plain(plain_outputs, "ppo_shared/policy"), batch),
                               _masked(reference_logits, batch), **FP32)
    bf16 = _masked(_plain(plain_outputs, "ppo_shared_bf16/policy"), batch)
    assert plain_outputs["ppo_shared_bf16/policy"]["dtype"] == "torch.bfloat16"
    assert (bf16 - _masked(reference_logits, batch)).abs().max() < 0.05 * _masked(reference_logits, batch).abs().max()
    # the value adapter trained away from the reward adapter it started from: two different models
    assert not torch.allclose(_plain(plain_outputs, "ppo_shared/value"), _plain(plain_outputs, "ppo_shared/reward"))


def test_ppo_policy_export_carries_the_rollout_sampling_settings(exports):
    config = json.loads((exports["ppo_shared"] / "policy" / "generation_config.json").read_text())
    assert config["max_new_tokens"] == 10 and config["temperature"] == 1.0 and config["do_sample"] is True
    assert config.get("eos_token_id") is None  # PPO's default: no stop token, responses run to response_length


def test_roles_and_dtype_options(runs, tmp_path):
    from trl_ext.export import export_run

    info = export_run(runs["ppo_checkpoint"][0], tmp_path / "out", roles=["value"], dtype="float16")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "trl_ext_export.json", "value"]
    config = json.loads((tmp_path / "out" / "value" / "config.json").read_text())
    assert config["dtype"] == "float16" and info["dtype"] == "float16"
    # --overwrite replaces the folder, once the new export is complete
    export_run(runs["ppo_checkpoint"][0], tmp_path / "out", roles=["policy"], overwrite=True)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["README.md", "policy", "trl_ext_export.json"]


# ---------------------------------------------------------------------------------------------------------------
# Errors: one line, exit 2, nothing written


def _cli(capsys, *args):
    from trl_ext.cli import main

    code = main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    return code, err


def test_export_errors_are_one_line_and_write_nothing(runs, tmp_path, capsys):
    out = tmp_path / "out"
    code, err = _cli(capsys, "export", tmp_path, out)
    assert code == 2 and "not a trl-ext run" in err and len(err.splitlines()) == 1 and not out.exists()

    code, err = _cli(capsys, "export", runs["reward_centred"][0], out, "--roles", "value")
    assert code == 2 and "has no value model" in err and not out.exists()

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    code, err = _cli(capsys, "export", runs["reward_centred"][0], tmp_path / "full")
    assert code == 2 and "not empty" in err and (tmp_path / "full" / "keep.txt").read_text() == "mine"

    # a run whose base model is gone
    moved = tmp_path / "moved_run"
    shutil.copytree(runs["reward_lora"][0], moved)
    config = json.loads((moved / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = str(tmp_path / "gone" / "policy")
    (moved / "adapter_config.json").write_text(json.dumps(config))
    recipe = (moved / "trl_ext_recipe.yaml").read_text().replace("tiny://policy", str(tmp_path / "gone" / "policy"))
    (moved / "trl_ext_recipe.yaml").write_text(recipe)
    code, err = _cli(capsys, "export", moved, out)
    assert code == 2 and "does not exist" in err and "gone/policy" in err and len(err.splitlines()) == 1
    assert not out.exists() and not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_export_help_says_what_it_writes(capsys):
    from trl_ext.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["export", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "OUT_DIR/policy (AutoModelForCausalLM)" in text and "trl_ext_export.json" in text
