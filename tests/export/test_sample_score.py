"""`trl-ext score` and `trl-ext sample` on trained tiny runs: the numbers they print and write are the trained
models' (checked one sequence at a time, unpadded, against the trainer's own models), and their errors are one line
with exit code 2 and nothing written."""

import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PREFERENCES = ROOT / "recipes" / "demo" / "data" / "preferences.jsonl"
PROMPTS = ROOT / "recipes" / "demo" / "data" / "prompts.jsonl"


def _cli(capsys, *args):
    from trl_ext.cli import main

    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.strip()


def _unwrapped(trainer):
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(trainer.model, keep_fp32_wrapper=False).eval()


def _reference_score(model, tokenizer, prompt, response):
    """One unpadded sequence, tokenized as TRL's RewardTrainer tokenizes a chosen completion."""
    ids = tokenizer(text=prompt + response + tokenizer.eos_token)["input_ids"]
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, 0].item()


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def preference_rows():
    return [json.loads(line) for line in PREFERENCES.read_text().splitlines()[:12]]


def test_score_pairs_ranked_and_rows(reward_lora_run, preference_rows, tokenizer, tmp_path, capsys):
    run_dir, trainer = reward_lora_run
    model = _unwrapped(trainer)
    ref = [(_reference_score(model, tokenizer, r["prompt"], r["chosen"]),
            _reference_score(model, tokenizer, r["prompt"], r["rejected"])) for r in preference_rows]
    accuracy = sum(c > r for c, r in ref) / len(ref)
    margin = sum(c - r for c, r in ref) / len(ref)

    pairs = _write_jsonl(tmp_path / "pairs.jsonl", preference_rows)
    code, out, err = _cli(capsys, "score", run_dir, "--data", pairs, "--out", tmp_path / "pairs_scored.jsonl")
    assert code == 0, err
    assert f"12 pairs, accuracy {accuracy:.4f}, mean margin {margin:.4f}" in out
    scored = [json.loads(line) for line in (tmp_path / "pairs_scored.jsonl").read_text().splitlines()]
    assert [r["chosen"] for r in scored] == [r["chosen"] for r in preference_rows]
    torch.testing.assert_close(torch.tensor([r["scores"] for r in scored]), torch.tensor(ref), rtol=1e-4, atol=1e-4)

    # ranked lists: every pair of each list counts; the third response is another row's rejected one
    ranked = [{"prompt": r["prompt"], "responses": [r["chosen"], r["rejected"], preference_rows[(i + 1) % 12]
                                                    ["rejected"]]} for i, r in enumerate(preference_rows)]
    third = [_reference_score(model, tokenizer, r["prompt"], r["responses"][2]) for r in ranked]
    pair_margins = [m for (c, r), t in zip(ref, third) for m in (c - r, c - t, r - t)]
    code, out, err = _cli(capsys, "score", run_dir, "--data", _write_jsonl(tmp_path / "ranked.jsonl", ranked))
    assert code == 0, err
    expected_accuracy = sum(m > 0 for m in pair_margins) / 36
    assert f"36 pairs, accuracy {expected_accuracy:.4f}, mean margin {sum(pair_margins) / 36:.4f}" in out

    # prompt/response rows
    rows = [{"prompt": r["prompt"], "response": r["chosen"]} for r in preference_rows]
    code, out, err = _cli(capsys, "score", run_dir, "--data", _write_jsonl(tmp_path / "rows.jsonl", rows))
    assert code == 0, err
    assert f"12 rows, mean score {sum(c for c, _ in ref) / 12:.4f}" in out


def test_score_an_export_and_a_centred_model(reward_centred_run, preference_rows, tokenizer, tmp_path, capsys):
    """The exported reward model scores as the run does; the centred offset is part of every score."""
    from trl_ext.export import export_run

    run_dir, trainer = reward_centred_run
    export_run(run_dir, tmp_path / "export")
    model = _unwrapped(trainer)
    rows = [{"prompt": r["prompt"], "response": r["chosen"]} for r in preference_rows[:4]]
    data = _write_jsonl(tmp_path / "rows.jsonl", rows)
    expected = [_reference_score(model, tokenizer, r["prompt"], r["response"]) for r in rows]
    for source in (run_dir, tmp_path / "export", tmp_path / "export" / "reward"):
        out_file = tmp_path / f"scored-{len(list(tmp_path.iterdir()))}.jsonl"
        code, _, err = _cli(capsys, "score", source, "--data", data, "--out", out_file)
        assert code == 0, err
        got = [json.loads(line)["score"] for line in out_file.read_text().splitlines()]
        torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-4, atol=1e-4)


def test_score_errors_are_one_line_and_write_nothing(tmp_path, capsys, tokenizer, ppo_shared_run, preference_rows):
    from transformers import LlamaForSequenceClassification

    from trl_ext.testing import tiny_llama_config

    two = tmp_path / "two-labels"  # a 2-class classifier: not a reward model
    LlamaForSequenceClassification(tiny_llama_config(tokenizer, num_labels=2)).save_pretrained(two)
    tokenizer.save_pretrained(two)
    data = _write_jsonl(tmp_path / "pairs.jsonl", preference_rows[:2])
    out = tmp_path / "scored.jsonl"
    code, _, err = _cli(capsys, "score", two, "--data", data, "--out", out)
    assert code == 2 and "2 outputs" in err and len(err.splitlines()) == 1 and not out.exists()

    code, _, err = _cli(capsys, "score", tmp_path / "nothing", "--data", data)
    assert code == 2 and "no such directory" in err

    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "text": "b"}])
    code, _, err = _cli(capsys, "score", ppo_shared_run[0], "--data", bad)
    assert code == 2 and "need `response`" in err and len(err.splitlines()) == 1

    out.write_text("mine")
    code, _, err = _cli(capsys, "score", ppo_shared_run[0], "--data", data, "--out", out)
    assert code == 2 and "exists" in err and out.read_text() == "mine"


