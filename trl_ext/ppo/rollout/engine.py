"""``rollout_engine``: sample the rollout with ``model.generate`` (:mod:`trl_ext.ppo.rollout.logprobs`) or with
transformers' continuous-batching engine, its KV cache sized as one chunk of the memory budget, the trainer's RNG and
padding conventions kept, its log-probs used when only the temperature shapes sampling. Guide: docs/rollout-engine.md.
"""

from __future__ import annotations

import atexit
import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from transformers import GenerationConfig

from ...errors import UserInputError
from ...trl_internals import selective_log_softmax
from .logprobs import _effective_config, sequence_logits

__all__ = [
    "AUTO_MIN_RESPONSE_LENGTH",
    "LOGPROB_TOLERANCE",
    "ROLLOUT_ENGINES",
    "ContinuousBatchingRollout",
    "EngineCachePlan",
    "EngineChoice",
    "build_rollout_engine",
    "choose_rollout_engine",
    "engine_cache_plan",
    "engine_logprobs_usable",
    "has_continuous_batching",
    "teacher_forced_logprobs",
]

GENERATE, CONTINUOUS_BATCHING, AUTO = "generate", "continuous_batching", "auto"
RolloutEngineName = Literal["generate", "continuous_batching", "auto"]
ROLLOUT_ENGINES = get_args(RolloutEngineName)

AUTO_MIN_RESPONSE_LENGTH = 64
"""``auto`` takes continuous batching from this ``response_length`` on (with a stop token). Measured on CPU
(``benchmarks/rollout_engine.py --threshold``, ``benchmarks/README.md`` section 15; uneven lengths, continuous
batching / ``generate`` tokens/s): 1.09x at 16 tokens, 1.24x at 32, 1.38x at 64, 1.71x at 128. Below 64 the gain is
small and within what another machine's per-step overheads can undo; from 64 on it is clear."""

LOGPROB_TOLERANCE = 1e-5
"""Largest ``|engine log-prob - teacher-forced log-prob|`` accepted, per token, CPU float32. Measured with
``benchmarks/rollout_engine.py --tolerance`` (tiny and small Llama, with and without LoRA, temperatures 0.7/1.0/1.3,
with a stop token; 3,100 tokens): largest difference 1.4e-6 (``benchmarks/README.md`` section 15); this is that
bound with a 7x margin. ``generate``'s streamed log-probs differ from the teacher-forced ones by the same 1.4e-6
(KV-cache vs full-sequence forward). With top-k 50 the engine's differ by up to 2.8, with top-p 0.9 by 0.105
(``-log 0.9``: the renormalised truncated distribution): those configs recompute."""

PAGE_SIZE = 32
"""Tokens per cache page (transformers' default is 256: one page per short sequence would waste most of a cache sized
to the chunk). Each sequence wastes less than one page."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine a run uses and why (the trainer's ``rollout_engine_choice``)."""

    requested: str
    engine: str
    reason: str

    def describe(self) -> str:
        return f"rollout_engine: {self.requested} -> {self.engine} ({self.reason})"


def choose_rollout_engine(requested: str, response_length: int, stop_token_set: bool,
                          device_type: str = "cpu") -> EngineChoice:
    """The engine for ``rollout_engine = requested`` on a ``device_type`` device. ``auto``'s rule:

    * on CUDA, ``generate``: the one GPU measurement (one H200, 8B QLoRA PPO, ``benchmarks/README.md`` section 7)
      gave continuous batching 0.48x ``generate``'s rollout tokens/s and 8 GiB more reserved memory; ``auto`` takes
      it there only once a GPU measurement shows it winning;
    * elsewhere (measured on CPU, section 15): continuous batching iff a stop token is set (``stop_token`` or
      ``stop_token_id``: without one TRL's PPO lets every response run to ``response_length``, the lengths are all
      equal and ``generate`` is faster) and ``response_length >= AUTO_MIN_RESPONSE_LENGTH`` (room for lengths to
      spread).
    """
    if requested != AUTO:
        return EngineChoice(requested, requested, "as configured")
    if device_type == "cuda":
        return EngineChoice(AUTO, GENERATE, "on CUDA continuous batching measured slower (0.48x generate's tokens/s, "
                                            "one H200)")
    if not stop_token_set:
        return EngineChoice(AUTO, GENERATE, "no stop token: every response runs to response_length")
    if response_length < AUTO_MIN_RESPONSE_LENGTH:
        return EngineChoice(AUTO, GENERATE, f"response_length {response_length} < {AUTO_MIN_RESPONSE_LENGTH}")
    return EngineChoice(AUTO, CONTINUOUS_BATCHING,
                        f"stop token set and response_length {response_length} >= {AUTO_MIN_RESPONSE_LENGTH}")


