"""Every key of every shipped recipe, with wrong values of each kind: exit 2, one line naming the key, no traceback,
nothing written.

The wrong values are derived from each key's declared type, nullability, choices and range
(:func:`trl_ext.recipe_loader.validation.key_specs`), not from a hand list, so keys added later are walked too. In-process
``trl-ext check`` (and ``train`` for a set of common mistakes): each case fails before any model loads.
"""

import json
from pathlib import Path

import pytest
import yaml

from trl_ext.models.paths import looks_local
from trl_ext.cli import main
from trl_ext.recipe_loader.loader import _RecipeArgumentParser, _dataclass_types
from trl_ext.recipe_loader.validation import INT64_MAX, key_specs

ROOT = Path(__file__).resolve().parents[2]
DEMO_DATA = ROOT / "recipes" / "demo" / "data"
SHIPPED = sorted(p for p in (ROOT / "recipes").glob("**/*.yaml") if "trainer" in (yaml.safe_load(p.read_text()) or {}))


def wrong_values(spec, action):
    """(kind of mistake, YAML value) pairs that ``spec``'s key must refuse."""
    out = []
    list_like = action.nargs in ("+", "*")
    out.append(("wrong type", [{"nested": 1}] if list_like else [1, 2]))
    if spec.kind in ("int", "float", "bool"):
        out.append(("wrong type", "not-a-number" if spec.kind != "bool" else "maybe"))
    if spec.kind == "int" and not spec.choices:
        out.append(("wrong type", 1.5))
    if not spec.nullable:
        out.append(("null", None))
    if spec.choices:
        out.append(("wrong choice", "not-a-choice"))
    if spec.bound is not None and not spec.choices:
        b = spec.bound
        candidates = [("negative", -1), ("zero", 0)]
        if b.low is not None:
            candidates.append(("below range", b.low - 1 if spec.kind == "int" else b.low - 0.5))
        if b.high is not None:
            candidates.append(("above range", b.high + 1 if spec.kind == "int" else b.high + 0.5))
        candidates.append(("absurdly large", INT64_MAX + 1 if spec.kind == "int" else float("inf")))
        for kind, v in candidates:
            v = int(v) if spec.kind == "int" else float(v)
            if kind == "absurdly large" or v not in b:
                out.append((kind, v))
    seen, unique = set(), []
    for kind, v in out:
        if repr(v) not in seen:
            seen.add(repr(v))
            unique.append((kind, v))
    return unique


def tool_policy(root: Path) -> str:
    """An untrained tiny Llama whose tokenizer's chat template renders tool calls (TRL's Qwen2.5): the stand-in
    policy of a recipe with ``tools`` or ``environment_factory``; made once in ``root``."""
    from trl_ext.testing import build_causal_lm
    from trl_ext.testing.tools import build_tool_tokenizer

    path = root / "tool_policy"
    if not (path / "config.json").exists():
        tokenizer = build_tool_tokenizer(["What is 1 + 1?"])
        build_causal_lm(tokenizer, max_position_embeddings=512).save_pretrained(path)
        tokenizer.save_pretrained(path)
    return str(path)


