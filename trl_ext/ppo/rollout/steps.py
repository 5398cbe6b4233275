"""Steps 2 and 3 of :class:`trl_ext.PPOTrainer`'s update as one part, :class:`RolloutSteps`: sample the responses
and score them (reference log-probs, values, truncation at the stop token, scores, padding masks). Built once by the
trainer from what it reads (:class:`RolloutSettings`, the models, the accelerator, the critic and the extensions that
take part); the trainer's named steps (``generate_rollouts``, ``sample_turn``, ``score_rollouts``,
``compute_ref_logprobs``, ...) call it and pass it their bound methods where one step calls another
(:class:`ScoringSteps`), so that a subclass's override takes effect (the list of steps: docs/ppo.md)."""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch

from ...models.scalar_heads import scalar_model_outputs
from ...trl_internals import unwrap_model_for_generation
from .containers import Rollout
from .engine import teacher_forced_logprobs
from .logprobs import generate_with_full_scores, generate_with_logprobs, response_logprobs, sampling_plan
from .sampling import RolloutSampling
from .sequences import INVALID_LOGPROB, first_true_indices, truncate_response

__all__ = ["RolloutSettings", "RolloutSteps", "ScoringSteps"]


@dataclass(frozen=True)
class RolloutSettings:
    """What the rollout and scoring steps read of the config and the tokenizer."""

    temperature: float
    chunk: int
    """``local_rollout_forward_batch_size`` (``auto`` resolved)."""
    missing_eos_penalty: float | None
    gather_deepspeed3_params: bool
    pad_token_id: int
    eos_token_id: int
    stop_token_id: int | None
    """Where a response is cut (``stop_token``/``stop_token_id``; None: never)."""

    @classmethod
    def from_args(cls, args, processing_class, stop_token_id: int | None) -> "RolloutSettings":
        return cls(args.temperature, int(args.local_rollout_forward_batch_size),
                   args.missing_eos_penalty, args.ds3_gather_for_generation, processing_class.pad_token_id,
                   processing_class.eos_token_id, stop_token_id)


class ScoringSteps(NamedTuple):
    """The trainer's steps that :meth:`RolloutSteps.score` calls (its bound methods: overrides take effect)."""

    ref_logprobs: Callable
    postprocess: Callable
    values: Callable
    scores: Callable


