"""Sharded engines launched by accelerate (DeepSpeed ZeRO, FSDP), also on machines without a GPU. How it works:
docs/internals.md#engines."""

from __future__ import annotations

import functools
import logging
import os
from contextlib import contextmanager, nullcontext
from functools import cached_property

logger = logging.getLogger(__name__)

DEEPSPEED = "deepspeed"
FSDP = "fsdp"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes")


def launched_engine() -> str | None:
    """The engine `accelerate launch` asked for (``"deepspeed"``, ``"fsdp"``) or None (DDP, one process)."""
    if _env_flag("ACCELERATE_USE_DEEPSPEED"):
        return DEEPSPEED
    if _env_flag("ACCELERATE_USE_FSDP"):
        return FSDP
    return None


def launched_zero3() -> bool:
    """`accelerate launch` asked for DeepSpeed ZeRO-3 (read from the environment, before any accelerate state exists:
    the plugin's zero stage, or the stage in its DeepSpeed config file)."""
    if launched_engine() != DEEPSPEED:
        return False
    stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    if stage is not None:
        return stage.strip() == "3"
    config_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if config_file and os.path.isfile(config_file):
        import json

        try:
            with open(config_file) as f:
                return int(json.load(f).get("zero_optimization", {}).get("stage", 0)) == 3
        except (ValueError, OSError, TypeError, AttributeError):
            return False
    return False


def launched_gradient_clipping() -> tuple[float, str | None]:
    """The gradient clipping DeepSpeed's engine gets from the launch, before trl-ext sets it: ``(value, where)``.
    ``where`` names the setting that fixes it (the launch config's ``gradient_clipping``, accelerate's
    ``ACCELERATE_GRADIENT_CLIPPING``, or the DeepSpeed config file), None when nothing fixes it (accelerate's
    ``auto``, which :func:`deepspeed_gradient_clipping` sets). A config file's ``auto`` is accelerate's 1.0, its
    absence DeepSpeed's 0 (off)."""
    given = os.environ.get("ACCELERATE_GRADIENT_CLIPPING", "auto").strip()
    if given != "auto":
        return float(given), "the accelerate config's gradient_clipping"
    config_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if config_file and os.path.isfile(config_file):
        import json

        with open(config_file) as f:
            value = json.load(f).get("gradient_clipping", 0.0)
        return (1.0 if value == "auto" else float(value)), f"gradient_clipping in {config_file}"
    return 1.0, None


@contextmanager
def deepspeed_gradient_clipping(max_norm: float | None):
    """Within it, a DeepSpeed engine that accelerate builds clips gradients at ``max_norm`` (0 or None: off), unless
    the launch fixes the value (:func:`launched_gradient_clipping`; PPOConfig refuses a different one). Outside
    DeepSpeed, a no-op.

    accelerate fills the plugin's ``gradient_clipping: auto`` with 1.0 when it prepares the engine, and DeepSpeed's
    own default is 1.0 too, so the value is written into the config of the plugin being prepared, right before
    accelerate processes it (``DeepSpeedPlugin.deepspeed_config_process``, wrapped for the duration). The plugin's
    previous value comes back afterwards: accelerate's process-wide state keeps the plugin for later trainers, which
    fill it with their own settings."""
    if launched_engine() != DEEPSPEED or launched_gradient_clipping()[1] is not None:
        yield
        return
    from accelerate.utils import DeepSpeedPlugin

    value = float(max_norm or 0.0)
    original = DeepSpeedPlugin.deepspeed_config_process
    touched: dict[int, tuple[dict, object]] = {}

    @functools.wraps(original)
    def process(self, *args, **kwargs):
        config = self.deepspeed_config
        if id(config) not in touched:
            touched[id(config)] = (config, config.get("gradient_clipping"))
        config["gradient_clipping"] = value
        return original(self, *args, **kwargs)

    DeepSpeedPlugin.deepspeed_config_process = process
    try:
        yield
    finally:
        DeepSpeedPlugin.deepspeed_config_process = original
        for config, old in touched.values():
            if old is None:
                config.pop("gradient_clipping", None)
            else:
                config["gradient_clipping"] = old


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def adapt_to_cpu_engine(args) -> None:
    """Make a launched DeepSpeed or FSDP engine really run when there is no GPU (see the module docstring).

    ``args`` is a ``TrainingArguments`` whose arguments are validated and whose accelerate state is about to be
    created (see :class:`EngineOnCPUArgsMixin`). Without a launched engine, or with a GPU, it does nothing.
    Otherwise: ``ddp_backend`` becomes ``"gloo"`` when unset; for DeepSpeed ``use_cpu`` becomes False (the run still
    runs on the CPU, through DeepSpeed's CPU accelerator; ``bf16`` keeps its meaning: DeepSpeed's bf16 mode); for
    FSDP ``use_cpu`` becomes True and :func:`enable_fsdp_on_cpu` is applied.
    """
    engine = launched_engine()
    if engine is None or _has_gpu():
        return
    if args.ddp_backend is None:
        args.ddp_backend = "gloo"
    args.dataloader_pin_memory = False  # nothing to pin memory for
    if engine == DEEPSPEED:
        args.use_cpu = False  # accelerate ignores DeepSpeed under cpu=True
        skip_deepspeed_shm_op()
    if engine == FSDP:
        args.use_cpu = True  # accelerate's MULTI_CPU processes, which enable_fsdp_on_cpu turns into FSDP ones
        enable_fsdp_on_cpu()
    logger.info("trl-ext: %s on CPU: ddp_backend=%s, use_cpu=%s", engine, args.ddp_backend, args.use_cpu)