MIN_TRANSFORMERS = "5.24"
"""The transformers this module is written and tested against: it drives the engine's manager (start, stop without
``gc.collect``, its cache, its RNG reseed), whose internals change between minor releases."""


def has_continuous_batching() -> bool:
    """The installed transformers has the continuous-batching engine this module drives (:data:`MIN_TRANSFORMERS`)."""
    import transformers
    from packaging.version import Version

    if Version(transformers.__version__).release[:2] < Version(MIN_TRANSFORMERS).release[:2]:
        return False
    try:
        from transformers.generation.continuous_batching import ContinuousMixin
    except ImportError:
        return False
    return hasattr(ContinuousMixin, "init_continuous_batching")


def build_rollout_engine(args, accelerator, prompt_length: int
                         ) -> tuple[ContinuousBatchingRollout | None, EngineChoice]:
    """Called once by :class:`trl_ext.PPOTrainer` when it is built (after ``local_rollout_forward_batch_size:
    auto`` is resolved; ``prompt_length``: the longest train prompt): resolves ``auto`` and prints the choice once.
    Returns the engine (None for ``generate``: the trainer's own path, unchanged) and the choice."""
    from ...runtime.engines import zero3_enabled

    stop_token_set = bool(args.stop_token) or args.stop_token_id is not None
    choice = choose_rollout_engine(args.rollout_engine, args.response_length, stop_token_set,
                                   accelerator.device.type)
    if choice.engine == CONTINUOUS_BATCHING and choice.requested == AUTO and not has_continuous_batching():
        choice = EngineChoice(AUTO, GENERATE, "this transformers has no continuous batching")
    if choice.engine == CONTINUOUS_BATCHING and choice.requested == AUTO and args.repetition_penalty != 1.0:
        choice = EngineChoice(AUTO, GENERATE, "repetition_penalty: the engine has no repetition penalty")
    if choice.engine == CONTINUOUS_BATCHING and zero3_enabled(accelerator):
        if choice.requested == AUTO:
            choice = EngineChoice(AUTO, GENERATE, "DeepSpeed ZeRO-3")
        else:
            raise UserInputError("rollout_engine: 'continuous_batching' is not supported under DeepSpeed ZeRO-3; "
                                 "use 'generate' or ZeRO-2")
    if args.rollout_engine != GENERATE:
        accelerator.print(choice.describe())
    if choice.engine == GENERATE:
        return None, choice
    chunk = min(int(args.local_rollout_forward_batch_size), args.local_batch_size)  # generate's largest chunk too
    plan = engine_cache_plan(chunk, prompt_length, args.response_length)
    return ContinuousBatchingRollout(plan, args.temperature), choice


