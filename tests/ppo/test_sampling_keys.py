"""The sampling keys (trl_ext.ppo.rollout.sampling: top_p, top_k, min_p, repetition_penalty, generation_kwargs) in
the trainer's real rollout, on both engines: top-k 1 is greedy under any seed, a tiny top-p or min-p 1 forces the
argmax where the default samples, the penalty and generation_kwargs reach the sampling (and the sample
generations), and the stored log-probs stay those of the temperature-scaled full distribution.

What is asserted is what the knob guarantees (the argmax token, a suppressed token never sampled), not what the tiny
model happens to sample; "the default differs from greedy" holds because the tiny model's distribution is nearly
flat (log-probs around -5.9 over a few hundred tokens: 32 draws all at the argmax have probability < 1e-70)."""

from __future__ import annotations

import pytest
import torch

from ppo_helpers import config_kwargs, prompt_dataset, seed_all
from trl_ext.ppo.base import PPO_BASE
from trl_ext.ppo.rollout.engine import has_continuous_batching, teacher_forced_logprobs

ENGINES = ["generate", pytest.param("continuous_batching", marks=pytest.mark.skipif(
    not has_continuous_batching(), reason="transformers without the continuous batching trl-ext drives"))]
TEXTS = ["hello world the", "a b", "the quick brown fox jumps", "x"]
LENGTH = 8


def build(tiny_models, tok, tmp_path, reward_model=None, **overrides):
    """A critic-free LoRA trainer (no stop token: every response is LENGTH tokens) whose rollout the tests call."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    import trl_ext

    seed_all(0)

    def length(completion_ids, **kwargs):
        return [len(ids) / LENGTH for ids in completion_ids]

    kwargs = config_kwargs(tmp_path, num_sample_generations=0, total_episodes=4, num_ppo_epochs=1,
                           response_length=LENGTH, stop_token=None, missing_eos_penalty=None,
                           advantage_estimator="rloo", num_samples_per_prompt=2, local_rollout_forward_batch_size=4)
    kwargs.update(overrides)
    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = trl_ext.PPOTrainer(
        args=trl_ext.PPOConfig(**kwargs), processing_class=tok, model=AutoModelForCausalLM.from_pretrained(
            tiny_models.policy), ref_model=None, reward_model=reward_model, value_model=None, reward_funcs=[length],
        train_dataset=prompt_dataset(tok, n=8), eval_dataset=prompt_dataset(tok, n=4, seed=1), peft_config=peft_config)
    return trainer


def rollout(trainer, tok, seed: int, **keys):
    """The trainer's rollout of TEXTS with the sampling keys `keys` set, after `torch.manual_seed(seed)`."""
    for name, value in keys.items():
        setattr(trainer.args, name, value)
    trainer.init_data_streams()  # the generation config, from the keys
    queries = tok(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    torch.manual_seed(seed)
    with torch.no_grad():
        return trainer.generate_rollouts(queries)


def policy(trainer):
    return trainer.accelerator.unwrap_model(trainer.model).policy


def greedy(trainer, tok):
    from transformers import GenerationConfig

    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    queries = tok(TEXTS, padding=True, return_tensors="pt")["input_ids"]
    config = GenerationConfig(max_new_tokens=LENGTH, do_sample=False)
    with torch.no_grad():
        tokens, _ = generate_with_logprobs(policy(trainer), queries, len(TEXTS), tok.pad_token_id,
                                           sampling_plan(policy(trainer), config))
    return tokens[:, queries.shape[1]:]


def full_distribution(trainer, tok, result):
    """`log_softmax(logits / temperature)` of the policy at the rollout's tokens, one teacher-forced forward."""
    with torch.no_grad():
        return teacher_forced_logprobs(policy(trainer), result.query_responses, result.context_length,
                                       tok.pad_token_id, trainer.args.temperature, len(TEXTS))


@pytest.mark.parametrize("engine", ENGINES)
def test_top_k_1_is_greedy_under_any_seed_and_logprobs_are_the_full_distributions(tiny_models, tok, tmp_path,
                                                                                  engine):
    trainer = build(tiny_models, tok, tmp_path, rollout_engine=engine, top_k=1)
    first, second = rollout(trainer, tok, seed=1), rollout(trainer, tok, seed=2)
    assert torch.equal(first.responses, second.responses) and first.responses.shape == (len(TEXTS), LENGTH)
    assert torch.equal(first.responses, greedy(trainer, tok))
    # the truncated (top-1) distribution gives every sampled token log-prob 0; the full one does not
    full = full_distribution(trainer, tok, first)
    assert (first.logprobs - full).abs().max() < 1e-4
    assert first.logprobs.max() < -1.0
    if engine == "continuous_batching":
        assert trainer.rollout_engine.logprobs_from_engine is False  # top-k: recomputed by teacher forcing


@pytest.mark.parametrize("engine", ENGINES)
def test_top_p_and_min_p_change_what_is_sampled(tiny_models, tok, tmp_path, engine):
    """Same seed: the default samples (not the argmax), a tiny top_p and min_p 1.0 keep only the argmax."""
    trainer = build(tiny_models, tok, tmp_path, rollout_engine=engine)
    argmax = greedy(trainer, tok)
    default = rollout(trainer, tok, seed=3)
    assert (default.responses != argmax).any()
    nucleus = rollout(trainer, tok, seed=3, top_p=1e-6)
    assert torch.equal(nucleus.responses, argmax) and (nucleus.logprobs - full_distribution(
        trainer, tok, nucleus)).abs().max() < 1e-4
    min_p = rollout(trainer, tok, seed=3, top_p=1.0, min_p=1.0)
    assert torch.equal(min_p.responses, argmax) and min_p.logprobs.max() < -1.0
    again = rollout(trainer, tok, seed=3, min_p=None)  # back to the default: the default's samples
    assert torch.equal(again.responses, default.responses) and torch.equal(again.logprobs, default.logprobs)


def test_repetition_penalty_reaches_the_sampling(tiny_models, tok, tmp_path):
    """The penalty is in the rollout's generation config and among the processors that sample (the plan's, after
    the log-prob capture: the log-probs stay the unpenalised full distribution's). transformers' continuous-batching
    engine has no penalty: refused when named, `auto` takes generate."""
    import trl_ext
    from trl_ext.errors import UserInputError
    from trl_ext.ppo.rollout.logprobs import sampling_plan

    trainer = build(tiny_models, tok, tmp_path, repetition_penalty=1.5, rollout_engine="auto", stop_token="eos",
                    response_length=64)
    assert trainer.rollout_engine_choice.engine == "generate" and "repetition_penalty" in \
        trainer.rollout_engine_choice.reason  # auto would take continuous batching (stop token, 64 tokens)
    trainer.args.response_length = LENGTH
    result = rollout(trainer, tok, seed=4)
    assert trainer.generation_config.repetition_penalty == 1.5
    assert sampling_plan(policy(trainer), trainer.generation_config).repetition_penalty == 1.5
    assert (result.logprobs - full_distribution(trainer, tok, result)).abs().max() < 1e-4
    with pytest.raises(UserInputError, match=r"^repetition_penalty: transformers' continuous-batching engine"):
        trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", repetition_penalty=1.5,
                          rollout_engine="continuous_batching")