def skip_deepspeed_shm_op() -> None:
    """Keep DeepSpeed's CPU backend from building its shared-memory all-reduce op.

    On its first start on a machine, DeepSpeed's ``TorchBackend`` JIT-compiles ``deepspeed_shm_comm`` with the C++
    compiler (about 2 minutes; cached in ``~/.cache/torch_extensions`` afterwards). Only DeepSpeed's inference and
    tensor-parallel all-reduce (``inference_all_reduce``) use that op; ZeRO training reduces through
    ``torch.distributed`` (gloo here). trl-ext trains, so on a machine without a GPU the op is not built
    (``deepspeed.comm.torch.build_shm_op`` returns None, its own answer when the op is not available)."""
    import importlib

    try:  # by module name: the attribute `deepspeed.comm.torch` is the torch package itself
        deepspeed_torch_comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError:  # no DeepSpeed: nothing to build
        return
    deepspeed_torch_comm.build_shm_op = lambda: None


class EngineOnCPUArgsMixin:
    """Mixin for ``TrainingArguments`` subclasses (trl-ext's configs): :func:`adapt_to_cpu_engine` runs right before
    accelerate's state is created (``TrainingArguments._setup_devices``, which ``__post_init__`` calls after
    validating the arguments, so a CPU recipe's ``use_cpu: true`` with ``bf16: true`` still validates)."""

    @cached_property
    def _setup_devices(self):
        adapt_to_cpu_engine(self)
        return super()._setup_devices


def enable_fsdp_on_cpu() -> None:
    """Patch ``accelerate.state.AcceleratorState.__init__`` so that an FSDP plugin is kept on CPU processes.

    accelerate 1.15 sets ``distributed_type = FSDP`` only when the processes are GPU-like (``MULTI_GPU``,
    ``MULTI_XPU``, ...); for ``MULTI_CPU`` it drops the plugin and the model is wrapped in DDP instead. After the
    original ``__init__``, the patch sets what that branch would have set (``distributed_type``, ``fsdp_plugin``),
    only when an FSDP plugin was given and the processes are CPU processes. Idempotent.
    """
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    if getattr(AcceleratorState.__init__, "_trl_ext_fsdp_on_cpu", False):
        return
    original = AcceleratorState.__init__

    @functools.wraps(original)
    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    __init__._trl_ext_fsdp_on_cpu = True
    AcceleratorState.__init__ = __init__


def zero3_enabled(accelerator) -> bool:
    """True when ``accelerator`` runs DeepSpeed ZeRO stage 3 (parameters sharded over the processes)."""
    from accelerate.utils import DistributedType

    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return False
    return accelerator.state.deepspeed_plugin.zero_stage == 3


def gathered_parameters(module, accelerator):
    """Context in which ``module``'s parameters are whole on every process (ZeRO-3 shards them; elsewhere a no-op).

    A collective: every process must enter it. Use it to save a sub-model of a ZeRO-3 engine with
    ``save_pretrained`` (inside the context its ``state_dict()`` holds the full tensors).
    """
    if not zero3_enabled(accelerator):
        return nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None)
