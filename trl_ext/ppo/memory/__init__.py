"""PPO's memory planner, in one package: what a run holds on one device and the largest sizes that fit a target.

* ``budget.py``: the bytes each part of a PPO run holds (persistent, and the rollout, scoring and training phases),
  from the model's shape and the settings, and the CUDA caching allocator's margin over them.
* ``chunk.py``: ``local_rollout_forward_batch_size`` (its value, and ``auto``: the largest rollout chunk whose budget
  fits), the memory target, a run's shape from its loaded models.
* ``micro_batch.py``: ``train_micro_batch_size`` (its value, and ``auto``: the largest micro-batch whose training
  phase fits).

``trl-ext plan`` (:mod:`trl_ext.recipe_loader.plan`) prints a recipe's budget from these; the allocator's setting is
the runtime's (:mod:`trl_ext.runtime.cuda_memory`). How it works: docs/ppo-internals.md#the-memory-planner."""
