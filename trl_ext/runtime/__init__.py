"""What all three trainers share that is neither math nor model loading: keeping a run safe and resumable.

* ``checkpoints.py``: atomic checkpoints (written under ``tmp-checkpoint-N``, then renamed), finding the latest
  complete one, loading weights back in place.
* ``interruption.py``: SIGINT/SIGTERM stop training at the next safe point with a checkpoint
  (:class:`~trl_ext.runtime.interruption.TrainingInterrupted`).
* ``nonfinite.py``: the NaN/inf guard, checked once per optimizer step (one host synchronisation), and the
  ``nonfinite_policy``: stop with a clear error (:class:`~trl_ext.runtime.nonfinite.NonFiniteError`) after saving
  the last good state, or skip the step (no optimizer or scheduler step, counted and logged).
* ``epoch_stream.py``: endless, resumable iteration over a DataLoader (the base of PPO's prompt and ptx streams).
* ``devices.py``: ``empty_cache`` of the current accelerator (PPO calls it between phases) and ``release_memory``
  (``gc.collect`` + ``empty_cache`` once per PPO update, on accelerators only).
* ``engines.py``: DeepSpeed ZeRO and FSDP launched by accelerate on machines without a GPU (what accelerate 1.15
  leaves out there), and gathering ZeRO-3 shards to save a sub-model.

The trainers in :mod:`trl_ext.ppo`, :mod:`trl_ext.preference` and :mod:`trl_ext.sft` mix these in; nothing here
imports them.
"""
