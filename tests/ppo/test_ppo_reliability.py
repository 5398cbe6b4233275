"""PPO reliability: resume reproduces the run, atomic checkpoints, SIGTERM saves and resumes, NaN guards, clipping."""

from __future__ import annotations

import json
import shutil
import signal

import pytest
import torch
from transformers import TrainerCallback

from ppo_helpers import config_kwargs, load_models, ptx_dataset, seed_all, update_logs
from signal_callbacks import SendSignalAfterStep

EXCLUDED_PREFIXES = ("eps", "time/")  # wall clock
N_UPDATES = 5  # 8 prompts, 4 per update: an epoch is 2 updates, so resumes land mid-epoch and at an epoch's end


def lora_config():
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])


@pytest.fixture(scope="module", autouse=True)
def _shared_adapter(reward_adapter):
    """The reward adapter on the tiny policy's base that the `shared` variant loads (see make_trainer)."""
    SHARED["adapter"] = reward_adapter


SHARED = {}


def make_trainer(tiny_models, tok, data, out, variant, trainer_cls=None, callbacks=None, reward_model=None,
                 **overrides):
    """Adaptive KL and joint ptx on; `full` has its own reference model, `lora` a LoRA policy (reference = adapters
    off), `shared` a LoRA policy whose base also carries the reward and value models as adapters, `critic_free` the
    same with GRPO (2 samples per prompt, KL in the loss) and no value adapter. The same seed every time, so two
    trainers made alike start alike."""
    import trl_ext

    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    ref = load_models(tiny_models)[0] if variant == "full" else None
    if variant in ("shared", "critic_free"):
        from peft import get_peft_model

        from trl_ext.models.shared_base import add_scalar_adapter

        policy = get_peft_model(policy, lora_config())
        reward = add_scalar_adapter(policy, "reward", source=SHARED["adapter"], trainable=False)
        value = add_scalar_adapter(policy, "value", source=SHARED["adapter"], trainable=True)
    kwargs = dict(total_episodes=4 * N_UPDATES, kl_controller="adaptive", kl_target=0.01, kl_horizon=8,
                  ptx_coef=0.5, ptx_max_length=16)
    if variant == "critic_free":
        value = None
        kwargs.update(advantage_estimator="grpo", num_samples_per_prompt=2)
    kwargs.update(overrides)
    return (trainer_cls or trl_ext.PPOTrainer)(
        args=trl_ext.PPOConfig(**config_kwargs(out, **kwargs)), processing_class=tok, model=policy, ref_model=ref,
        reward_model=reward_model if reward_model is not None else reward, train_dataset=data[0], value_model=value,
        eval_dataset=data[1], peft_config=lora_config() if variant == "lora" else None,
        ptx_dataset=ptx_dataset() if kwargs["ptx_coef"] > 0 else None,
        callbacks=callbacks,
    )


def trainable_weights(trainer):
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def assert_same_updates(reference: list[dict], resumed: list[dict], first_step: int):
    """`resumed` holds the updates from `first_step` on, with the same numbers as `reference` (to 1e-5)."""
    expected = [e for e in reference if e["step"] >= first_step]
    got = [e for e in resumed if e["step"] >= first_step]
    assert [e["step"] for e in got] == [e["step"] for e in expected] == list(range(first_step, N_UPDATES + 1))
    for ref, new in zip(expected, got):
        for key, value in ref.items():
            if key.startswith(EXCLUDED_PREFIXES):
                continue
            assert new[key] == pytest.approx(value, abs=1e-5, rel=1e-5), (ref["step"], key)


@pytest.fixture(scope="module")
def reference_runs(tiny_models, tok, data, tmp_path_factory):
    """Uninterrupted runs of N_UPDATES updates, with checkpoints, for a full and a LoRA policy."""
    runs = {}
    for variant, save in (("full", dict(save_steps=3)), ("lora", dict(save_steps=2, save_total_limit=2)),
                          ("shared", dict(save_steps=2, save_total_limit=2)), ("critic_free", dict(save_steps=2))):
        out = tmp_path_factory.mktemp(f"reference_{variant}")
        trainer = make_trainer(tiny_models, tok, data, out, variant, save_strategy="steps", **save)
        trainer.train()
        runs[variant] = (out, update_logs(trainer), trainable_weights(trainer))
    return runs


