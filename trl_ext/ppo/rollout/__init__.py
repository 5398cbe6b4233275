"""PPO's rollout: sampling the responses and what scoring them needs, one module per part.

* ``containers.py``: ``Rollout`` (one update's episodes, filled by the steps), ``MicroBatchOutput``,
  ``UpdateStats``: what the steps pass along.
* ``steps.py``: the trainer's sampling and scoring steps (``generate_rollouts``, ``score_rollouts``,
  ``compute_ref_logprobs``, ``compute_values``, ``compute_scores``), mixed into ``PPOTrainer``.
* ``logprobs.py``: the sampled tokens' log-probs taken while ``generate`` samples them; the reference pass's logits.
* ``engine.py``: ``rollout_engine``: transformers' continuous batching as the sampler.
* ``sampling.py``: the sampling keys (``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``,
  ``generation_kwargs``) and the generation configs built from them.
* ``decode_graphs.py``: ``rollout_cuda_graphs``: ``generate``'s decoding steps replayed as CUDA graphs over a
  static cache.
* ``chunk.py``: ``local_rollout_forward_batch_size: auto``, the largest chunk whose memory budget fits.
* ``memory_budget.py``: the bytes each part of a PPO run holds, from the model's shape and the settings.
* ``sequences.py``: truncation at the stop token, padded forward passes, ``first_true_indices``.
* ``prompt_stream.py``: the endless, resumable prompt stream.
* ``dynamic_sampling.py``: DAPO's dynamic sampling (``DynamicSampling``): more rounds, informative groups only.
* ``reward_funcs.py``: reward functions in the rollout (``RewardFunctionScoring``), the trainer's side of
  :mod:`trl_ext.rewards`.
"""

from .containers import MicroBatchOutput, Rollout, UpdateStats

__all__ = ["MicroBatchOutput", "Rollout", "UpdateStats"]
