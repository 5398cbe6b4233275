"""Rollout log-probs taken while sampling (trl_ext.ppo.rollout.logprobs) equal TRL's from the stacked scores."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from ppo_helpers import left_tokenizer


@pytest.fixture(scope="module")
def setup(tiny_models):
    from transformers import AutoModelForCausalLM

    tok = left_tokenizer(tiny_models)
    model = AutoModelForCausalLM.from_pretrained(tiny_models.policy).eval()
    model.generation_config.eos_token_id = tok.eos_token_id
    texts = ["the cat is", "hello", "a very good dog and a", "sun", "tell me about the sea"]
    queries = tok(texts, padding=True, return_tensors="pt")["input_ids"]
    return model, tok, queries


def trl_rollout(model, queries, chunk, pad, config):
    try:  # TRL 1.10-1.12
        from trl.experimental.ppo.ppo_trainer import batch_generation
    except ImportError:  # TRL 1.13+: trl-ext's copy of it (equal to TRL 1.12's: tests/ppo/test_ppo_base.py)
        from trl_ext.ppo.rollout.sequences import batch_generation
    from trl.trainer.utils import selective_log_softmax

    query_responses, logits = batch_generation(model, queries, chunk, pad, config)
    return query_responses, selective_log_softmax(logits, query_responses[:, queries.shape[1]:])


def full_distribution_logprobs(model, queries, chunk, pad, config):
    """``log_softmax(logits / temperature)`` of the full vocabulary at each sampled token, from the raw logits
    ``generate`` returns (``output_logits``: before every processor), chunked and padded as TRL's rollout."""
    from trl.trainer.utils import selective_log_softmax

    out = []
    for i in range(0, queries.shape[0], chunk):
        query = queries[i : i + chunk]
        mask = query != pad
        output = model.generate(input_ids=torch.masked_fill(query, ~mask, 0), attention_mask=mask,
                                generation_config=config, return_dict_in_generate=True, output_logits=True)
        logits = torch.stack(output.logits, 1) / config.temperature
        out.append(selective_log_softmax(logits, output.sequences[:, query.shape[1]:]))
    width = max(lp.shape[1] for lp in out)
    fill = -torch.logsumexp(torch.zeros(model.config.vocab_size), -1)  # TRL's zero logits past a chunk's end
    return torch.cat([torch.cat((lp, fill.expand(lp.shape[0], width - lp.shape[1])), 1) for lp in out], 0)