@pytest.mark.parametrize("variant, checkpoint_step", [("full", 3), ("lora", 4), ("shared", 4), ("critic_free", 2)])
def test_resumed_run_logs_the_same_numbers(tiny_models, tok, data, tmp_path, reference_runs, variant,
                                           checkpoint_step):
    ref_dir, ref_logs, ref_weights = reference_runs[variant]
    # the reference run's metrics really move: the KL coefficient adapts and ptx is on
    assert len({e["objective/kl_coef"] for e in ref_logs}) == N_UPDATES
    assert all("loss/ptx_avg" in e for e in ref_logs)
    # a fresh output dir holding the checkpoint, plus what an interrupted save leaves behind
    shutil.copytree(ref_dir / f"checkpoint-{checkpoint_step}", tmp_path / f"checkpoint-{checkpoint_step}")
    (tmp_path / f"tmp-checkpoint-{checkpoint_step + 1}" / f"checkpoint-{checkpoint_step + 1}").mkdir(parents=True)
    (tmp_path / "checkpoint-99").mkdir()  # no trainer_state.json: not a complete checkpoint
    resumed = make_trainer(tiny_models, tok, data, tmp_path, variant, save_strategy="no")
    resumed.train(resume_from_checkpoint=True)
    logs = update_logs(resumed)
    assert [e["step"] for e in logs] == list(range(1, N_UPDATES + 1))  # log history continues the checkpoint's
    assert_same_updates(ref_logs, logs, checkpoint_step + 1)
    assert resumed.state.global_step == N_UPDATES and resumed.state.episode == 4 * N_UPDATES
    for name, value in trainable_weights(resumed).items():
        torch.testing.assert_close(value, ref_weights[name], atol=1e-5, rtol=1e-5)


def test_checkpoints_are_complete_and_rotated(reference_runs):
    full_dir, lora_dir = reference_runs["full"][0], reference_runs["lora"][0]
    assert sorted(p.name for p in full_dir.iterdir() if "checkpoint" in p.name) == ["checkpoint-3", "checkpoint-5"]
    # save_total_limit=2 keeps the two latest of checkpoint-2, -4, -5; no staging folders left behind
    assert sorted(p.name for p in lora_dir.iterdir() if "checkpoint" in p.name) == ["checkpoint-4", "checkpoint-5"]
    full, lora = full_dir / "checkpoint-3", lora_dir / "checkpoint-4"
    for checkpoint in (full, lora):
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trl_ext_ppo_state_0.pt",
                     "value_model/model.safetensors"):
            assert (checkpoint / name).is_file(), (checkpoint, name)
    assert (full / "model.safetensors").is_file() and (lora / "adapter_model.safetensors").is_file()
    state = json.loads((full / "trainer_state.json").read_text())
    assert state["global_step"] == 3 and state["episode"] == 12
    extra = torch.load(full / "trl_ext_ppo_state_0.pt", weights_only=True)
    assert extra["prompt_stream"]["epoch"] == 1 and extra["prompt_stream"]["batches_in_epoch"] == 1
    assert extra["kl_controller"]["value"] == pytest.approx(reference_runs["full"][1][3]["objective/kl_coef"])
    assert extra["ptx_stream"] == {"epoch": 1, "batches_in_epoch": 4}  # 16 texts, 2 per batch, 4 per update
    # shared base: the policy's adapter alone at the top (no reward/ or value/ adapter folders), the value model's
    # adapter and head in value_model/ (the LoRA reward format), nothing of the frozen reward adapter
    shared = reference_runs["shared"][0] / "checkpoint-4"
    assert not (shared / "reward").exists() and not (shared / "value").exists()
    assert json.loads((shared / "adapter_config.json").read_text())["task_type"] != "SEQ_CLS"  # the policy's
    value_config = json.loads((shared / "value_model" / "adapter_config.json").read_text())
    assert value_config["task_type"] == "SEQ_CLS" and value_config["modules_to_save"] == ["score"]
    from safetensors import safe_open

    with safe_open(shared / "value_model" / "adapter_model.safetensors", "pt") as f:
        assert "base_model.model.score.weight" in set(f.keys())
    # critic-free: the policy's adapter, no value model, and the 2 prompts per update in the prompt stream's position
    critic_free = reference_runs["critic_free"][0] / "checkpoint-2"
    assert (critic_free / "adapter_model.safetensors").is_file() and not (critic_free / "value_model").exists()
    extra = torch.load(critic_free / "trl_ext_ppo_state_0.pt", weights_only=True)
    assert extra["prompt_stream"]["batches_in_epoch"] == 2  # 8 prompts, 2 per update: an epoch is 4 updates
    assert all("loss/kl_avg" in e and "val/ratio" not in e for e in reference_runs["critic_free"][1])