@dataclass(frozen=True)
class EngineCachePlan:
    """The engine's sizes (:func:`engine_cache_plan`), fixed for the run."""

    chunk: int
    """Sequences whose full-length KV the cache holds at once, and the most sequences per forward."""
    prompt_length: int
    response_length: int
    page_size: int
    num_blocks: int
    max_batch_tokens: int

    @property
    def cache_tokens(self) -> int:
        return self.num_blocks * self.page_size

    def config_kwargs(self) -> dict:
        """Keyword arguments of ``transformers.ContinuousBatchingConfig``. ``max_memory_percent=1.0``: the sizes are
        fixed here; transformers only checks that they fit the device's free memory. Prefix sharing stays on
        (the samples of one prompt, ``num_samples_per_prompt``, share its KV); :meth:`ContinuousBatchingRollout.sample`
        empties the prefix ledger before each rollout, so no KV of an earlier policy is reused. No CUDA graphs: a
        graph would freeze what the policy's Python decides per call (which adapter is active on a shared base)."""
        return dict(page_size=self.page_size, num_blocks=self.num_blocks, max_batch_tokens=self.max_batch_tokens,
                    max_requests_per_batch=self.chunk, max_memory_percent=1.0, use_cuda_graph=False)


def engine_cache_plan(chunk: int, prompt_length: int, response_length: int, page_size: int = PAGE_SIZE
                      ) -> EngineCachePlan:
    """The cache of ``generate``'s one chunk, paged: ``chunk`` sequences of ``prompt_length + response_length``
    tokens, each rounded up to whole pages (``num_blocks = chunk * ceil(seq / page_size)``, so ``chunk`` full-length
    sequences always fit and none is evicted); ``max_requests_per_batch = chunk`` (logits rows of one chunk);
    ``max_batch_tokens = max(chunk, prompt_length)`` (every active sequence decodes in one forward, a whole prompt
    prefills in one; the attention mask of a forward is ``max_batch_tokens x (cache + max_batch_tokens)``)."""
    if chunk < 1 or prompt_length < 1 or response_length < 1:
        raise ValueError(f"engine_cache_plan: sizes must be positive, got {chunk}, {prompt_length}, {response_length}")
    pages = math.ceil((prompt_length + response_length) / page_size)
    return EngineCachePlan(chunk=chunk, prompt_length=prompt_length, response_length=response_length,
                           page_size=page_size, num_blocks=chunk * pages,
                           max_batch_tokens=max(chunk, prompt_length))