def standins(keys, tmp_path, tiny_models, reward_adapter):
    """The recipe with what `check` needs to pass on this machine: its output_dir in tmp_path, and local models and
    data it reads from other recipes' outputs replaced by tiny ones (a tool-calling template for a recipe with
    tools)."""
    keys = dict(keys, output_dir=str(tmp_path / "out"))
    trainer = keys["trainer"]
    policy = "tiny://policy"
    if keys.get("tools") or keys.get("environment_factory"):
        policy = tool_policy(tmp_path)
    if keys.get("shared_base") and keys.get("reward_model_path"):  # an adapter on the tiny policy's base
        keys.update(model_name_or_path="tiny://policy", reward_model_path=str(reward_adapter))
        keys.pop("value_model_path", None)
    for key in ("model_name_or_path", "reward_model_path", "value_model_path"):
        value = keys.get(key)
        if isinstance(value, str) and looks_local(value) and not Path(value).exists():
            keys[key] = "tiny://reward" if key != "model_name_or_path" or trainer == "reward" else policy
    data = keys.get("dataset_name")
    if isinstance(data, str) and looks_local(data) and not (ROOT / data).exists() and not Path(data).exists():
        if trainer == "sft":
            d = tmp_path / "sft"
            d.mkdir(exist_ok=True)
            (d / "train.jsonl").write_text(json.dumps({"prompt": "a b", "completion": " c d"}) + "\n")
            (d / "test.jsonl").write_text(json.dumps({"prompt": "a b", "completion": " c d"}) + "\n")
            keys["dataset_name"] = str(d)
        elif any(keys.get(k) for k in ("reward_funcs", "tools", "environment_factory")):
            # chat prompts (tools need them) with the columns the recipes' reward functions read: `solution`
            d = tmp_path / "verifiable.jsonl"  # (GSM8K's accuracy_reward), `answer` (recipes/verifiable's checker)
            row = {"prompt": [{"role": "user", "content": "1+1?"}], "solution": "2", "answer": "2"}
            d.write_text(json.dumps(row) + "\n")
            keys["dataset_name"] = str(d)
            keys["dataset_test_split"] = "train"
        else:
            keys["dataset_name"] = str(DEMO_DATA / ("prompts.jsonl" if trainer == "ppo" else "preferences.jsonl"))
            keys["dataset_test_split"] = "train"  # a file's one split: the evaluation data of eval_strategy
    held_out = keys.get("eval_dataset_name")
    if isinstance(held_out, str) and looks_local(held_out) and not (ROOT / held_out).exists():
        del keys["eval_dataset_name"]  # the stand-in data's test split evaluates
    return keys


def run_cli(command, keys, path, capsys):
    path.write_text(yaml.safe_dump(keys, sort_keys=False))
    rc = main([command, str(path)])
    captured = capsys.readouterr()
    return rc, captured.err


def assert_refused(rc, err, key, out_dir, what):
    lines = err.strip().splitlines()
    assert rc == 2, f"{what}: exit {rc}, stderr {err!r}"
    assert len(lines) == 1 and lines[0].startswith("trl-ext: error: "), f"{what}: {err!r}"
    assert "Traceback" not in err
    names = {key, key.split("_", 1)[1] if key.startswith(("reward_", "value_")) else key}
    assert any(f"'{n}'" in lines[0] for n in names), f"{what}: the line does not name the key: {lines[0]}"
    assert not out_dir.exists() or not any(out_dir.iterdir()), f"{what}: wrote into {out_dir}"


