"""Log-probs of the sampled tokens, taken while ``generate`` samples them (no ``(batch, length, vocab)`` tensor), of
the temperature-scaled full distribution the loss evaluates; :func:`sampling_plan` rebuilds the sampling processors
around the capture. Why and how: docs/ppo-memory.md."""

from __future__ import annotations

import contextlib
import copy
import inspect
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from ...runtime.devices import empty_cache
from ...trl_internals import selective_log_softmax
from ..memory.budget import logprob_slice_rows
from .sequences import INVALID_LOGPROB, batch_generation, forward

__all__ = ["SampledTokenLogprobs", "SamplingPlan", "sampling_plan", "generate_with_logprobs", "sequence_logits",
           "response_logprobs", "training_forward", "generate_with_full_scores"]


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
    """The config to pass to ``generate``: the original with the moved processors neutralised and no scores kept."""
    warpers: list[LogitsProcessor]
    """Before the capture: the temperature ``generate`` would have applied (empty for greedy decoding)."""
    truncation: list[LogitsProcessor] = field(default_factory=list)
    """After the capture: top-k, top-p, min-p (transformers' order). They shape the sampling, not the log-probs."""
    repetition_penalty: float | None = None
    """After the capture, before the truncation: the penalty (built per chunk: it skips each row's left padding)."""
    logprobs_exact: bool = True
    """False when ``generate`` still builds logits processors of its own (``generation_kwargs``), which run before
    the capture: then the captured log-probs are not the temperature-scaled full distribution's."""

    def processors(self, attention_mask: torch.Tensor, capture: LogitsProcessor) -> LogitsProcessorList:
        """The ``logits_processor`` list of one chunk whose prompts have ``attention_mask``."""
        penalty = [] if self.repetition_penalty is None else [_repetition_penalty(self.repetition_penalty,
                                                                                  attention_mask)]
        return LogitsProcessorList([*self.warpers, capture, *penalty, *self.truncation])


def _repetition_penalty(penalty: float, attention_mask: torch.Tensor) -> LogitsProcessor:
    """transformers' penalty processor as ``generate`` builds it (each row's left padding not counted as a repeat)."""
    if "prompt_ignore_length" in inspect.signature(RepetitionPenaltyLogitsProcessor.__init__).parameters:
        return RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=(attention_mask != 0).int().argmax(1))
    return RepetitionPenaltyLogitsProcessor(penalty)


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


def _builds_processors(model, generation_config: GenerationConfig) -> bool:
    """Whether ``generate`` builds logits processors of its own from ``generation_config`` that run before a user's
    list (the warpers run after it; False when this transformers does not say)."""
    target = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = _effective_config(target, generation_config)
    build = getattr(target, "_get_logits_processor", None)
    if cfg is None or build is None:
        return False
    cfg = copy.deepcopy(cfg)
    cfg.do_sample = False  # the processors without the warpers
    try:
        return len(build(cfg)) > 0
    except Exception:  # noqa: BLE001 - an unexpected signature: assume none, as before
        return False


def sampling_plan(model, generation_config: GenerationConfig) -> SamplingPlan | None:
    """The temperature, repetition penalty and truncation warpers of ``generation_config`` moved into processor
    lists of our own (module docstring), or None when the config uses sampling features this module does not
    rebuild (then keep TRL's scores path).

    Conditions and order are transformers 5.24's ``_get_logits_processor``: repetition penalty if not 1.0, then
    temperature if not 1.0, top-k if not 0, top-p if < 1.0, min-p if set (``min_tokens_to_keep=1`` without beam
    search).
    """
    cfg = _effective_config(model, generation_config)
    if cfg is None:
        return None
    unsupported = (
        (cfg.num_beams or 1) > 1
        or cfg.renormalize_logits
        or cfg.watermarking_config is not None
        or getattr(cfg, "top_h", None) is not None
        or (cfg.do_sample and cfg.typical_p is not None and cfg.typical_p < 1.0)
        or (cfg.do_sample and cfg.epsilon_cutoff is not None and 0.0 < cfg.epsilon_cutoff < 1.0)
        or (cfg.do_sample and cfg.eta_cutoff is not None and 0.0 < cfg.eta_cutoff < 1.0)
    )
    if unsupported:
        return None
    neutral = copy.deepcopy(generation_config)
    neutral.output_scores, neutral.output_logits, neutral.return_dict_in_generate = False, False, False
    if not cfg.do_sample:  # greedy: no warpers to move (and transformers warns about sampling knobs set for greedy)
        return SamplingPlan(neutral, [])
    warpers, truncation = [], []
    if cfg.temperature is not None and cfg.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k is not None and cfg.top_k != 0:
        truncation.append(TopKLogitsWarper(top_k=cfg.top_k, min_tokens_to_keep=1))
    if cfg.top_p is not None and cfg.top_p < 1.0:
        truncation.append(TopPLogitsWarper(top_p=cfg.top_p, min_tokens_to_keep=1))
    if cfg.min_p is not None:
        truncation.append(MinPLogitsWarper(min_p=cfg.min_p, min_tokens_to_keep=1))
    penalty = cfg.repetition_penalty if cfg.repetition_penalty not in (None, 1.0) else None
    neutral.temperature, neutral.top_k, neutral.top_p, neutral.min_p = 1.0, 0, 1.0, None
    neutral.repetition_penalty = 1.0
    return SamplingPlan(neutral, warpers, truncation, penalty, not _builds_processors(model, neutral))


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
    log-probs of the response tokens under the temperature-scaled distribution (module docstring). Where a chunk stopped early, TRL's padded
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
                logits_processor=plan.processors(attention_mask, capture),
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


