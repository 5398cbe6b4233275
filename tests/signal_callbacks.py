"""A training callback that sends this process a signal, as a scheduler or a Ctrl-C would (interruption tests)."""

import signal

from transformers import TrainerCallback


class SendSignalAfterStep(TrainerCallback):
    """Send `signum` to this process at the end of training step (PPO: update) `step`. signal.raise_signal, not
    os.kill: the handler has recorded the signal when the callback returns, so the step that sees it is `step`."""

    def __init__(self, signum, step):
        self.signum, self.step = signum, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            signal.raise_signal(self.signum)