@pytest.fixture
def walk(tmp_path, monkeypatch, capsys, tiny_models, reward_adapter):
    """Walk keys of a recipe (a dict) with their wrong values through ``trl-ext check``; returns the cases tried."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    seen = set()

    def run(keys, walked_keys=None, first_only=False):
        base = standins(keys, tmp_path, tiny_models, reward_adapter)
        path = tmp_path / "recipe.yaml"
        rc, err = run_cli("check", base, path, capsys)
        assert rc == 0, f"the recipe itself must pass check: {err}"
        types = _dataclass_types(base["trainer"])
        specs = key_specs(types)
        actions = {a.dest: a for a in _RecipeArgumentParser(types)._actions}
        tried = 0
        for key in walked_keys or [k for k in keys if k not in ("trainer", "env")]:
            cases = wrong_values(specs[key], actions[key])
            for kind, value in cases[:1] if first_only else cases:
                marker = (base["trainer"], bool(base.get("shared_base")), key, repr(value))
                if marker in seen:
                    continue
                seen.add(marker)
                rc, err = run_cli("check", {**base, key: value}, path, capsys)
                assert_refused(rc, err, key, tmp_path / "out", f"{key}: {value!r} ({kind})")
                tried += 1
        return tried

    return run


@pytest.mark.parametrize("recipe", SHIPPED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_key_of_every_shipped_recipe_refuses_wrong_values(recipe, walk):
    from trl_ext.recipe_loader.arguments import ENTRY_KEYS
    from trl_ext.recipe_loader.argv import portable_value

    keys = yaml.safe_load(recipe.read_text())
    for key in ENTRY_KEYS:  # file.py entries are relative to the recipe's folder; the walk writes elsewhere
        if keys.get(key):
            keys[key] = portable_value(key, keys[key], recipe.parent)
    assert walk(keys) > 0


@pytest.mark.parametrize("trainer", ["sft", "reward", "dpo", "ppo"])
def test_every_numeric_and_non_nullable_key_of_each_trainer(trainer, walk):
    """All keys a recipe may hold (also those no shipped recipe sets, and keys added to the configs later): the
    numeric ones with each value outside their range, the others with null where null is not valid."""
    base = {"sft": "recipes/gold/sft.yaml", "reward": "recipes/demo/reward.yaml", "dpo": "recipes/demo/dpo.yaml",
            "ppo": "recipes/demo/ppo.yaml"}[trainer]
    keys = yaml.safe_load((ROOT / base).read_text())
    specs = key_specs(_dataclass_types(trainer))
    # keys whose wrong value depends on others and is refused by a combination check (tested in test_recipes.py)
    skip = {"trainer", "shared_base", "overwrite_output_dir", "resume_from_checkpoint"}
    walked = [k for k, s in specs.items() if k not in skip and (s.bound is not None or not s.nullable)]
    assert len(walked) > 50
    assert walk(keys, walked) > 100


def test_common_mistakes_fail_before_anything_is_written(tmp_path, monkeypatch, capsys, tiny_models):
    """Common mistakes (a negative length or learning rate, a null, LoRA rank 0, zero episodes or epochs), through
    `trl-ext train` too: one line each, nothing written."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    ppo = dict(yaml.safe_load((ROOT / "recipes/demo/ppo.yaml").read_text()), reward_model_path="tiny://reward",
               output_dir=str(tmp_path / "out"))
    reward = dict(yaml.safe_load((ROOT / "recipes/demo/reward.yaml").read_text()), output_dir=str(tmp_path / "out"))
    cases = [
        (ppo, "response_length", -5, "recipe: key 'response_length': -5 is out of range (valid: an integer >= 1)"),
        (reward, "learning_rate", -1.0, "recipe: key 'learning_rate': -1.0 is out of range (valid: a number > 0)"),
        (reward, "learning_rate", None, "recipe: key 'learning_rate': null is not valid (valid: a number > 0)"),
        ({**reward, "use_peft": True}, "lora_r", 0, "recipe: key 'lora_r': 0 is out of range (valid: an integer >= 1)"),
        (ppo, "total_episodes", 0, "recipe: key 'total_episodes': 0 is out of range (valid: an integer >= 1)"),
        ({**ppo, "total_episodes": None}, "num_train_epochs", 0,
         "recipe: key 'num_train_epochs': 0.0 with no total_episodes trains on zero episodes"),
        (reward, "num_train_epochs", 0, "recipe: key 'num_train_epochs': 0.0 with no max_steps trains zero steps"),
    ]
    for command in ("check", "train"):
        for keys, key, value, expected in cases:
            rc, err = run_cli(command, {**keys, key: value}, tmp_path / "recipe.yaml", capsys)
            assert_refused(rc, err, key, tmp_path / "out", f"{command} {key}: {value!r}")
            assert err.strip() == f"trl-ext: error: {expected}" or err.strip().startswith(f"trl-ext: error: {expected}")