class RolloutSteps:
    """The rollout and scoring of one trainer (module docstring).

    Args:
        settings: the keys it reads (:class:`RolloutSettings`).
        model: the trainer's policy-and-value model as prepared (``.policy``, ``.value_model`` once unwrapped).
        ref_model: the reference model, or None: the policy under ``reference_context`` (adapters off).
        reward_model: the reward model (None with reward functions only).
        accelerator: the run's accelerator.
        reference_context: a context manager factory making the policy the reference (the trainer's
            ``null_ref_context``).
        critic: the run's critic (values: :mod:`trl_ext.ppo.objective.critic`).
        reward_scoring, multi_turn, rollout_engine, decode_graphs: the extensions that take part (None when off).
    """

    def __init__(self, settings: RolloutSettings, *, model, ref_model, reward_model, accelerator, reference_context,
                 critic, reward_scoring=None, multi_turn=None, rollout_engine=None, decode_graphs=None):
        self.settings = settings
        self.model, self.ref_model, self.reward_model = model, ref_model, reward_model
        self.accelerator, self.reference_context, self.critic = accelerator, reference_context, critic
        self.reward_scoring, self.multi_turn = reward_scoring, multi_turn
        self.rollout_engine, self.decode_graphs = rollout_engine, decode_graphs

    def generate(self, queries: torch.Tensor, sampling: RolloutSampling, sample_turn: Callable,
                 on_chunk: Callable) -> Rollout:
        """Step 2: one response per query (``sample_turn(policy, queries, max_new_tokens, on_chunk=...)`` per turn;
        with ``tools`` a multi-turn episode, :mod:`trl_ext.ppo.episodes.multi_turn`)."""
        context_length = queries.shape[1]
        episodes = None
        with unwrap_model_for_generation(
            self.model,
            self.accelerator,
            gather_deepspeed3_params=self.settings.gather_deepspeed3_params,
            generation_kwargs=sampling.kwargs,  # fixes transformers#42762, as TRL does
        ) as unwrapped_model:
            policy = unwrapped_model.policy
            if self.multi_turn is not None:  # tools: turns until no tool call; episodes scored once complete
                query_responses, logprobs, episodes = self.multi_turn.run(
                    queries, lambda prefixes, max_new_tokens: sample_turn(policy, prefixes, max_new_tokens))
            else:
                query_responses, logprobs = sample_turn(policy, queries, sampling.config.max_new_tokens,
                                                        on_chunk=on_chunk)  # response_length
        if episodes is not None and self.reward_scoring is not None:  # completions as TRL passes them
            self.reward_scoring.use_episodes(episodes, self.multi_turn.toolbox.environments)
        return Rollout(
            queries=queries,
            context_length=context_length,
            query_responses=query_responses,
            responses=query_responses[:, context_length:].contiguous(),
            logprobs=logprobs,
            episodes=episodes,
        )

    def sample_turn(self, policy, queries: torch.Tensor, max_new_tokens: int, sampling: RolloutSampling,
                    on_chunk=None) -> tuple[torch.Tensor, torch.Tensor]:
        """At most ``max_new_tokens`` tokens after each left-padded query: ``(query_responses, logprobs)`` (the
        continuous-batching engine, else ``generate`` with the log-probs taken as sampled, else TRL's path). The
        log-probs are ``log_softmax(logits / temperature)``'s; where the sampled scores went through other processors
        first (``generation_kwargs``'), or TRL's path sampled with the sampling keys, one teacher-forced forward
        recomputes them. ``on_chunk(start, responses)``: called as each chunk (engine: each row) is done."""
        generation_config = sampling.config
        pad_token_id, chunk = self.settings.pad_token_id, self.settings.chunk
        if self.rollout_engine is not None:  # continuous batching (trl_ext.ppo.rollout.engine)
            return self.rollout_engine.generate(policy, queries, pad_token_id, generation_config, max_new_tokens,
                                                on_finished=on_chunk)
        if max_new_tokens != generation_config.max_new_tokens:  # a later turn of an episode: the tokens left
            generation_config = copy.deepcopy(generation_config)
            generation_config.max_new_tokens = max_new_tokens
        plan = sampling_plan(policy, generation_config)
        if plan is not None:
            query_responses, logprobs = generate_with_logprobs(policy, queries, chunk, pad_token_id, plan,
                                                               on_chunk=on_chunk, decode_graphs=self.decode_graphs)
            if plan.logprobs_exact:
                return query_responses, logprobs
        else:
            warnings.warn("generate_rollouts: sampling config not rebuilt; keeping TRL's path", stacklevel=3)
            query_responses, logprobs = generate_with_full_scores(policy, queries, chunk, pad_token_id,
                                                                  generation_config)
            if not sampling.reshapes:  # the scores were the temperature-scaled logits: TRL's numbers
                return query_responses, logprobs
        # the captured scores went through processors that shape the sampling only: the loss's distribution instead
        return query_responses, teacher_forced_logprobs(policy, query_responses, queries.shape[1], pad_token_id,
                                                        self.settings.temperature, chunk)

    def score(self, rollout: Rollout, steps: ScoringSteps) -> None:
        """Step 3: reference log-probs, values and scores, per chunk of ``local_rollout_forward_batch_size``; then
        the stop token's penalty and the masks."""
        settings = self.settings
        context_length, chunk = rollout.context_length, settings.chunk
        # tools: episodes end where their last turn ended (EOS tokens of earlier turns inside: their lengths come
        # from the episodes, not from the first pad); observations masked
        episodes = rollout.episodes if rollout.observation_mask is not None else None
        postprocessed, ref_logprobs, values, scores, sequence_lengths = [], [], [], [], []
        for i in range(0, rollout.queries.shape[0], chunk):
            query = rollout.queries[i : i + chunk]
            query_response = rollout.query_responses[i : i + chunk]
            response = rollout.responses[i : i + chunk]
            ref_logprobs.append(steps.ref_logprobs(query_response, response, context_length))
            postprocessed_response = response if episodes is not None else steps.postprocess(response)
            postprocessed_query_response = torch.cat((query, postprocessed_response), 1)
            if episodes is None:
                sequence_lengths.append(first_true_indices(postprocessed_response == settings.pad_token_id) - 1)
            values.append(steps.values(query_response, context_length))
            scores.append(steps.scores(postprocessed_query_response, context_length))
            postprocessed.append(postprocessed_response)
        rollout.postprocessed_responses = torch.cat(postprocessed, 0)
        ref_logprobs = torch.cat(ref_logprobs, 0)
        rollout.sequence_lengths = sequence_lengths = (torch.cat(sequence_lengths, 0) if episodes is None
                                                       else episodes.lengths - 1)
        scores = torch.cat(scores, 0)
        if self.reward_scoring is not None:  # reward_funcs: reward models' scores + functions -> weighted score
            scores = self.reward_scoring.finish(rollout, scores)
        values = torch.cat(values, 0)

        # Completions without the stop token (EOS) get `missing_eos_penalty` subtracted from their score.
        rollout.contain_eos_token = (torch.any(rollout.postprocessed_responses == settings.eos_token_id, -1)
                                     if episodes is None else episodes.ends_with_eos)  # tools: the last turn's
        if settings.missing_eos_penalty is not None:
            scores[~rollout.contain_eos_token] -= settings.missing_eos_penalty

        # padding_mask: after the last response token; padding_mask_p1: one later (the value of the EOS state counts)
        responses = rollout.responses
        response_idxs = torch.arange(responses.shape[1], device=responses.device).repeat(responses.shape[0], 1)
        rollout.padding_mask = response_idxs > sequence_lengths.unsqueeze(1)
        padding_mask_p1 = response_idxs > (sequence_lengths + 1).unsqueeze(1)
        if episodes is not None:  # observation tokens are no actions: out of every loss term and of GAE's steps
            rollout.padding_mask = rollout.padding_mask | episodes.observation_mask
            padding_mask_p1 = padding_mask_p1 | episodes.observation_mask
        rollout.logprobs = torch.masked_fill(rollout.logprobs, rollout.padding_mask, INVALID_LOGPROB)
        rollout.ref_logprobs = torch.masked_fill(ref_logprobs, rollout.padding_mask, INVALID_LOGPROB)
        rollout.padding_mask_p1 = padding_mask_p1
        rollout.values = torch.masked_fill(values, rollout.padding_mask_p1, 0)
        rollout.scores = scores

    def submit_chunk(self, start: int, truncated_responses: torch.Tensor) -> None:
        """A generated chunk's truncated responses to the reward workers (scored while the rest generates)."""
        if self.reward_scoring is not None:
            self.reward_scoring.submit(start, truncated_responses)

    def ref_logprobs(self, query_response: torch.Tensor, response: torch.Tensor, context_length: int
                     ) -> torch.Tensor:
        """Log-probs of ``response`` under the reference model (the policy under ``reference_context`` if none)."""
        settings = self.settings
        if self.ref_model is None:
            with self.reference_context():
                return response_logprobs(self.accelerator.unwrap_model(self.model).policy, query_response,
                                         context_length, settings.pad_token_id, settings.temperature)
        return response_logprobs(self.ref_model, query_response, context_length, settings.pad_token_id,
                                 settings.temperature)

    def postprocess(self, responses: torch.Tensor) -> torch.Tensor:
        """Each response cut after its first stop token (the rest padded), if a stop token is set."""
        if self.settings.stop_token_id is not None:  # the edge case of a stop_token_id of 0 included
            return truncate_response(self.settings.stop_token_id, self.settings.pad_token_id, responses)
        return responses

    def values(self, query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """Per-response-token values ``(batch, response_length)`` from the critic (zeros without a value model)."""
        value_model = self.accelerator.unwrap_model(self.model).value_model
        return self.critic.values(value_model, query_response, self.settings.pad_token_id, context_length)

    def scores(self, postprocessed_query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """The reward model's score ``(batch,)`` of each truncated query+response (its head at the last token); with
        ``reward_funcs`` ``(batch, models)``, the reward models' among them (the functions come in :meth:`score`)."""
        if self.reward_scoring is not None:
            return self.reward_scoring.model_scores(postprocessed_query_response, context_length)
        _, score, _ = scalar_model_outputs(self.reward_model, postprocessed_query_response,
                                           self.settings.pad_token_id, context_length)
        return score