def engine_logprobs_usable(processors, generation_config: GenerationConfig, temperature: float) -> bool:
    """True when the engine's per-token log-probs are the trainer's own: sampling, and the engine's logits
    processors are exactly one ``TemperatureLogitsWarper`` at the trainer's ``temperature + 1e-7`` (what the loss
    divides the logits by). Top-k, top-p or any other processor truncates or reshapes the sampling distribution:
    then the trainer recomputes the log-probs (:func:`teacher_forced_logprobs`)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper

    if not generation_config.do_sample or len(processors) != 1:
        return False
    (only,) = processors
    return type(only) is TemperatureLogitsWarper and only.temperature == temperature + 1e-7


@torch.no_grad()
def teacher_forced_logprobs(policy, query_responses: torch.Tensor, context_length: int, pad_token_id: int,
                            temperature: float, chunk: int) -> torch.Tensor:
    """The trainer's log-probs of the responses: ``log_softmax(logits / (temperature + 1e-7))`` of one forward of
    the policy over each chunk of ``chunk`` query+responses (pad tokens masked, as the reference pass)."""
    out = []
    for i in range(0, query_responses.shape[0], chunk):
        query_response = query_responses[i : i + chunk]
        keep = query_response.shape[1] - context_length + 1  # the positions that predict a response token
        logits = sequence_logits(policy, query_response, pad_token_id, logits_to_keep=keep).logits[:, :-1]
        logits = logits.float() / (temperature + 1e-7)
        out.append(selective_log_softmax(logits, query_response[:, context_length:]))
        del logits
    return torch.cat(out, 0)


def _generating_model(policy):
    """The transformers model that generates (a peft model's LoRA layers are in it; the active adapter applies)."""
    return policy.get_base_model() if hasattr(policy, "get_base_model") else policy


class ContinuousBatchingRollout:
    """The run's continuous-batching engine: one ``ContinuousBatchingManager`` (and its cache), built on the first
    rollout, restarted for each one. ``generate(trainer, policy, queries)`` is what ``generate_rollouts`` calls;
    ``temperature``: the config's (the log-probs are of ``softmax(logits / temperature)``)."""

    def __init__(self, plan: EngineCachePlan, temperature: float = 1.0):
        self.plan, self.temperature = plan, temperature
        self.manager = None
        self._model = None
        self._config_key = None
        self._cache_nbytes = 0
        self.logprobs_from_engine: bool | None = None
        """After the first rollout: True if the engine's log-probs are the rollout's, False if recomputed."""

    # -------------------------------------------------------------- the manager, once per run

    def _manager(self, model, generation_config: GenerationConfig):
        key = (id(model), generation_config.to_json_string(use_diff=False))
        if self.manager is not None and self._config_key == key:
            return self.manager
        self.close()
        from transformers import ContinuousBatchingConfig

        training = {module: module.training for module in model.modules()}
        rng = torch.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            cb_config = ContinuousBatchingConfig(return_logprobs=True, **self.plan.config_kwargs())
            manager = model.init_continuous_batching(generation_config=generation_config,
                                                     continuous_batching_config=cb_config)
            kept = manager.logit_processor.logits_processor
            dropped = len(model._get_logits_processor(generation_config)) - len(kept)
            if dropped:
                raise UserInputError(
                    f"rollout_engine: continuous batching would drop {dropped} of this generation config's logits "
                    "processors (not supported by the engine); use rollout_engine 'generate'"
                )
            manager.warmup()  # builds the batch processor and its cache (reseeds torch: undone below)
        finally:
            torch.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
            for module, mode in training.items():  # the manager calls model.eval()
                module.training = mode
        # the manager switched the attention to a paged one; stop() restores it, start() switches again
        self._restore_attention(manager)
        # kept here, not on the model: transformers' own persistence would put a thread-owning object on the module
        self.manager, self._model, self._config_key = manager, model, key
        atexit.register(self.close)  # free the cache while the interpreter is whole (its __del__ needs torch)
        return manager

    @staticmethod
    def _restore_attention(manager) -> None:
        if manager._original_attn_impl is not None:
            manager.model.set_attn_implementation(manager._original_attn_impl)
            manager._original_attn_impl = None

    def _hold_cache(self, manager, hold: bool) -> None:
        """Give the cache's memory back between rollouts (``hold=False``: its storage shrinks to 0 bytes) and take
        it again, zeroed, for the next (``hold=True``). The scoring and training phases then have the memory the
        budget gives them; the cache object, its views and the engine stay built (resizing a storage keeps every
        view valid, the trick FSDP uses for its flat parameters)."""
        processor = manager.batch_processor
        if processor is None:
            return
        storage = processor.cache.cache_tensor.untyped_storage()
        if hold:
            if storage.nbytes() == 0:
                storage.resize_(self._cache_nbytes)
                processor.cache.cache_tensor.zero_()  # as built: padded reads must not meet NaN bit patterns
        else:
            self._cache_nbytes = storage.nbytes()
            storage.resize_(0)

    @staticmethod
    def _stop(manager) -> None:
        """``manager.stop(keep_for_next_session=True)`` without its ``gc.collect()`` (0.3 s and more per rollout in a
        training process) and its 0.1 s idle wait: ask the loop to finish, wake it, join it; keep the batch processor
        (the cache); restore the attention implementation."""
        status = manager.background_thread_status
        status.request_stop(status.FLUSH_AND_STOP, manager.distributed_helper.global_rank)
        manager._wake_up_loop.set()
        thread = manager._generation_thread
        if thread is not None:
            thread.join()
            manager._generation_thread = None
        ContinuousBatchingRollout._restore_attention(manager)

    def close(self) -> None:
        """Free the engine's cache (called when the manager must be rebuilt; the trainer's end frees it too)."""
        if self.manager is not None:
            self.manager.batch_processor = None
            self.manager.destroy()
            self.manager = None

    # -------------------------------------------------------------- one rollout

    @torch.no_grad()
    def sample(self, model, queries: torch.Tensor, pad_token_id: int, generation_config: GenerationConfig,
               on_finished=None, max_new_tokens: int | None = None):
        """Generate one response per left-padded query. Returns ``(query_responses, logprobs, processors)``:
        the trainer's layout (see the module docstring), the engine's per-token log-probs (0 after each end) and
        the engine's logits processors. ``on_finished(row, response)``, if given, is called with each response
        (``(1, length)`` ids) as soon as it is done, while the others still generate."""
        config = _effective_config(model, generation_config) or generation_config
        manager = self._manager(model, config)
        inputs = [row[row != pad_token_id].tolist() for row in queries]
        status = manager.background_thread_status
        status.clear()  # accept requests again after the previous rollout's stop
        manager.switch_to_cb_friendly_attn(model, manager.continuous_batching_config.auto_switch_to_flash)
        if manager.batch_processor is not None:  # prefix blocks hold the previous rollout's (older) weights' KV
            manager.batch_processor.cache.reset()
            self._hold_cache(manager, True)
        request_ids = manager.add_requests(inputs=inputs, max_new_tokens=max_new_tokens or config.max_new_tokens)
        results, rows = {}, {rid: row for row, rid in enumerate(request_ids)}
        manager.start()  # all requests are queued: the scheduler sees them at once (same batches every run)
        try:
            while len(results) < len(request_ids):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    results[result.request_id] = result
                    if on_finished is not None and result.error is None:
                        on_finished(rows[result.request_id],
                                    torch.tensor([result.generated_tokens], dtype=queries.dtype, device=queries.device))
                elif result is None and not manager.is_running():
                    break
        finally:
            self._stop(manager)
            self._hold_cache(manager, False)
        failed = [rid for rid in request_ids if rid not in results or results[rid].error is not None]
        if failed:
            error = results[failed[0]].error if failed[0] in results else "no result"
            raise RuntimeError(f"continuous batching: {len(failed)} of {len(request_ids)} requests failed ({error})")
        outputs = [results[rid] for rid in request_ids]
        fill = config.pad_token_id
        if fill is None:
            eos = config.eos_token_id
            fill = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else pad_token_id
        width = max(len(o.generated_tokens) for o in outputs)
        responses = queries.new_full((len(outputs), width), fill)
        logprobs = torch.zeros((len(outputs), width), dtype=torch.float32, device=queries.device)
        for i, output in enumerate(outputs):
            n = len(output.generated_tokens)
            responses[i, :n] = torch.tensor(output.generated_tokens, dtype=queries.dtype)
            if output.logprobs:
                logprobs[i, :n] = torch.tensor(output.logprobs, dtype=torch.float32)
        return torch.cat((queries, responses), 1), logprobs, list(manager.logit_processor.logits_processor)

    def generate(self, policy, queries: torch.Tensor, pad_token_id: int, generation_config,
                 max_new_tokens: int | None = None, on_finished=None) -> tuple[torch.Tensor, torch.Tensor]:
        """One turn of :meth:`trl_ext.PPOTrainer.sample_turn`: ``(query_responses, logprobs)``. ``max_new_tokens``:
        ``generation_config``'s unless given (a later turn of a multi-turn episode: the tokens left; the manager and
        its cache are kept); ``on_finished(row, response)``: called as each row is done."""
        query_responses, logprobs, processors = self.sample(
            _generating_model(policy), queries, pad_token_id, generation_config, on_finished=on_finished,
            max_new_tokens=max_new_tokens)
        self.logprobs_from_engine = engine_logprobs_usable(processors, generation_config, self.temperature)
        if not self.logprobs_from_engine:
            logprobs = teacher_forced_logprobs(policy, query_responses, queries.shape[1], pad_token_id,
                                               self.temperature, self.plan.chunk)
        return query_responses, logprobs