@pytest.mark.parametrize("variant", ["full", "shared", "critic_free"])
def test_sigterm_saves_a_checkpoint_that_resumes(tiny_models, tok, data, tmp_path, reference_runs, variant):
    from trl_ext.runtime.interruption import TrainingInterrupted

    handler_before = signal.getsignal(signal.SIGTERM)
    trainer = make_trainer(tiny_models, tok, data, tmp_path, variant, save_strategy="no",
                           callbacks=[SendSignalAfterStep(signal.SIGTERM, 1)])
    with pytest.raises(TrainingInterrupted) as caught:
        trainer.train()
    err = caught.value
    assert err.exit_code == 143 and err.signal_name == "SIGTERM" and err.step == 1
    assert err.checkpoint == str(tmp_path / "checkpoint-1") and err.checkpoint in str(err)
    assert signal.getsignal(signal.SIGTERM) is handler_before
    assert trainer.state.global_step == 1  # stopped at the end of the update that saw the signal
    resumed = make_trainer(tiny_models, tok, data, tmp_path, variant, save_strategy="no")
    resumed.train(resume_from_checkpoint=err.checkpoint)
    assert_same_updates(reference_runs[variant][1], update_logs(resumed), 2)


class PoisonAfterStep(TrainerCallback):
    """Sets a weight of `module` to NaN at the end of step `step` (a real model that returns NaN from then on)."""

    def __init__(self, module, step):
        self.module, self.step = module, step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                self.module.weight[0, 0] = float("nan")


def test_nan_scores_stop_with_the_state_before_the_update(tiny_models, tok, data, tmp_path, reference_runs):
    from trl_ext.runtime.nonfinite import NonFiniteError

    reward = load_models(tiny_models)[2]
    # poisoned after update 2, where no sample generation runs (they are at updates 1, 3, 5)
    trainer = make_trainer(tiny_models, tok, data, tmp_path, "full", save_strategy="no", reward_model=reward,
                           callbacks=[PoisonAfterStep(reward.score, 2)])
    with pytest.raises(NonFiniteError, match=r"^update 3: objective/scores contains NaN \(4 of 4 rollouts\)") as caught:
        trainer.train()
    err = caught.value
    assert err.update == 3 and err.saved and err.checkpoint == str(tmp_path / "checkpoint-2")
    assert trainer.state.global_step == 2
    # the saved state is the one before update 3: with a healthy reward model the run goes on as if nothing happened
    resumed = make_trainer(tiny_models, tok, data, tmp_path, "full", save_strategy="no")
    resumed.train(resume_from_checkpoint=err.checkpoint)
    assert_same_updates(reference_runs["full"][1], update_logs(resumed), 3)


@pytest.mark.parametrize("variant", ["shared", "critic_free"])
def test_nan_scores_of_a_shared_base_reward_adapter(tiny_models, tok, data, tmp_path, reference_runs, variant):
    """The reward adapter's head turns NaN after update 2: caught, state before update 3 saved, and it resumes."""
    from trl_ext.runtime.nonfinite import NonFiniteError

    trainer = make_trainer(tiny_models, tok, data, tmp_path, variant, save_strategy="no")
    trainer.add_callback(PoisonAfterStep(trainer.reward_model.score, 2))
    with pytest.raises(NonFiniteError, match=r"^update 3: objective/scores contains NaN \(4 of 4 rollouts\)") as caught:
        trainer.train()
    assert caught.value.saved and caught.value.checkpoint == str(tmp_path / "checkpoint-2")
    resumed = make_trainer(tiny_models, tok, data, tmp_path, variant, save_strategy="no")
    resumed.train(resume_from_checkpoint=caught.value.checkpoint)
    assert_same_updates(reference_runs[variant][1], update_logs(resumed), 3)


