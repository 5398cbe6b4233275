"""What :class:`trl_ext.PPOTrainer` changes in its parent (TRL's PPO trainer or trl-ext's copy, :mod:`trl_ext.ppo.base`)
so that it runs where the parent crashed or did not fit: DDP and DeepSpeed wrappers, a shared base, a critic-free
run (:class:`PPOParent`, the parent with these fixes, which ``PPOTrainer`` extends), and the config as the parent's
``__init__`` reads it (:class:`ParentInitArgs`). No step of the update is here (see :mod:`trl_ext.ppo.trainer`)."""

from __future__ import annotations

from contextlib import contextmanager, nullcontext

from ...models.shared_base import adapter_switch, saving_policy_adapters_only, scalar_adapter_names
from ...runtime.engines import deepspeed_gradient_clipping, gathered_parameters
from . import ParentPPOTrainer

__all__ = ["PPOParent", "ParentInitArgs"]


class ParentInitArgs:
    """The config as the parent's ``__init__`` reads it (:class:`trl_ext.PPOTrainer` passes this view and keeps the
    config itself): every attribute is the config's, read and written through, but ``kl_estimator``, which the
    parent's ``__init__`` checks against the two estimators it knows (TRL 1.12: ``k1``, ``k3``) and none of its later
    steps reads (trl-ext's update takes the estimator from its objective): ``"k1"`` there."""

    def __init__(self, args):
        object.__setattr__(self, "_args", args)

    def __getattr__(self, name):
        return "k1" if name == "kl_estimator" else getattr(self._args, name)

    def __setattr__(self, name, value):
        setattr(self._args, name, value)


class PPOParent(ParentPPOTrainer):
    """The parent trainer (:mod:`trl_ext.ppo.base` chooses it) with its methods fixed: what
    :class:`trl_ext.PPOTrainer` extends."""

    # HF Trainer.__init__ (which TRL's PPO never calls) sets these; its checkpoint save/load code reads them
    is_fsdp_xla_enabled = is_fsdp_xla_v1_enabled = is_fsdp_xla_v2_enabled = False

    def __init__(self, args, **kwargs):
        """The parent's ``__init__`` on its view of ``args`` (:class:`ParentInitArgs`), a DeepSpeed engine it
        prepares clipping at ``args.max_grad_norm`` (:func:`~trl_ext.runtime.engines.deepspeed_gradient_clipping`);
        ``self.args`` is ``args`` after it."""
        with deepspeed_gradient_clipping(args.max_grad_norm):
            super().__init__(args=ParentInitArgs(args), **kwargs)
        self.args = args

    @contextmanager
    def null_ref_context(self):
        """Reference = the policy with its adapters disabled (or `ref_adapter_name` active).

        TRL looks up `self.model.policy`, which a DistributedDataParallel wrapper does not have; we unwrap first.
        """
        policy = self.accelerator.unwrap_model(self.model).policy
        if scalar_adapter_names(policy):
            # Shared base: peft's disable_adapter/set_adapter would set requires_grad=False on the value adapter.
            with adapter_switch(policy).use(self.ref_adapter_name):
                yield
            return
        with policy.disable_adapter() if self.is_peft_model and not self.ref_adapter_name else nullcontext():
            if self.ref_adapter_name:
                policy.set_adapter(self.ref_adapter_name)
            yield
            if self.ref_adapter_name:
                policy.set_adapter(self.model_adapter_name or "default")

    # TRL's PPOTrainer skips transformers.Trainer.__init__, which sets this; transformers 5's `_save` reads it on
    # ranks that do not save (crash under several processes without it).
    is_distributed_loading_by_transformers = False

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        """Save the policy only (TRL's behaviour), also when the model is wrapped in DistributedDataParallel or a
        DeepSpeed engine. With a shared base, the policy's adapter only (the value adapter is saved with the value
        model).

        Under DeepSpeed TRL's own `save_model` crashes (`'LlamaConfig' object has no attribute 'get'`: it hands the
        policy to transformers as if it were the engine); here the policy is saved with `save_pretrained` like under
        DDP, its parameters gathered first under ZeRO-3 (every process takes part). Called on every process. (A
        shared base is refused under DeepSpeed, so this branch never meets one.)
        """
        backup = self.model
        if self.is_deepspeed_enabled:
            policy = self.accelerator.unwrap_model(self.model).policy
            self.model = policy
            try:
                with gathered_parameters(policy, self.accelerator):
                    self._save(output_dir if output_dir is not None else self.args.output_dir)
            finally:
                self.model = backup
            return
        self.model = self.accelerator.unwrap_model(self.model)
        try:
            with saving_policy_adapters_only(self.accelerator.unwrap_model(backup).policy):
                super().save_model(output_dir, _internal_call)
        finally:
            self.model = backup

    def create_optimizer(self):
        """HF's optimizer; under DeepSpeed without its empty parameter group. A LoRA policy without a value model
        (critic-free) has no parameter without weight decay: DeepSpeed drops that empty group from the optimizer,
        and the LR scheduler, built on both groups, then failed at its first step."""
        optimizer = super().create_optimizer()
        if self.accelerator.state.deepspeed_plugin is not None:  # (is_deepspeed_enabled is set after this)
            optimizer.param_groups[:] = [group for group in optimizer.param_groups if group["params"]]
        return optimizer

    def generate_completions(self, sampling: bool = False):
        """TRL's sample generations, scored by the reward model; skipped in a run without one (warned at init)."""
        if self.reward_model is not None:
            super().generate_completions(sampling=sampling)

    def create_model_card(self, *args, **kwargs):
        """TRL's model card (written with each checkpoint), also when the model is wrapped in DistributedDataParallel
        (TRL reads `self.model.config`, which the wrapper does not have: checkpoints crashed under DDP)."""
        backup = self.model
        self.model = self.accelerator.unwrap_model(self.model)
        try:
            return super().create_model_card(*args, **kwargs)
        finally:
            self.model = backup