@pytest.mark.parametrize(
    "kwargs, truncation",
    [
        (dict(temperature=0.7 + 1e-7, top_k=0.0, top_p=1.0), 0),  # TRL's PPO rollout config
        (dict(temperature=1.3, top_k=20, top_p=0.9), 2),  # the truncation warpers moved out of generate
        (dict(temperature=0.1, top_k=0, top_p=1.0, min_p=0.5), 1),  # peaked: min-p cuts
        (dict(temperature=1.0 + 1e-7, top_k=0.0, top_p=1.0, repetition_penalty=1.3), 0),  # a processor before them
    ],
)
def test_samples_equal_trls_and_logprobs_are_the_full_distributions(setup, kwargs, truncation):
    """Same samples as TRL's rollout (same RNG draws from the same distribution), and the log-probs those of the
    temperature-scaled full distribution at the sampled tokens, bit for bit: TRL's PPO numbers with the temperature
    alone; with top-k/top-p/min-p or a repetition penalty not TRL's processed scores (those are renormalised over
    the kept tokens, or penalised)."""
    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    model, tok, queries = setup
    # chunks of 2 of 5 queries, 24 new tokens; 1/16 of the vocabulary stops a sequence, so chunks stop early and
    # differ in length (TRL pads their logits with zeros)
    stop = list(range(20, 20 + model.config.vocab_size // 16))
    config = GenerationConfig(max_new_tokens=24, do_sample=True, eos_token_id=stop, pad_token_id=tok.pad_token_id,
                              **kwargs)
    plan = sampling_plan(model, config)
    assert plan is not None and len(plan.warpers) == 1 and len(plan.truncation) == truncation and plan.logprobs_exact
    assert plan.repetition_penalty == kwargs.get("repetition_penalty")
    torch.manual_seed(3)
    expected_qr, trl_lp = trl_rollout(model, queries, 2, tok.pad_token_id, config)
    torch.manual_seed(3)
    got_qr, got_lp = generate_with_logprobs(model, queries, 2, tok.pad_token_id, plan)
    assert torch.equal(got_qr, expected_qr)  # same samples: same sampling distribution, same RNG draws
    torch.manual_seed(3)
    full = full_distribution_logprobs(model, queries, 2, tok.pad_token_id, config)
    assert torch.equal(got_lp, full)
    if truncation or "repetition_penalty" in kwargs:  # TRL's processed scores are another distribution
        assert (got_lp - trl_lp).abs().max() > 1e-3
    else:
        assert torch.equal(got_lp, trl_lp)
    if truncation:  # the truncated distribution renormalises over fewer tokens: its log-probs are never lower
        sampled = torch.isfinite(trl_lp)  # (-inf: the pad token a finished row gets, cut by the truncation)
        assert (got_lp[sampled] <= trl_lp[sampled] + 1e-6).all()
    lengths = [int((row != tok.pad_token_id).sum()) for row in got_qr[:, queries.shape[1]:]]
    chunk_lengths = {max(lengths[i:i + 2]) for i in range(0, 5, 2)}
    assert len(chunk_lengths) > 1 and got_lp.shape == (5, got_qr.shape[1] - queries.shape[1])
    assert (got_lp <= 0).all()


def test_capture_keeps_one_step_of_scores(setup):
    """The processor holds per-token log-probs and one (batch, vocab) step, never the stacked scores."""
    from transformers import LogitsProcessorList

    from trl_ext.ppo.rollout.logprobs import SampledTokenLogprobs, sampling_plan

    model, tok, queries = setup
    plan = sampling_plan(model, GenerationConfig(max_new_tokens=12, min_new_tokens=12, do_sample=True,
                                                 temperature=0.5))
    capture = SampledTokenLogprobs()
    held = []

    class Spy(SampledTokenLogprobs):
        def __call__(self, input_ids, scores):
            out = capture(input_ids, scores)
            held.append(sum(t.numel() for t in capture.steps) + capture._last_scores.numel())
            return out

    sequences = model.generate(input_ids=queries, attention_mask=queries != tok.pad_token_id,
                               generation_config=plan.generation_config,
                               logits_processor=LogitsProcessorList([*plan.warpers, Spy()]))
    vocab = model.config.vocab_size
    assert len(held) == 12 and held[-1] == 11 * queries.shape[0] + queries.shape[0] * vocab
    assert capture.logprobs(sequences[:, queries.shape[1]:]).shape == (queries.shape[0], 12)


def test_unsupported_sampling_falls_back_to_trls_path(setup):
    from trl_ext.ppo.rollout.logprobs import sampling_plan

    model, _, _ = setup
    assert sampling_plan(model, GenerationConfig(do_sample=True, typical_p=0.9, top_k=0)) is None
    assert sampling_plan(model, GenerationConfig(do_sample=True, num_beams=2)) is None
    greedy = sampling_plan(model, GenerationConfig(do_sample=False, max_new_tokens=3))
    assert greedy is not None and greedy.warpers == []


@pytest.mark.parametrize("do_sample", [False, True])
def test_static_cache_decoding_gives_generates_tokens_and_logprobs(setup, do_sample, monkeypatch):
    """``rollout_cuda_graphs`` (trl_ext.ppo.rollout.decode_graphs): each chunk generates with a static KV cache and its
    decoding forward goes through a DecodeGraph (on CPU: eager, no graph). Greedy and sampled (same seed): the same
    tokens as the default dynamic cache, log-probs within float rounding (the attention runs over the full-length
    cache with the unused positions masked). The decoding forward is the runner's: one eager step per decoding step
    (chunks of 2 of 5 queries, 12 new tokens, no early stop: 11 decoding steps per chunk after the prefill), and the
    patch on the model is gone afterwards. Every decoding step of a chunk calls the forward with the same arguments
    (shapes, dtypes, the same cache object, the same flags): the key under which a CUDA graph is captured once per
    chunk (after one eager step) and replayed."""
    from trl_ext.ppo.rollout.decode_graphs import DecodeGraph, DecodeGraphs
    from trl_ext.ppo.rollout.logprobs import generate_with_logprobs, sampling_plan

    model, tok, queries = setup
    config = GenerationConfig(max_new_tokens=12, do_sample=do_sample, eos_token_id=None, pad_token_id=tok.pad_token_id,
                              **(dict(temperature=0.7 + 1e-7, top_k=0.0, top_p=1.0) if do_sample else {}))
    plan = sampling_plan(model, config)
    torch.manual_seed(5)
    expected_qr, expected_lp = generate_with_logprobs(model, queries, 2, tok.pad_token_id, plan)
    graphs, keys = DecodeGraphs(), []
    call = DecodeGraph.__call__
    monkeypatch.setattr(DecodeGraph, "__call__", lambda self, **kw: keys.append(self._key(kw)) or call(self, **kw))
    torch.manual_seed(5)
    got_qr, got_lp = generate_with_logprobs(model, queries, 2, tok.pad_token_id, plan, decode_graphs=graphs)
    monkeypatch.undo()
    chunks = [keys[i:i + 11] for i in range(0, len(keys), 11)]
    assert len(keys) == 33 and all(len(set(chunk)) == 1 for chunk in chunks)  # one key per chunk: captured once
    assert chunks[2][0] != chunks[0][0]  # the last chunk's one row: other shapes, another capture
    assert got_qr.shape == (5, queries.shape[1] + 12)
    assert torch.equal(got_qr, expected_qr)
    torch.testing.assert_close(got_lp, expected_lp, atol=1e-5, rtol=0)
    assert (graphs.eager_steps, graphs.replays, graphs.captures, graphs.failure) == (3 * 11, 0, 0, None)
    assert graphs.metrics() == {"rollout/cuda_graph_replays": 0.0, "rollout/eager_decode_steps": 33.0}
    assert "get_compiled_call" not in model.__dict__ and "_valid_auto_compile_criteria" not in model.__dict__


def reference_logprobs_as_trl(model, query_responses, context_length, pad, temperature):
    """TRL's reference pass: logits of every position, the response's sliced out, scaled, log-softmaxed."""
    from trl.trainer.utils import selective_log_softmax

    from trl_ext.ppo.rollout.logprobs import sequence_logits

    logits = sequence_logits(model, query_responses, pad).logits[:, context_length - 1 : -1]
    return selective_log_softmax(logits / (temperature + 1e-7), query_responses[:, context_length:])


@pytest.mark.parametrize("slice_bytes", [None, 1], ids=["one-slice", "row-by-row"])
def test_reference_logprobs_take_response_positions_in_slices(setup, monkeypatch, slice_bytes):
    from trl_ext.ppo.memory import budget as memory_budget
    from trl_ext.ppo.rollout.logprobs import response_logprobs

    model, tok, queries = setup
    pad = tok.pad_token_id
    responses = torch.randint(3, model.config.vocab_size, (queries.shape[0], 6))
    responses[1, 4:] = pad  # a stopped response
    query_responses = torch.cat((queries, responses), 1)
    if slice_bytes:
        monkeypatch.setattr(memory_budget, "LOGPROB_SLICE_BYTES", slice_bytes)
    calls = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, o: calls.append(tuple(o.shape)))
    with torch.no_grad():
        got = response_logprobs(model, query_responses, queries.shape[1], pad, 0.7)
    hook.remove()
    expected = reference_logprobs_as_trl(model, query_responses, queries.shape[1], pad, 0.7)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    vocab = model.config.vocab_size
    # the LM head runs on the 6 positions that predict a response token only, all rows at once or one by one
    assert calls == ([(5, 6, vocab)] if slice_bytes is None else [(1, 6, vocab)] * 5)


def test_a_head_the_forward_rescales_gets_its_logits_from_the_forward(setup):
    """Cohere-like ``logit_scale``: the plain-head path would skip the forward's scaling, so the forward runs."""
    from trl_ext.ppo.rollout.logprobs import _plain_head_lm, response_logprobs

    model, tok, queries = setup
    assert _plain_head_lm(model) is model
    query_responses = torch.cat((queries, torch.randint(3, model.config.vocab_size, (queries.shape[0], 4))), 1)
    model.config.logit_scale = 0.5
    try:
        assert _plain_head_lm(model) is None
        forward = model.forward
        seen = []
        model.forward = lambda *a, **kw: (seen.append(kw.get("logits_to_keep")), forward(*a, **kw))[1]
        with torch.no_grad():
            got = response_logprobs(model, query_responses, queries.shape[1], tok.pad_token_id, 1.0)
        del model.forward
    finally:
        del model.config.logit_scale
    assert seen == [5]  # logits of the 4 + 1 last positions only
    expected = reference_logprobs_as_trl(model, query_responses, queries.shape[1], tok.pad_token_id, 1.0)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
