"""Steps 2 and 3 of :class:`trl_ext.PPOTrainer`'s update: sample the responses and score them (reference log-probs,
values, truncation at the stop token, scores, padding masks). Each is a method of the trainer, overridable one at a
time (the list of steps: :mod:`trl_ext.ppo.trainer`)."""

from __future__ import annotations

import copy
import warnings

import torch

from ...models.scalar_heads import scalar_model_outputs
from ...trl_internals import unwrap_model_for_generation
from .containers import Rollout
from .engine import teacher_forced_logprobs
from .logprobs import generate_with_full_scores, generate_with_logprobs, response_logprobs, sampling_plan
from .sampling import reshapes_sampling
from .sequences import INVALID_LOGPROB, first_true_indices, truncate_response

__all__ = ["RolloutStepsMixin"]


class RolloutStepsMixin:
    """The rollout and scoring steps of :class:`trl_ext.PPOTrainer` (each overridable in a subclass)."""

    def generate_rollouts(self, queries: torch.Tensor) -> Rollout:
        """Sample one response per query with the policy (its sampling keys: :mod:`trl_ext.ppo.rollout.sampling`);
        keep their log-probs under the temperature-scaled full distribution (the loss's; not the top-k/top-p/min-p
        truncated one).

        The log-probs are taken as the tokens are sampled (:mod:`trl_ext.ppo.rollout.logprobs`): peak memory holds
        one step's `(batch, vocab)` scores, not TRL's `(batch, response_length, vocab)` tensor; the numbers are
        TRL's. Generation configs that module cannot rebuild keep TRL's path (with a one-time warning). With
        ``tools`` the response is a multi-turn episode (:mod:`trl_ext.ppo.episodes.multi_turn`), each turn sampled
        by :meth:`sample_turn` (the first one exactly as without tools).
        """
        args = self.args
        context_length = queries.shape[1]
        episodes = None
        with unwrap_model_for_generation(
            self.model,
            self.accelerator,
            gather_deepspeed3_params=args.ds3_gather_for_generation,
            generation_kwargs=self.generation_kwargs,  # fixes transformers#42762, as TRL does
        ) as unwrapped_model:
            policy = unwrapped_model.policy
            if self.multi_turn is not None:  # tools: turns until no tool call; episodes scored once complete
                query_responses, logprobs, episodes = self.multi_turn.run(
                    queries, lambda prefixes, max_new_tokens: self.sample_turn(policy, prefixes, max_new_tokens))
            else:
                query_responses, logprobs = self.sample_turn(policy, queries, args.response_length,
                                                             on_chunk=self.submit_rollout_chunk)
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

    def sample_turn(self, policy, queries: torch.Tensor, max_new_tokens: int, on_chunk=None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample at most ``max_new_tokens`` tokens after each left-padded query: ``(query_responses, logprobs)``
        (the continuous-batching engine, else ``generate`` with the log-probs taken as sampled, else TRL's path).
        The log-probs are ``log_softmax(logits / temperature)``'s; where the sampled scores went through other
        processors first (``generation_kwargs``'), or TRL's path sampled with the sampling keys, one teacher-forced
        forward recomputes them.
        ``on_chunk(start, responses)``: called as each chunk (engine: each row) is done."""
        generation_config = self.generation_config
        if self.rollout_engine is not None:  # continuous batching (trl_ext.ppo.rollout.engine)
            return self.rollout_engine.generate(self, policy, queries, max_new_tokens, on_finished=on_chunk)
        if max_new_tokens != generation_config.max_new_tokens:  # a later turn of an episode: the tokens left
            generation_config = copy.deepcopy(generation_config)
            generation_config.max_new_tokens = max_new_tokens
        plan = sampling_plan(policy, generation_config)
        pad_token_id, chunk = self.processing_class.pad_token_id, self.args.local_rollout_forward_batch_size
        if plan is not None:
            query_responses, logprobs = generate_with_logprobs(policy, queries, chunk, pad_token_id, plan,
                                                               on_chunk=on_chunk, decode_graphs=self.decode_graphs)
            if plan.logprobs_exact:
                return query_responses, logprobs
        else:
            warnings.warn("generate_rollouts: sampling config not rebuilt; keeping TRL's path", stacklevel=2)
            query_responses, logprobs = generate_with_full_scores(policy, queries, chunk, pad_token_id,
                                                                  generation_config)
            if not reshapes_sampling(self.args):  # the scores were the temperature-scaled logits: TRL's numbers
                return query_responses, logprobs
        # the captured scores went through processors that shape the sampling only: the loss's distribution instead
        return query_responses, teacher_forced_logprobs(policy, query_responses, queries.shape[1], pad_token_id,
                                                        self.args.temperature, chunk)

    def score_rollouts(self, rollout: Rollout) -> None:
        """Reference log-probs, values and scores, per chunk of `local_rollout_forward_batch_size`; then masks."""
        args = self.args
        pad_token_id = self.processing_class.pad_token_id
        context_length = rollout.context_length
        chunk = args.local_rollout_forward_batch_size
        # tools: episodes end where their last turn ended (EOS tokens of earlier turns inside: their lengths come
        # from the episodes, not from the first pad); observations masked
        episodes = rollout.episodes if rollout.observation_mask is not None else None
        postprocessed, ref_logprobs, values, scores, sequence_lengths = [], [], [], [], []
        for i in range(0, rollout.queries.shape[0], chunk):
            query = rollout.queries[i : i + chunk]
            query_response = rollout.query_responses[i : i + chunk]
            response = rollout.responses[i : i + chunk]
            ref_logprobs.append(self.compute_ref_logprobs(query_response, response, context_length))
            postprocessed_response = response if episodes is not None else self.postprocess_responses(response)
            postprocessed_query_response = torch.cat((query, postprocessed_response), 1)
            if episodes is None:
                sequence_lengths.append(first_true_indices(postprocessed_response == pad_token_id) - 1)
            values.append(self.compute_values(query_response, context_length))
            scores.append(self.compute_scores(postprocessed_query_response, context_length))
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
        rollout.contain_eos_token = (torch.any(rollout.postprocessed_responses == self.processing_class.eos_token_id, -1)
                                     if episodes is None else episodes.ends_with_eos)  # tools: the last turn's
        if args.missing_eos_penalty is not None:
            scores[~rollout.contain_eos_token] -= args.missing_eos_penalty

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

    def submit_rollout_chunk(self, start: int, responses: torch.Tensor) -> None:
        """Right after a chunk (or a continuous-batching row) is generated: with reward functions in workers, its
        truncated responses go to them, scored while the rest generates."""
        if self.reward_scoring is not None:
            self.reward_scoring.submit(start, self.postprocess_responses(responses))

    @property
    def reward_scorer(self):
        """The :class:`~trl_ext.rewards.scoring.RewardScorer` of `reward_funcs` (None without)."""
        return None if self.reward_scoring is None else self.reward_scoring.scorer

    def compute_ref_logprobs(
        self, query_response: torch.Tensor, response: torch.Tensor, context_length: int
    ) -> torch.Tensor:
        """Log-probs of `response` under the reference model (the LoRA policy with adapters off if none given)."""
        pad_token_id = self.processing_class.pad_token_id
        if self.ref_model is None:
            with self.null_ref_context():
                return response_logprobs(self.accelerator.unwrap_model(self.model).policy, query_response,
                                         context_length, pad_token_id, self.args.temperature)
        return response_logprobs(self.ref_model, query_response, context_length, pad_token_id,
                                 self.args.temperature)

    def postprocess_responses(self, responses: torch.Tensor) -> torch.Tensor:
        """Truncate each response after the first stop token (pad the rest), if a stop token is set."""
        if self.stop_token_id is not None:  # handle the edge case when stop_token_id exists but is 0
            return truncate_response(self.stop_token_id, self.processing_class.pad_token_id, responses)
        return responses

    def compute_values(self, query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """Per-response-token values `(batch, response_length)` from the run's critic (``self.critic``): the value
        model's (plain or PEFT), or zeros without a critic."""
        value_model = self.accelerator.unwrap_model(self.model).value_model
        return self.critic.values(value_model, query_response, self.processing_class.pad_token_id, context_length)

    def compute_scores(self, postprocessed_query_response: torch.Tensor, context_length: int) -> torch.Tensor:
        """Reward-model score `(batch,)` of each (truncated) query+response: the head's output at its last token.
        With `reward_funcs`: `(batch, models)`, the scores of the reward models among them (functions come later)."""
        if self.reward_scoring is not None:
            return self.reward_scoring.model_scores(postprocessed_query_response, context_length)
        _, score, _ = scalar_model_outputs(
            self.reward_model, postprocessed_query_response, self.processing_class.pad_token_id, context_length
        )
        return score