@pytest.mark.parametrize("engine", ENGINES)
def test_generation_kwargs_reach_the_sampling_and_logprobs_stay_the_full_distributions(tiny_models, tok, tmp_path,
                                                                                       engine):
    """generation_kwargs' `suppress_tokens` (every token but one) leaves that token only, while the log-probs stay
    the full distribution's (generate: recomputed, the suppression runs before the capture)."""
    trainer = build(tiny_models, tok, tmp_path, rollout_engine=engine)
    keep = 7
    others = [t for t in range(policy(trainer).config.vocab_size) if t != keep]
    only = rollout(trainer, tok, seed=4, generation_kwargs={"suppress_tokens": others})
    assert (only.responses == keep).all()
    assert (only.logprobs - full_distribution(trainer, tok, only)).abs().max() < 1e-4 and only.logprobs.max() < -1.0


@pytest.mark.skipif(PPO_BASE == "trl", reason="TRL <= 1.12's own generate_completions builds its config inline")
def test_sample_generations_take_the_keys(tiny_models, tok, tmp_path):
    """`generate_completions` (sample generations, scored by the reward model) samples with generation_kwargs too:
    every token but one suppressed, each response is that token repeated."""
    from transformers import AutoModelForSequenceClassification

    import trl_ext

    tables = []

    class Keep(trl_ext.PPOTrainer):
        def _log_completions(self, table):
            tables.append(table)

    keep = 7
    others = [t for t in range(tok.vocab_size) if t != keep]
    reward = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    trainer = build(tiny_models, tok, tmp_path, reward, generation_kwargs={"suppress_tokens": others}, top_k=3)
    trainer.__class__ = Keep
    trainer.generate_completions(sampling=True)
    (table,) = tables
    assert len(table["model response"]) == 2 and set(table["model response"]) == {tok.decode([keep] * LENGTH)}


def test_greedy_decoding_stays_greedy_and_quiet_with_every_key_set(tiny_models, tok, tmp_path):
    """With every sampling key set, a greedy config (evaluation) gets none of them: after a rollout, the config
    `generate` runs greedy decoding with passes transformers' strict check (no "generation flags are not valid"
    warning) and gives the tokens of a trainer without the keys."""
    from transformers import GenerationConfig

    from trl_ext.ppo.rollout.logprobs import _effective_config, sampling_plan

    plain = greedy(build(tiny_models, tok, tmp_path / "plain"), tok)
    trainer = build(tiny_models, tok, tmp_path / "keys", top_k=3, top_p=0.5, min_p=0.1, repetition_penalty=1.5,
                    generation_kwargs={"no_repeat_ngram_size": 3})
    rollout(trainer, tok, seed=5)
    plan = sampling_plan(policy(trainer), GenerationConfig(max_new_tokens=LENGTH, do_sample=False))
    assert plan.warpers == [] and plan.truncation == [] and plan.repetition_penalty is None
    _effective_config(policy(trainer), plan.generation_config).validate(strict=True)
    assert torch.equal(greedy(trainer, tok), plain)
