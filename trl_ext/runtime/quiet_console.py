"""A quiet console for ``trl-ext`` commands: the known, harmless messages of third-party libraries that trl-ext's own
calls trigger are kept off it (``--verbose`` shows them), and DeepSpeed is not imported by a run that does not use it.

* :data:`KNOWN_WARNINGS`: each filter names the warning's message, its category AND the module that raises it, so
  that no other warning is hidden (Python's ``warnings.filterwarnings``; never a blanket ``ignore``).
* :func:`avoid_idle_deepspeed_import`: accelerate's ``unwrap_model`` (called by TRL and transformers on every
  generation and save) runs ``from deepspeed import DeepSpeedEngine`` whenever DeepSpeed is *installed*, only to test
  whether the model is wrapped in one; importing DeepSpeed prints its ``Setting accelerator to CPU`` line and takes
  seconds. A model can only be a ``DeepSpeedEngine`` once ``deepspeed`` has been imported (a DeepSpeed launch imports
  it when accelerate prepares the engine), so the check is narrowed to "installed and already imported".
* DeepSpeed's own ``Setting accelerator to CPU`` line (a DeepSpeed run on a CPU, e.g. the engine tests) is dropped by
  a filter on its logger that matches that message only.
"""

from __future__ import annotations

import logging
import sys
import warnings

__all__ = ["KNOWN_WARNINGS", "avoid_idle_deepspeed_import", "quiet_console"]

#: (message regex, category, module regex) of third-party warnings that trl-ext's own calls trigger and that say
#: nothing the user can act on.
KNOWN_WARNINGS = [
    # transformers 5 deprecates `gradient_checkpointing`, which TRL 1.12's configs set by default: not the user's.
    (r"`gradient_checkpointing` is deprecated", FutureWarning, r"transformers\.training_args"),
    # transformers 5.23 renamed the activation-checkpointing API; TRL's generation context (unwrap_model_for_generation)
    # and TRL 1.12's PPO wrapper still call the old names.
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\.modeling_utils"),
    (r"`gradient_checkpointing_(enable|disable)` is deprecated", FutureWarning, r"transformers\.modeling_utils"),
    # peft, saving a LoRA adapter whose base has a tied or targeted embedding: it saves the embedding, as it should.
    (r"Setting `save_embedding_layers` to `True`", UserWarning, r"peft\.utils\.save_and_load"),
    # peft asks the Hub whether a local tiny base exists (offline: it cannot tell, and assumes an unchanged vocabulary).
    (r"Could not find a config file in .* will assume that the vocabulary was not modified", UserWarning,
     r"peft\.utils\.save_and_load"),
]

_DEEPSPEED_CPU_LINE = "Setting accelerator to CPU"


class _DropDeepSpeedCpuLine(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_DEEPSPEED_CPU_LINE)


def avoid_idle_deepspeed_import() -> None:
    """Make accelerate's ``extract_model_from_parallel`` (behind ``Accelerator.unwrap_model``) look for DeepSpeed's
    engine class only once ``deepspeed`` is imported (see the module docstring); a no-op without accelerate."""
    try:
        import accelerate.utils.other as other
    except ImportError:  # pragma: no cover - accelerate is a dependency of TRL
        return
    available = getattr(other, "is_deepspeed_available", None)
    if available is None or getattr(available, "_trl_ext_narrowed", False):
        return

    def is_deepspeed_available() -> bool:
        return "deepspeed" in sys.modules and available()

    is_deepspeed_available._trl_ext_narrowed = True
    other.is_deepspeed_available = is_deepspeed_available


def quiet_console(verbose: bool = False) -> None:
    """Apply the filters above (nothing when ``verbose``) and avoid the idle DeepSpeed import (always)."""
    avoid_idle_deepspeed_import()
    if verbose:
        return
    for message, category, module in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    # bitsandbytes logs a warning at import on AVX512-BF16 CPUs (an optional hub kernel it cannot fetch). trl-ext
    # avoids that code path for training anyway (trl_ext.models.quantization).
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    ds_logger = logging.getLogger("DeepSpeed")  # the logger DeepSpeed creates under this name (deepspeed.utils)
    if not any(isinstance(f, _DropDeepSpeedCpuLine) for f in ds_logger.filters):
        ds_logger.addFilter(_DropDeepSpeedCpuLine())
