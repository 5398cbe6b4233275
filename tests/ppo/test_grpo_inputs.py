"""PPOTrainer takes GRPOTrainer's inputs: `prompt` datasets (text or chat messages), model ids and paths, a
GRPOConfig. The same GRPOTrainer script body runs with TRL's GRPOTrainer (TRL >= 1.13) and with trl_ext's
PPOTrainer (the GRPOConfig as it is, or through PPOConfig.from_grpo_config), on the tiny models."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from trl_ext.errors import UserInputError

trl = pytest.importorskip("trl")
TRL_GRPO = Version(trl.__version__).release >= (1, 13)  # GRPOTrainer's prompt rendering and loss of TRL >= 1.13
needs_trl_grpo = pytest.mark.skipif(not TRL_GRPO, reason=f"TRL {trl.__version__}: GRPOTrainer of TRL >= 1.13")

WORDS = ["the cat sat", "a dog ran far", "birds sing", "one two three four"]
CHAT = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": w}] for w in WORDS]


def datasets():
    from datasets import Dataset

    answers = [str(i) for i in range(len(WORDS))]
    return (Dataset.from_dict({"prompt": WORDS * 2, "answer": answers * 2}),
            Dataset.from_dict({"prompt": CHAT * 2, "answer": answers * 2}))


# ----------------------------------------------------------------------------------------------- the script


def grpo_script(Config, Trainer, model_id: str, out, calls: list):
    """A GRPOTrainer user's script: text prompts with a LoRA adapter, then chat prompts, both from a model id, with
    TRL's reward functions and one of the user's that reads a dataset column. Only `Config`/`Trainer` change."""
    from peft import LoraConfig
    from trl.rewards import get_soft_overlong_punishment, think_format_reward

    def distinct_chars(completions, answer, **kwargs):  # `answer`: a column of the dataset
        calls.append((completions, answer))
        text = [c if isinstance(c, str) else c[0]["content"] for c in completions]
        return [len(set(t)) / 10.0 for t in text]

    text_prompts, chat_prompts = datasets()
    common = dict(use_cpu=True, bf16=False, report_to="none", per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=6, max_steps=1, logging_steps=1, save_strategy="no", learning_rate=0.05,
                  max_grad_norm=0.0, seed=3, disable_tqdm=True)
    text_run = Trainer(model=model_id, reward_funcs=[get_soft_overlong_punishment(6, 2), distinct_chars],
                       args=Config(output_dir=str(out / "text"), **common), train_dataset=text_prompts,
                       peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    text_run.train()
    chat_run = Trainer(model=model_id, reward_funcs=[think_format_reward, distinct_chars],
                       args=Config(output_dir=str(out / "chat"), beta=0.04, **common), train_dataset=chat_prompts)
    chat_run.train()
    return text_run, chat_run


def _policy(trainer):
    model = trainer.model
    return model.policy if hasattr(model, "policy") else model


def _config(name):
    from trl import GRPOConfig

    import trl_ext

    if name == "from_grpo_config":
        return lambda **keys: trl_ext.PPOConfig.from_grpo_config(GRPOConfig(**keys))
    return GRPOConfig


def _trainer(name):
    from trl import GRPOTrainer

    import trl_ext

    return GRPOTrainer if name == "trl" else trl_ext.PPOTrainer


@pytest.mark.parametrize("trainer", ["trl", "trl_ext", "from_grpo_config"])
@pytest.mark.filterwarnings("ignore:GRPOConfig. not honoured")
def test_the_same_grpo_script_trains_with_either_trainer(tiny_models, tmp_path, trainer):
    if trainer == "trl" and not TRL_GRPO:
        pytest.skip(f"TRL {trl.__version__}: GRPOTrainer of TRL >= 1.13")
    from transformers import AutoModelForCausalLM

    calls = []
    text_run, chat_run = grpo_script(_config(trainer), _trainer(trainer), str(tiny_models.policy), tmp_path, calls)
    # the user's reward function saw each row's column beside its completions: k = 4 samples of one prompt
    text_completions, answers = calls[0]
    assert len(text_completions) == 4 and len(set(answers)) == 1 and answers[0] in {"0", "1", "2", "3"}
    assert all(isinstance(c, str) for c in text_completions)
    chat_completions = calls[-1][0]
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in chat_completions)
    for run, names in ((text_run, ("soft_overlong_punishment_reward", "distinct_chars")),
                       (chat_run, ("think_format_reward", "distinct_chars"))):
        logged = {k for entry in run.state.log_history for k in entry}
        assert {f"rewards/{n}/mean" for n in names} <= logged
    # the text run trained a LoRA adapter (B starts at zero), the chat run the whole policy
    lora_b = [p for n, p in _policy(text_run).named_parameters() if "lora_B" in n]
    assert lora_b and max(p.abs().max().item() for p in lora_b) > 0
    start = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    moved = [not torch.equal(p, q.to(p.device)) for p, q in zip(start.parameters(), _policy(chat_run).parameters())]
    assert any(moved)
    if trainer != "trl":
        assert text_run.is_peft_model and text_run.ref_model is None  # reference: the adapter disabled
        assert text_run.args.kl_in == chat_run.args.kl_in == "loss" and chat_run.args.kl_coef == 0.04
        assert chat_run.processing_class.padding_side == "left"


# ----------------------------------------------------------------------------------------------- prompts


def left_tokenizer(tiny_models):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_models.tokenizer)


def test_prompts_are_tokenized_and_columns_kept_for_reward_functions(tiny_models):
    from trl_ext.ppo.grpo_compat.prompt_dataset import prepare_prompt_datasets

    tok = left_tokenizer(tiny_models)
    text, chat = datasets()
    args = type("Args", (), {"dataset_num_proc": None, "chat_template_kwargs": None})()
    train, evaluation = prepare_prompt_datasets(args, tok, text, chat, keep_columns=True)
    assert train.column_names == ["prompt", "answer", "input_ids"] and tok.padding_side == "left"
    assert train["input_ids"][1] == tok("a dog ran far")["input_ids"]
    rendered = tok.apply_chat_template(CHAT[1], add_generation_prompt=True, tokenize=False)
    assert rendered.endswith("<|assistant|>") and "be brief" in rendered
    assert evaluation["input_ids"][1] == tok(rendered, add_special_tokens=False)["input_ids"]
    only_ids, _ = prepare_prompt_datasets(args, tok, chat, None, keep_columns=False)  # no reward functions
    assert only_ids.column_names == ["input_ids"] and only_ids["input_ids"] == evaluation["input_ids"]
    tokenized = text.add_column("input_ids", [[5, 6]] * len(text))
    assert prepare_prompt_datasets(args, tok, tokenized, None, keep_columns=False)[0] is tokenized  # as it is


def test_chat_template_kwargs_reach_the_template(tiny_models):
    from trl_ext.ppo.grpo_compat.prompt_dataset import prepare_prompt_datasets

    tok = left_tokenizer(tiny_models)
    tok.chat_template = tok.chat_template + "{% if short %}{{ 'short' }}{% endif %}"
    _, chat = datasets()
    plain = type("Args", (), {"dataset_num_proc": None, "chat_template_kwargs": None})()
    short = type("Args", (), {"dataset_num_proc": None, "chat_template_kwargs": {"short": True}})()
    a = prepare_prompt_datasets(plain, tok, chat, None, keep_columns=False)[0]["input_ids"][0]
    b = prepare_prompt_datasets(short, tok, chat, None, keep_columns=False)[0]["input_ids"][0]
    assert b[:len(a)] == a and b[len(a):] == tok("short", add_special_tokens=False)["input_ids"]


@needs_trl_grpo
def test_prompts_get_the_ids_grpotrainer_gives_them(tiny_models, tmp_path):
    """Text and chat prompts: the ids of TRL's own GRPOTrainer._tokenize_prompts, token for token."""
    from trl import GRPOConfig, GRPOTrainer

    from trl_ext.ppo.grpo_compat.prompt_dataset import tokenize_prompts

    tok = left_tokenizer(tiny_models)
    grpo = GRPOTrainer(model=str(tiny_models.policy), reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                       args=GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                                       per_device_train_batch_size=4, num_generations=2),
                       train_dataset=datasets()[0], processing_class=tok)
    for dataset in datasets():
        ours = tokenize_prompts(dataset, tok)["input_ids"]
        assert ours == [list(ids) for ids in grpo._tokenize_prompts(list(dataset["prompt"]))[0]]


