"""A training callback that sends this process a signal, as a scheduler or a Ctrl-C would (interruption tests)."""

import os

from transformers import TrainerCallback


class SendSignalAfterStep(TrainerCallback):
    """Send `signum` to this process at the end of training step (PPO: update) `step`."""

    def __init__(self, signum, step):
        self.signum, self.step = signum, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            os.kill(os.getpid(), self.signum)
