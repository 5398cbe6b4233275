"""Log-probs of the sampled tokens, kept while ``generate`` samples them: no ``(batch, length, vocab)`` tensor.

TRL's PPO rollout (``batch_generation``) calls ``generate(output_scores=True)``, which keeps the processed logits of
every step, stacks them into a ``(batch, response_length, vocab)`` float32 tensor and only then takes one log-prob
per token from it (``selective_log_softmax``). For batch 64, 512 new tokens and a 128k-152k vocabulary that tensor is
17-20 GB. :func:`generate_with_logprobs` returns the same two things (query+response ids, per-token log-probs) while
holding at most one step's ``(batch, vocab)`` scores: :class:`SampledTokenLogprobs`, the last logits processor,
keeps a reference to step t's final scores and, when it is called at step t+1 (whose ``input_ids`` end with the
token sampled at step t), gathers that token's log-prob; the last step's comes from the final sequences.

The log-prob must be taken from the distribution the token was sampled from: the scores after *every* processor,
the sampling warpers (temperature, top-k, top-p) included. transformers (5.23) merges a user's ``logits_processor``
list *before* the warpers it builds from the generation config, so a processor appended by the user would see the
logits before the temperature. Hence :func:`sampling_plan` moves the warpers out of the generation config (a copy with
``temperature=1.0, top_k=0, top_p=1.0``, which makes ``generate`` build none) into our own list, in transformers'
order and with transformers' own warper classes, followed by the capture processor. Every processor thus runs in the
same order on the same tensors as in TRL's rollout, and the log-probs equal TRL's ``selective_log_softmax(stack(
scores), response)`` (same float32 ops: gather minus logsumexp over the vocabulary; tested for equality).

Why not recompute the log-probs with a forward pass after generation (in chunks)? It costs one more forward pass over
every query+response, and a full-sequence forward does not reproduce the incremental (KV-cache) logits bit for bit,
so TRL's numbers would no longer be reproduced exactly.

:func:`sequence_logits` is TRL's ``forward`` helper for the reference pass without the hidden states of every layer
(same logits, less memory held while scoring).

Generation configs whose sampling this module does not rebuild (beam search, ``min_p``, ``typical_p``,
``epsilon_cutoff``, ``eta_cutoff``, ``top_h``, watermarking, ``renormalize_logits``) get ``None`` from
:func:`sampling_plan`; the trainer then keeps TRL's path (exact, with the big tensor).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)
from trl.trainer.utils import selective_log_softmax

from ...runtime.devices import empty_cache
from .sequences import batch_generation

__all__ = ["SampledTokenLogprobs", "SamplingPlan", "sampling_plan", "generate_with_logprobs", "sequence_logits",
           "generate_with_full_scores"]


def token_logprobs(scores: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log_softmax(scores)[i, tokens[i]]`` for a ``(batch, vocab)`` float32 step, as TRL's
    ``selective_log_softmax`` computes it for float32 (gathered logit minus the row's logsumexp)."""
    selected = torch.gather(scores, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return selected - torch.logsumexp(scores, dim=-1)


class SampledTokenLogprobs(LogitsProcessor):
    """Last logits processor of a sampling run: records the log-prob of each sampled token under the final scores.

    It returns the scores unchanged and keeps only a reference to them (no copy); at the next call the token
    sampled from them is the last column of ``input_ids``. After ``generate``, :meth:`logprobs` adds the last step
    from the final sequences. Peak memory: one step's ``(batch, vocab)`` scores plus their logsumexp's workspace.
    """

    def __init__(self):
        self.steps: list[torch.Tensor] = []
        self.vocab_size: int | None = None
        self._last_scores: torch.Tensor | None = None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        if self._last_scores is not None:
            self.steps.append(token_logprobs(self._last_scores, input_ids[:, -1]))
        self._last_scores = scores
        self.vocab_size = scores.shape[-1]
        return scores

    def logprobs(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """The ``(batch, n)`` log-probs of the ``n`` generated tokens ``new_tokens`` (``sequences[:, context:]``).

        ``generate`` may run steps past the end and drop them again (deferred stop checks): only the first ``n``
        steps count.
        """
        n = new_tokens.shape[1]
        steps = self.steps[:n]
        if len(steps) < n:  # the last kept step: its token is the last one of the final sequences
            steps.append(token_logprobs(self._last_scores, new_tokens[:, len(steps)]))
        self._last_scores = None
        if not steps:
            return new_tokens.new_zeros(new_tokens.shape, dtype=torch.float32)
        return torch.stack(steps, 1)


@dataclass
class SamplingPlan:
    """How to sample with ``generate`` and still capture the sampling distribution's log-probs."""

    generation_config: GenerationConfig
    """The config to pass to ``generate``: the original with the warpers neutralised and no scores kept."""
    warpers: list[LogitsProcessor]
    """The warpers ``generate`` would have appended, in its order (empty for greedy decoding)."""


def _effective_config(model, generation_config: GenerationConfig) -> GenerationConfig | None:
    """The config ``generate`` will run with (``generation_config`` completed from the model's and the global
    defaults, as transformers does), or None if this transformers version does not expose how."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    prepare = getattr(target, "_prepare_generation_config", None)
    if prepare is None:
        return None
    try:
        return prepare(generation_config)[0]
    except Exception:  # noqa: BLE001 - an unexpected signature: keep TRL's path
        return None


def sampling_plan(model, generation_config: GenerationConfig) -> SamplingPlan | None:
    """The warpers of ``generation_config`` moved into a processor list of our own, or None when the config uses
    sampling features this module does not rebuild (then keep TRL's scores path).

    Conditions and order are transformers 5.23's ``_get_logits_processor``: temperature if not 1.0, top-k if not 0,
    top-p if < 1.0 (``min_tokens_to_keep=1`` without beam search).
    """
    cfg = _effective_config(model, generation_config)
    if cfg is None:
        return None
    unsupported = (
        (cfg.num_beams or 1) > 1
        or cfg.renormalize_logits
        or cfg.watermarking_config is not None
        or getattr(cfg, "top_h", None) is not None
        or (cfg.do_sample and cfg.min_p is not None)
        or (cfg.do_sample and cfg.typical_p is not None and cfg.typical_p < 1.0)
        or (cfg.do_sample and cfg.epsilon_cutoff is not None and 0.0 < cfg.epsilon_cutoff < 1.0)
        or (cfg.do_sample and cfg.eta_cutoff is not None and 0.0 < cfg.eta_cutoff < 1.0)
    )
    if unsupported:
        return None
    warpers: list[LogitsProcessor] = []
    if cfg.do_sample:
        if cfg.temperature is not None and cfg.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(cfg.temperature))
        if cfg.top_k is not None and cfg.top_k != 0:
            warpers.append(TopKLogitsWarper(top_k=cfg.top_k, min_tokens_to_keep=1))
        if cfg.top_p is not None and cfg.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=cfg.top_p, min_tokens_to_keep=1))
    neutral = copy.deepcopy(generation_config)
    if cfg.do_sample:  # greedy: no warpers to move (and transformers warns about sampling knobs set for greedy)
        neutral.temperature, neutral.top_k, neutral.top_p = 1.0, 0, 1.0
    neutral.output_scores, neutral.output_logits, neutral.return_dict_in_generate = False, False, False
    return SamplingPlan(neutral, warpers)


@torch.no_grad()
def generate_with_logprobs(
    model,
    queries: torch.Tensor,
    chunk_size: int,
    pad_token_id: int,
    plan: SamplingPlan,
    on_chunk=None,
    decode_graphs=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's ``batch_generation`` followed by ``selective_log_softmax``, without keeping every step's scores.

    Generates for ``queries`` (left-padded with ``pad_token_id``) in chunks of ``chunk_size`` as TRL does (pad
    positions masked to 0 in the inputs), and returns ``(query_responses, logprobs)``: ``queries`` followed by the
    responses, right-padded with ``pad_token_id`` to the longest chunk, and the ``(batch, response_length)``
    log-probs of the response tokens under the sampling distribution. Where a chunk stopped early, TRL's padded
    logits are zeros; the log-prob there is the same ``-log(vocab)`` (those positions are masked out later anyway).
    ``on_chunk(start, responses)``, if given, is called with each chunk's responses as soon as it is generated (the
    reward functions' workers start on them while the next chunk generates). ``decode_graphs``
    (:class:`~trl_ext.ppo.rollout.decode_graphs.DecodeGraphs`, ``rollout_cuda_graphs``): each chunk generates with a
    static KV cache, its decoding steps replayed as a CUDA graph.
    """
    context_length = queries.shape[1]
    generation_config = plan.generation_config
    if decode_graphs is not None:
        generation_config = copy.deepcopy(generation_config)
        generation_config.cache_implementation = "static"
    chunks = []
    for i in range(0, queries.shape[0], chunk_size):
        query = queries[i : i + chunk_size]
        attention_mask = query != pad_token_id
        capture = SampledTokenLogprobs()
        with decode_graphs.decoding(model) if decode_graphs is not None else contextlib.nullcontext():
            sequences = model.generate(
                input_ids=torch.masked_fill(query, ~attention_mask, 0),
                attention_mask=attention_mask,
                generation_config=generation_config,
                logits_processor=LogitsProcessorList([*plan.warpers, capture]),
            )
        response = sequences[:, context_length:]
        chunks.append((torch.cat((query, response), 1), capture.logprobs(response), capture.vocab_size))
        if on_chunk is not None:
            on_chunk(i, response)
        del capture
    length = max(qr.shape[1] for qr, _, _ in chunks)
    query_responses, logprobs = [], []
    for query_response, chunk_logprobs, vocab_size in chunks:
        missing = length - query_response.shape[1]
        if missing:
            fill = -torch.logsumexp(torch.zeros(vocab_size or 1, device=chunk_logprobs.device), dim=-1)
            query_response = torch.nn.functional.pad(query_response, (0, missing), value=pad_token_id)
            chunk_logprobs = torch.cat((chunk_logprobs, fill.expand(chunk_logprobs.shape[0], missing)), 1)
        query_responses.append(query_response)
        logprobs.append(chunk_logprobs)
    return torch.cat(query_responses, 0), torch.cat(logprobs, 0)


def sequence_logits(model, query_responses: torch.Tensor, pad_token_id: int):
    """TRL's ``forward`` (pad tokens masked to 0, positions counted over non-pad tokens) without asking for the
    hidden states of every layer, which TRL's helper keeps alive next to the logits in no-grad passes (the
    reference log-probs): same logits, ``(layers + 1) x batch x length x hidden`` fewer values held."""
    attention_mask = query_responses != pad_token_id
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    input_ids = torch.masked_fill(query_responses, ~attention_mask, 0)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True)


def generate_with_full_scores(model, queries: torch.Tensor, chunk: int, pad_token_id: int,
                              generation_config: GenerationConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's rollout, for the generation configs :func:`sampling_plan` does not rebuild: ``batch_generation`` keeps
    the ``(batch, response_length, vocab)`` scores, then ``selective_log_softmax`` per chunk of ``chunk`` rows.
    Returns the query+response ids and the response tokens' log-probs (TRL 1.12's numbers)."""
    context_length = queries.shape[1]
    query_responses, logitss = batch_generation(model, queries, chunk, pad_token_id, generation_config)
    logprobs = []
    for i in range(0, queries.shape[0], chunk):
        response = query_responses[i : i + chunk, context_length:]
        logprobs.append(selective_log_softmax(logitss[i : i + chunk], response))
    del logitss
    empty_cache()
    return query_responses, torch.cat(logprobs, 0)