def test_sample_greedy_with_reward_scores(ppo_shared_run, reward_lora_run, tokenizer, tmp_path, capsys):
    """Greedy samples are the trained policy's greedy continuations (PPO run: response_length tokens, no stop
    token); their scores are what `trl-ext score` gives for the written file."""
    from transformers import GenerationConfig

    from trl_ext.models.shared_base import adapter_switch

    run_dir, trainer = ppo_shared_run
    out = tmp_path / "samples.jsonl"
    code, printed, err = _cli(capsys, "sample", run_dir, "--prompts", PROMPTS, "--limit", 3, "--greedy",
                              "--reward", reward_lora_run[0], "--out", out)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(isinstance(r["score"], float) for r in rows)
    assert "mean score" in printed and "wrote 3 samples" in printed

    policy = trainer.model.policy.eval()
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()[:3]]
    config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=None,
                              pad_token_id=tokenizer.pad_token_id)
    with adapter_switch(policy).use("default"), torch.no_grad():
        for prompt, row in zip(prompts, rows):
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            response = policy.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
            assert response.shape[1] - ids.shape[1] == 10  # no stop token: the full response length
            assert row["prompt"] == prompt
            assert row["response"] == tokenizer.decode(response[0, ids.shape[1]:], skip_special_tokens=True)

    scored = tmp_path / "rescored.jsonl"
    code, _, err = _cli(capsys, "score", reward_lora_run[0], "--data", out, "--out", scored)
    assert code == 0, err
    again = [json.loads(line)["score"] for line in scored.read_text().splitlines()]
    torch.testing.assert_close(torch.tensor(again), torch.tensor([r["score"] for r in rows]), rtol=1e-5, atol=1e-5)


def test_sampling_uses_the_ppo_settings_and_the_seed(ppo_shared_run, tmp_path, capsys):
    from trl_ext.export.run_dir import open_run
    from trl_ext.export.sample import generation_settings

    run_dir, trainer = ppo_shared_run
    settings = generation_settings(open_run(run_dir), trainer.model.policy)
    assert settings == {"max_new_tokens": 10, "top_k": 0, "top_p": 1.0, "min_p": None, "repetition_penalty": 1.0,
                        "do_sample": True,
                        "temperature": pytest.approx(1.0 + 1e-7), "stop_token_id": None}
    files = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        files.append(tmp_path / f"{name}.jsonl")
        code, _, err = _cli(capsys, "sample", run_dir, "--prompts", PROMPTS, "--limit", 2, "--num-samples", 2,
                            "--seed", seed, "--out", files[-1])
        assert code == 0, err
    a, b, c = (f.read_text() for f in files)
    assert a == b and a != c and len(a.splitlines()) == 4
    assert [json.loads(line)["sample"] for line in a.splitlines()] == [0, 1, 0, 1]


def test_chat_prompts(ppo_shared_run, reward_lora_run, tmp_path, capsys):
    """Chat prompts go through the chat template; responses come back as assistant messages and are scored as
    conversations, the same as `trl-ext score` scores the written file."""
    prompts = _write_jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": "tell me a story"}]},
                                                     {"prompt": [{"role": "user", "content": "hello"}]}])
    out = tmp_path / "samples.jsonl"
    code, _, err = _cli(capsys, "sample", ppo_shared_run[0], "--prompts", prompts, "--greedy", "--reward",
                        reward_lora_run[0], "--out", out)
    assert code == 0, err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["response"][0]["role"] for r in rows] == ["assistant", "assistant"]
    code, _, err = _cli(capsys, "score", reward_lora_run[0], "--data", out, "--out", tmp_path / "scored.jsonl")
    assert code == 0, err
    again = [json.loads(line)["score"] for line in (tmp_path / "scored.jsonl").read_text().splitlines()]
    assert again == pytest.approx([r["score"] for r in rows], abs=1e-5)


def test_sample_errors(ppo_shared_run, reward_centred_run, tmp_path, capsys):
    out = tmp_path / "samples.jsonl"
    code, _, err = _cli(capsys, "sample", reward_centred_run[0], "--prompts", PROMPTS, "--out", out)
    assert code == 2 and "has no policy model" in err and not out.exists()
    no_prompt = _write_jsonl(tmp_path / "p.jsonl", [{"question": "hi"}])
    code, _, err = _cli(capsys, "sample", ppo_shared_run[0], "--prompts", no_prompt, "--out", out)
    assert code == 2 and "no `prompt` column" in err and not out.exists()
    code, _, err = _cli(capsys, "sample", ppo_shared_run[0], "--prompts", PROMPTS, "--reward", ppo_shared_run[0] /
                        "nope", "--out", out)
    assert code == 2 and "no such directory" in err and not out.exists()


def test_help_says_what_each_command_writes(capsys):
    from trl_ext.cli import build_parser

    for command, needle in (("sample", "Writes one JSON line per sample"), ("score", "writes the rows with their "
                                                                                     "scores")):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        assert needle in " ".join(capsys.readouterr().out.split())


def test_a_ppo_recipes_sampling_keys_are_its_runs_sampling_settings():
    from trl_ext.export.export_models import ppo_sampling_settings

    settings = ppo_sampling_settings({"response_length": 12, "top_p": 0.9, "top_k": 5, "min_p": 0.1,
                                      "repetition_penalty": 1.2})
    assert {k: settings[k] for k in ("max_new_tokens", "top_p", "top_k", "min_p", "repetition_penalty")} == {
        "max_new_tokens": 12, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2}
