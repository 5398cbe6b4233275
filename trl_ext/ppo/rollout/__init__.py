"""PPO's rollout: sampling the responses and what scoring them needs, one module per part. How it works:
docs/ppo-internals.md#the-rollout-package."""

from .containers import MicroBatchOutput, Rollout, UpdateStats

__all__ = ["MicroBatchOutput", "Rollout", "UpdateStats"]