def ppo_args(tmp_path, **keys):
    import trl_ext

    return trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                             per_device_train_batch_size=4, gradient_accumulation_steps=1, response_length=4,
                             num_sample_generations=0, total_episodes=8, **keys)


def test_a_dataset_without_prompts_is_refused_naming_its_columns(tiny_models, tmp_path):
    from datasets import Dataset

    import trl_ext

    policy = str(tiny_models.policy)
    text = Dataset.from_dict({"text": ["a b"] * 4, "label": [1] * 4})
    with pytest.raises(UserInputError, match=r"^train_dataset: has no column 'prompt' or 'input_ids' \(columns: "
                                             r"text, label\); PPOTrainer takes prompts"):
        trl_ext.PPOTrainer(args=ppo_args(tmp_path), model=policy, reward_model=str(tiny_models.reward),
                           value_model=str(tiny_models.reward), train_dataset=text)
    with pytest.raises(UserInputError, match=r"^eval_dataset: has no column 'prompt' or 'input_ids' \(columns: "
                                             r"text, label\)"):
        trl_ext.PPOTrainer(args=ppo_args(tmp_path), model=policy, reward_model=str(tiny_models.reward),
                           value_model=str(tiny_models.reward), train_dataset=datasets()[0], eval_dataset=text)