def test_null_on_the_command_line_is_a_recipe_null(tmp_path, monkeypatch, capsys, tiny_models):
    """`--key null` means null, as in a recipe: the same one-line message, not argparse's 'invalid float value'."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(dict(yaml.safe_load((ROOT / "recipes/demo/reward.yaml").read_text()),
                                        output_dir=str(tmp_path / "out"))))
    assert main(["check", str(path), "--learning_rate", "null"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "trl-ext: error: recipe: key 'learning_rate': null is not valid (valid: a number > 0)"


def test_ppo_combinations_its_trainer_refuses_late(tmp_path, monkeypatch, capsys, tiny_models):
    """What PPO's trainer checks only after the models load is refused by `check` and before `train` loads them."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    ppo = dict(yaml.safe_load((ROOT / "recipes/demo/ppo.yaml").read_text()), reward_model_path="tiny://reward",
               output_dir=str(tmp_path / "out"))
    cases = [
        ({"num_mini_batches": 3}, "num_mini_batches", "3 does not divide the rollout batch per_device_train_batch_size "
         "* gradient_accumulation_steps = 8"),
        ({"whiten_rewards": True, "num_mini_batches": 2}, "whiten_rewards", "mini-batches of at least 8 samples"),
        ({"stop_token": "eos", "stop_token_id": 2}, "stop_token", "both set"),
        ({"total_episodes": None, "num_train_epochs": 0.001}, "num_train_epochs", "is zero episodes"),
        ({"response_length": 256}, "response_length", "max_position_embeddings 256"),
    ]
    for command in ("check", "train"):
        for extra, key, needle in cases:
            rc, err = run_cli(command, {**ppo, **extra}, tmp_path / "recipe.yaml", capsys)
            assert_refused(rc, err, key, tmp_path / "out", f"{command} {extra}")
            assert needle in err, err


def test_library_errors_name_the_key(tmp_path, monkeypatch, capsys):
    """A ValueError from transformers' TrainingArguments (its own validation) becomes one line naming the key."""
    monkeypatch.chdir(ROOT)
    keys = dict(yaml.safe_load((ROOT / "recipes/demo/reward.yaml").read_text()), output_dir=str(tmp_path / "out"))
    rc, err = run_cli("check", {**keys, "logging_steps": 2.5}, tmp_path / "r.yaml", capsys)
    assert rc == 2 and err.startswith("trl-ext: error: recipe: key 'logging_steps': ") and "integer" in err
    # a GPU recipe (bf16) checked on a machine without one: the same, after the precision is relaxed for `check`
    gpu = dict(yaml.safe_load((ROOT / "recipes/qwen2.5-0.5b/reward.yaml").read_text()), output_dir=str(tmp_path / "o"))
    rc, err = run_cli("check", {**gpu, "logging_steps": 2.5}, tmp_path / "r.yaml", capsys)
    assert rc == 2 and err.startswith("trl-ext: error: recipe: key 'logging_steps': ") and "integer" in err
    # the message names other keys than the culprit: found by removing keys until the configs build
    rc, err = run_cli("check", {**keys, "eval_strategy": "steps", "eval_steps": 5, "save_strategy": "steps",
                                "save_steps": 7, "load_best_model_at_end": True}, tmp_path / "r.yaml", capsys)
    assert rc == 2 and "key '" in err and len(err.strip().splitlines()) == 1


def test_ranges_table_names_real_keys():
    """A typo in RANGES would silently check nothing: every row names a numeric key of some trainer's recipes."""
    from trl_ext.recipe_loader.validation import RANGES, Bound

    specs = {}
    for trainer in ("sft", "reward", "dpo", "ppo"):
        specs.update(key_specs(_dataclass_types(trainer)))
    for key, interval in RANGES.items():
        Bound.parse(interval)
        assert key in specs and specs[key].kind in ("int", "float"), key
    assert specs["lora_r"].bound == Bound.parse("[1, inf)") == specs["value_lora_r"].bound
    assert specs["kl_coef"].bound == Bound(low=0)  # derived: its default 0.05 is not negative
    assert specs["max_steps"].bound.describe("int") == "an integer >= -1"
    assert not specs["learning_rate"].nullable and specs["total_episodes"].nullable
