"""Reward functions beside (or instead of) a reward model (issue 25).

* ``pool.py``: :class:`RewardWorkerPool`, worker processes that run slow reward functions (code execution, math
  checkers) with a per-call timeout; a call that hangs, raises or kills its worker is reported, not fatal.
* ``remote.py``: :class:`RemoteReward`, a reward function that POSTs to an HTTP verifier (OpenRLHF's remote
  reward contract: ``{"query", "prompts", "labels"}`` in, ``{"rewards"}`` out).

Nothing heavy is imported here: import the module you need.
"""