def sequence_logits(model, query_responses: torch.Tensor, pad_token_id: int, logits_to_keep: int = 0):
    """TRL's ``forward`` (pad tokens masked to 0, positions counted over non-pad tokens) without asking for the
    hidden states of every layer, which TRL's helper keeps alive next to the logits in no-grad passes (the
    reference log-probs): same logits, ``(layers + 1) x batch x length x hidden`` fewer values held.
    ``logits_to_keep``: the logits of the last positions only (transformers' argument; 0: every position)."""
    attention_mask = query_responses != pad_token_id
    position_ids = attention_mask.cumsum(1) - attention_mask.long()
    input_ids = torch.masked_fill(query_responses, ~attention_mask, 0)
    keep = {"logits_to_keep": logits_to_keep} if logits_to_keep else {}
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, return_dict=True,
                 **keep)


LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config keys of causal LMs whose forward changes the LM head's output (Gemma 2/3, Cohere, Granite): their
logits come from the model's own forward."""


def _plain_head_lm(model):
    """The causal LM under ``model`` (a peft model's base, LoRA layers in it) when its logits are its output
    embedding's output alone, else None."""
    lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = lm.get_output_embeddings() if hasattr(lm, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or not hasattr(lm, lm.base_model_prefix):
        return None
    if any(getattr(lm.config, key, None) not in (None, 1, 1.0) for key in LOGIT_POSTPROCESSING):
        return None
    return lm


def response_logprobs(model, query_responses: torch.Tensor, context_length: int, pad_token_id: int,
                      temperature: float) -> torch.Tensor:
    """``(batch, response_length)`` log-probs of the response tokens (``query_responses[:, context_length:]``)
    under ``log_softmax(logits / (temperature + 1e-7))``: TRL's reference pass without its ``(batch, prompt +
    response, vocab)`` logits. Only the positions that predict a response token get logits (as TRL's GRPOTrainer
    asks for them with ``logits_to_keep``), and those a slice of rows at a time (:func:`logprob_slice_rows`): the
    decoder runs once over the whole batch, the LM head on each slice of its last hidden states. A model whose
    forward changes the head's output (:data:`LOGIT_POSTPROCESSING`) gives its logits through its forward with
    ``logits_to_keep``, sliced for the log-softmax only."""
    responses = query_responses[:, context_length:]
    keep = responses.shape[1] + 1
    lm = _plain_head_lm(model)
    if lm is None:
        logits = sequence_logits(model, query_responses, pad_token_id, logits_to_keep=keep).logits[:, :-1]
        head = hidden = None
    else:
        decoder = getattr(lm, lm.base_model_prefix)
        hidden = sequence_logits(decoder, query_responses, pad_token_id).last_hidden_state[:, -keep:-1]
        head, logits = lm.get_output_embeddings(), None
    rows = logprob_slice_rows(responses.shape[1], head.out_features if head is not None else logits.shape[-1])
    out = []
    for i in range(0, query_responses.shape[0], rows):
        part = head(hidden[i : i + rows]) if head is not None else logits[i : i + rows]
        part /= temperature + 1e-7  # in place, as TRL scales its logits
        out.append(selective_log_softmax(part, responses[i : i + rows]))
        del part
    return torch.cat(out, 0)


def training_forward(model, query_responses: torch.Tensor, responses: torch.Tensor, padding_mask: torch.Tensor,
                     pad_token_id: int, temperature: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One micro-batch's forward of the PPO epochs through the policy-and-value ``model``: ``(logits, logprobs,
    values)``, the logits of the positions that predict a response token alone (as TRL's GRPOTrainer asks for
    them), divided by ``temperature + 1e-7`` in place; the response tokens' log-probs (``INVALID_LOGPROB`` after
    each response's end, ``padding_mask``); the value head's output over the whole sequence."""
    output, values = forward(model, query_responses, pad_token_id, logits_to_keep=responses.shape[1] + 1)
    logits = output.logits[:, :-1]
    logits /= temperature + 1e-7
    logprobs = selective_log_softmax(logits, responses)
    logprobs = torch.masked_fill(logprobs, padding_mask, INVALID_LOGPROB)
    return logits, logprobs, values


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
