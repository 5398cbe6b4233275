"""What trl-ext sets when accelerate launches DeepSpeed or FSDP on a machine without a GPU, and the combinations it
refuses under an engine (in one process: no launch)."""

from types import SimpleNamespace

import pytest

from trl_ext.errors import UserInputError
from trl_ext.runtime import engines

pytestmark = pytest.mark.engines


def cpu_recipe_args():
    """The fields adapt_to_cpu_engine reads and writes, as a CPU recipe (use_cpu: true) sets them."""
    return SimpleNamespace(ddp_backend=None, use_cpu=True, dataloader_pin_memory=True)


@pytest.fixture
def no_engine(monkeypatch):
    for var in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_nothing_changes_without_an_engine(no_engine):
    args = cpu_recipe_args()
    engines.adapt_to_cpu_engine(args)
    assert engines.launched_engine() is None
    assert vars(args) == vars(cpu_recipe_args())


def test_deepspeed_on_cpu_gets_gloo_and_accelerate_cpu_mode_off(no_engine):
    import importlib

    deepspeed_torch_comm = importlib.import_module("deepspeed.comm.torch")

    no_engine.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    no_engine.setattr(deepspeed_torch_comm, "build_shm_op", deepspeed_torch_comm.build_shm_op)  # restored after
    args = cpu_recipe_args()
    engines.adapt_to_cpu_engine(args)
    assert (args.ddp_backend, args.use_cpu, args.dataloader_pin_memory) == ("gloo", False, False)
    assert deepspeed_torch_comm.build_shm_op() is None  # the inference-only op is not compiled (~2 min)
    args = SimpleNamespace(ddp_backend="mpi", use_cpu=True, dataloader_pin_memory=True)
    engines.adapt_to_cpu_engine(args)
    assert args.ddp_backend == "mpi"  # a backend the user chose stays


def test_fsdp_on_cpu_keeps_the_fsdp_plugin(no_engine):
    from accelerate.state import AcceleratorState

    no_engine.setenv("ACCELERATE_USE_FSDP", "true")
    args = SimpleNamespace(ddp_backend=None, use_cpu=False, dataloader_pin_memory=True)
    engines.adapt_to_cpu_engine(args)
    assert (args.ddp_backend, args.use_cpu) == ("gloo", True)
    assert getattr(AcceleratorState.__init__, "_trl_ext_fsdp_on_cpu", False)
    patched = AcceleratorState.__init__
    engines.enable_fsdp_on_cpu()
    assert AcceleratorState.__init__ is patched  # idempotent


def test_gpu_machines_are_left_alone(no_engine, monkeypatch):
    no_engine.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setattr(engines, "_has_gpu", lambda: True)
    args = cpu_recipe_args()
    engines.adapt_to_cpu_engine(args)
    assert vars(args) == vars(cpu_recipe_args())


def test_configs_adapt_when_accelerate_state_is_created(no_engine, monkeypatch, tmp_path):
    """The configs call adapt_to_cpu_engine from `_setup_devices`, after validation: a CPU recipe's use_cpu with
    bf16 (which TRL's configs default to) validates, then DeepSpeed gets use_cpu=False."""
    from trl_ext import DPOConfig, RewardConfig

    seen = []
    monkeypatch.setattr(engines, "adapt_to_cpu_engine", lambda args: seen.append(type(args).__name__))
    for cls in (RewardConfig, DPOConfig):
        cls(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert seen == ["RewardConfig", "DPOConfig"]


def test_ppo_is_refused_under_fsdp_before_anything_loads(no_engine, tmp_path):
    from trl_ext import PPOConfig

    no_engine.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(UserInputError, match="PPO does not run under FSDP.*zero2.yaml or zero3.yaml"):
        PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")


def test_separate_ptx_is_refused_under_deepspeed(no_engine, tmp_path):
    from trl_ext import PPOConfig

    no_engine.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(UserInputError, match="ptx_mode: 'separate' is not supported under DeepSpeed.*'joint'"):
        PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", ptx_coef=0.1, ptx_mode="separate")


def test_max_grad_norm_sets_deepspeeds_clipping_unless_the_launch_fixes_it(no_engine, tmp_path):
    """DeepSpeed's engine clips the gradients: without a value in the launch config, the engine accelerate builds
    inside `deepspeed_gradient_clipping` gets max_grad_norm (0: off); a launch config's other value is refused."""
    import json

    from accelerate.utils import DeepSpeedPlugin

    from trl_ext import PPOConfig

    no_engine.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    for var in ("ACCELERATE_GRADIENT_CLIPPING", "ACCELERATE_DEEPSPEED_CONFIG_FILE"):
        no_engine.delenv(var, raising=False)
    assert engines.launched_gradient_clipping() == (1.0, None)  # accelerate's "auto": trl-ext sets it
    plugin = DeepSpeedPlugin(zero_stage=2)
    assert plugin.deepspeed_config["gradient_clipping"] == "auto"  # accelerate would fill 1.0 (DeepSpeed's default)
    for max_norm in (0.25, 0.0):
        with engines.deepspeed_gradient_clipping(max_norm):  # accelerate prepares the engine in there
            plugin.deepspeed_config_process(must_match=False, gradient_clipping=1.0, train_batch_size=4,
                                            train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=1)
            assert plugin.deepspeed_config["gradient_clipping"] == max_norm  # 0.0 written: DeepSpeed's default is 1
        assert plugin.deepspeed_config["gradient_clipping"] == "auto"  # restored for a later trainer
        plugin = DeepSpeedPlugin(zero_stage=2)  # the batch keys were filled: a fresh plugin for the next value
    no_engine.setenv("ACCELERATE_GRADIENT_CLIPPING", "0.5")  # accelerate launch's `gradient_clipping: 0.5`
    with pytest.raises(UserInputError, match=r"^max_grad_norm: 1.0 but the accelerate config's gradient_clipping "
                                             r"is 0.5"):
        PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    no_engine.delenv("ACCELERATE_GRADIENT_CLIPPING")
    config_file = tmp_path / "ds.json"
    config_file.write_text(json.dumps({"gradient_clipping": "auto", "zero_optimization": {"stage": 2}}))
    no_engine.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", str(config_file))
    assert engines.launched_gradient_clipping() == (1.0, f"gradient_clipping in {config_file}")  # accelerate's 1.0
    with pytest.raises(UserInputError, match=r"^max_grad_norm: 0.0 but gradient_clipping in .*ds.json is 1.0"):
        PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_grad_norm=0.0)