# ----------------------------------------------------------------------------------------------- model ids


def test_model_ids_are_loaded_as_grpotrainer_loads_them(tiny_models, tmp_path):
    """GAE with every model given as a path and no tokenizer: the checkpoints' weights, float32, one-output heads,
    a left-padding tokenizer from the policy's checkpoint; `model_init_kwargs` reaches `from_pretrained`."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    import trl_ext

    trainer = trl_ext.PPOTrainer(args=ppo_args(tmp_path), model=str(tiny_models.policy),
                                 ref_model=str(tiny_models.policy), reward_model=str(tiny_models.reward),
                                 value_model=str(tiny_models.reward), train_dataset=datasets()[0])
    tok = trainer.processing_class
    assert (tok.padding_side, tok.truncation_side, tok.pad_token) == ("left", "left", "<pad>")
    policy = AutoModelForCausalLM.from_pretrained(tiny_models.policy)
    scalar = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    for loaded, expected in ((_policy(trainer), policy), (trainer.ref_model, policy),
                             (trainer.reward_model, scalar), (trainer.model.value_model, scalar)):
        pairs = list(zip(loaded.state_dict().values(), expected.state_dict().values()))
        assert len(pairs) > 5 and all(torch.equal(a, b) and a.dtype == torch.float32 for a, b in pairs)
    assert trainer.reward_model.config.num_labels == 1 and trainer.train_dataset["input_ids"][0] == \
        tok("the cat sat")["input_ids"]

    half = trl_ext.PPOTrainer(args=ppo_args(tmp_path, advantage_estimator="grpo", num_samples_per_prompt=2,
                                            model_init_kwargs={"dtype": "bfloat16"}),
                              model=str(tiny_models.policy), reward_funcs=[str(tiny_models.reward)],
                              train_dataset=datasets()[0])
    assert {p.dtype for p in _policy(half).parameters()} == {torch.bfloat16}
    assert {p.dtype for p in half.reward_scorer.reward_models[0].parameters()} == {torch.bfloat16}


def test_a_model_id_that_does_not_load_is_one_line(tiny_models, tmp_path):
    import trl_ext

    with pytest.raises(UserInputError, match=r"^model: cannot load '.*no-such-model'"):
        trl_ext.PPOTrainer(args=ppo_args(tmp_path, advantage_estimator="grpo", num_samples_per_prompt=2),
                           model=str(tmp_path / "no-such-model"), reward_funcs=[lambda completions, **kw: [0.0]],
                           train_dataset=datasets()[0])