def test_nan_loss_is_caught_before_backward(tiny_models, tok, data, tmp_path):
    """A NaN value head makes the first loss of update 2 NaN: caught before any optimizer step of that update."""
    from trl_ext.runtime.nonfinite import NonFiniteError

    trainer = make_trainer(tiny_models, tok, data, tmp_path, "full", save_strategy="no", total_episodes=8)
    value_model = trainer.accelerator.unwrap_model(trainer.model).value_model
    trainer.add_callback(PoisonAfterStep(value_model.score, 1))
    with pytest.raises(NonFiniteError, match=r"^update 2: loss/total contains NaN \(1 of 1 processes\) "
                                             r"\(PPO epoch 1, mini-batch 1, micro-batch 1\)") as caught:
        trainer.train()
    assert caught.value.saved and caught.value.checkpoint == str(tmp_path / "checkpoint-1")
    assert (tmp_path / "checkpoint-1" / "trl_ext_ppo_state_0.pt").is_file()


@pytest.mark.parametrize("variant", ["full", "critic_free"])
def test_nan_loss_after_an_optimizer_step_names_the_last_checkpoint(tiny_models, tok, data, tmp_path, variant):
    import trl_ext
    from trl_ext.runtime.nonfinite import NonFiniteError

    class NaNOnSecondStep(trl_ext.PPOTrainer):
        def compute_micro_batch_loss(self, model, rollout, micro_batch_inds, ptx_batch=None, **step):
            out = super().compute_micro_batch_loss(model, rollout, micro_batch_inds, ptx_batch, **step)
            if self.state.global_step == 1 and self._optimizer_stepped:
                out.loss = out.loss * float("nan")
            return out

    trainer = make_trainer(tiny_models, tok, data, tmp_path, variant, trainer_cls=NaNOnSecondStep,
                           save_strategy="steps", save_steps=1, total_episodes=8)
    with pytest.raises(NonFiniteError, match="weights had already changed in this update") as caught:
        trainer.train()
    assert caught.value.update == 2 and not caught.value.saved
    assert caught.value.checkpoint == str(tmp_path / "checkpoint-1")
    assert not (tmp_path / "checkpoint-2").exists()


def test_reward_clip_clips_scores_and_logs_the_fraction(tiny_models, tok, data, tmp_path):
    clip = 0.3
    unclipped = make_trainer(tiny_models, tok, data, tmp_path / "a", "lora", total_episodes=8, ptx_coef=0.0)
    unclipped.train()
    clipped = make_trainer(tiny_models, tok, data, tmp_path / "b", "lora", total_episodes=8, ptx_coef=0.0,
                           reward_clip=clip)
    clipped.train()
    first_raw, first = update_logs(unclipped)[0], update_logs(clipped)[0]
    # same rollouts in update 1 (clipping happens after scoring): the raw scores exceed the clip
    assert first["objective/kl"] == pytest.approx(first_raw["objective/kl"], abs=1e-6)
    assert abs(first_raw["objective/scores"]) > clip
    assert 0 < first["objective/scores_clipfrac"] <= 1
    assert abs(first["objective/scores"]) <= clip + 1e-6
    assert first["objective/rlhf_reward"] == pytest.approx(
        first["objective/scores"] + first["objective/non_score_reward"], abs=1e-5)
    assert "objective/scores_clipfrac" not in first_raw


def test_reward_clip_must_be_positive(tmp_path):
    import trl_ext
    from trl_ext.errors import UserInputError

    with pytest.raises(UserInputError, match="reward_clip"):
        trl_ext.PPOConfig(**config_kwargs(tmp_path, reward_clip=0.0))


def test_resume_without_a_checkpoint_is_a_clear_error(tiny_models, tok, data, tmp_path):
    from trl_ext.errors import UserInputError

    trainer = make_trainer(tiny_models, tok, data, tmp_path, "lora", total_episodes=4)
    with pytest.raises(UserInputError, match="resume_from_checkpoint: no complete checkpoint"):
        trainer.train(resume_from_checkpoint=True)
