"""trl_ext.PPOTrainer: parent equivalence, KL controllers from the logs, ptx, LoRA models, steps and errors."""

from __future__ import annotations

import pytest
import torch
from transformers import TrainerCallback

from ppo_helpers import (
    config_kwargs,
    load_models,
    ptx_dataset,
    seed_all,
    update_logs,
)
from ppo_reference import (
    REFERENCE_TOLERANCE,
    SCENARIOS,
    assert_same_logs,
    assert_same_tables,
    checkpoint_files,
    lora_config,
    parent_run,
    recorded_sample_tables,
    reference,
    run_scenario,
    scenario_data,
)


@pytest.fixture(scope="module")
def data(tok):
    return scenario_data(tok)


def run(trainer_cls, config_cls, tiny_models, tok, data, tmp_path, *, peft_config=None, value_model=None,
        trainer_kwargs=None, wrap_policy=None, **overrides):
    seed_all(0)
    policy, value, reward = load_models(tiny_models)
    if wrap_policy is not None:
        policy = wrap_policy(policy)
    trainer = trainer_cls(
        args=config_cls(**config_kwargs(tmp_path, **overrides)),
        processing_class=tok,
        model=policy,
        ref_model=None,
        reward_model=reward,
        train_dataset=data[0],
        value_model=value_model if value_model is not None else value,
        eval_dataset=data[1],
        peft_config=peft_config,
        **(trainer_kwargs or {}),
    )
    trainer.train()
    return trainer, update_logs(trainer)


def run_ext(*args, **kwargs):
    import trl_ext

    return run(trl_ext.PPOTrainer, trl_ext.PPOConfig, *args, **kwargs)


@pytest.mark.parametrize("variant", ["full", "lora", "ref_adapter"])
def test_defaults_reproduce_trl_metrics(tiny_models, tok, data, tmp_path, variant):
    """Every metric, checkpoint file and sample generation of TRL 1.12's own PPOTrainer: run live where the installed
    TRL ships it (and then checked against the recording too), else its recorded run (tests/ppo_reference.py)."""
    import trl_ext

    parent = parent_run(variant, tiny_models, tok, data, tmp_path / "trl")
    if parent.live:  # the recording is what TRL's trainer does
        recorded = reference()["scenarios"][variant]
        assert_same_logs(recorded["logs"], parent.logs, REFERENCE_TOLERANCE, "recording", recorded=True)
        assert parent.checkpoint_files == recorded["checkpoint_files"]
        assert_same_tables(recorded["sample_tables"], parent.sample_tables, REFERENCE_TOLERANCE)
    with recorded_sample_tables() as tables:
        child_trainer, child = run_scenario(trl_ext.PPOTrainer, trl_ext.PPOConfig, variant, tiny_models, tok, data,
                                            tmp_path / "ext")
    assert len(parent.logs) == 3
    assert_same_logs(parent.logs, child, parent.tolerance, recorded=not parent.live)
    # the run is not trivially constant: the policy moved and the value loss changed
    assert parent.logs[-1]["objective/kl"] != parent.logs[0]["objective/kl"]
    assert_same_tables(parent.sample_tables, tables, parent.tolerance)
    assert len(tables) == 3 and all(len(table) == 2 for table in tables)  # eval batch of 2 after each update
    # TRL's checkpoint files, plus the value model and the trl-ext state that make it resumable
    assert set(parent.checkpoint_files) <= set(checkpoint_files(tmp_path / "ext"))
    for entry in child:
        assert entry["objective/kl_coef"] == 0.05
        assert all(entry[f"time/{phase}"] >= 0 for phase in ("rollout", "scoring", "optimization"))
        assert "loss/ptx_avg" not in entry
    assert child_trainer.state.global_step == 3 and child_trainer.state.episode == 12
    if variant == "ref_adapter":  # the reference really differs from the policy from the first update on
        assert abs(child[0]["objective/kl"]) > 1e-3
    elif variant == "lora":  # adapters disabled = the initial policy: no KL before the first step
        assert abs(child[0]["objective/kl"]) < 1e-5
    else:
        assert len(parent.checkpoint_files) > 5


def test_default_gradient_clip_is_the_one_difference_from_trl(tiny_models, tok, data, tmp_path):
    """At its plain defaults PPO clips at HF's max_grad_norm 1.0, which TRL's PPO never did: the first update (its
    rollout precedes any step) is TRL's, the later ones are not; max_grad_norm 0 (the parity test above) is TRL's."""
    import trl_ext

    parent = parent_run("full", tiny_models, tok, data, tmp_path / "trl")
    _, clipped = run_scenario(trl_ext.PPOTrainer, trl_ext.PPOConfig, "full", tiny_models, tok, data, tmp_path / "ext",
                              overrides=dict(max_grad_norm=1.0))
    assert clipped[0]["objective/kl"] == pytest.approx(parent.logs[0]["objective/kl"], abs=1e-6)
    assert all(entry["policy/grad_norm"] > 1.0 for entry in clipped)  # every step was clipped
    assert abs(clipped[1]["objective/kl"] - parent.logs[1]["objective/kl"]) > 1e-4


def adaptive(beta, kl, target, horizon, n):
    return beta * (1 + min(max(kl / target - 1, -0.2), 0.2) * n / horizon)


def doubling(beta, kl, target):
    return beta / 2 if kl < target / 1.5 else beta * 2 if kl > target * 1.5 else beta


@pytest.mark.parametrize("controller", ["adaptive", "doubling"])
def test_kl_controller_follows_its_formula_in_the_logs(tiny_models, tok, data, tmp_path, controller):
    target, horizon = 0.01, 8  # small, so that the tiny run's KL moves the coefficient visibly
    _, logs = run_ext(tiny_models, tok, data, tmp_path, kl_controller=controller, kl_target=target,
                      kl_horizon=horizon, kl_coef=0.1, total_episodes=16, num_sample_generations=0)
    assert len(logs) == 4 and logs[0]["objective/kl_coef"] == 0.1
    for before, after in zip(logs, logs[1:]):
        beta, kl = before["objective/kl_coef"], before["objective/kl"]
        expected = adaptive(beta, kl, target, horizon, 4) if controller == "adaptive" else doubling(beta, kl, target)
        assert after["objective/kl_coef"] == pytest.approx(expected, rel=1e-9)
    assert len({entry["objective/kl_coef"] for entry in logs}) > 1
    # the logged coefficient is the one the rewards used: non_score_reward = -beta * sum_t KL_t (k1)
    for entry in logs:
        assert entry["objective/non_score_reward"] == pytest.approx(
            -entry["objective/kl_coef"] * entry["objective/kl"], rel=1e-4, abs=1e-7
        )


def test_custom_controller_object_and_one_overridden_step(tiny_models, tok, data, tmp_path):
    import trl_ext
    from trl_ext.ppo.objective.kl_controllers import KLController

    class Decay(KLController):
        def update(self, kl, n_steps):
            self.value *= 0.5

    class ConstantReward(trl_ext.PPOTrainer):
        def compute_scores(self, postprocessed_query_response, context_length):
            return torch.full((postprocessed_query_response.shape[0],), 2.0)

    trainer, logs = run(ConstantReward, trl_ext.PPOConfig, tiny_models, tok, data, tmp_path,
                        trainer_kwargs={"kl_controller": Decay(0.4)}, missing_eos_penalty=None)
    assert [entry["objective/kl_coef"] for entry in logs] == [0.4, 0.2, 0.1]
    assert all(entry["objective/scores"] == 2.0 for entry in logs)
    assert trainer.kl_ctl.value == 0.05
    # save_model writes the policy alone, loadable as a causal LM
    from transformers import AutoModelForCausalLM

    trainer.save_model(str(tmp_path / "final"))
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    trained = trainer.accelerator.unwrap_model(trainer.model).policy
    assert all(torch.equal(a, b) for a, b in zip(saved.state_dict().values(), trained.state_dict().values()))


def test_value_clip_none_and_mean(tiny_models, tok, data, tmp_path):
    _, none = run_ext(tiny_models, tok, data, tmp_path / "none", value_clip="none", num_sample_generations=0)
    _, mean = run_ext(tiny_models, tok, data, tmp_path / "mean", value_clip="mean", num_sample_generations=0)
    assert all(entry["val/clipfrac_avg"] == 0.0 for entry in none)
    # same first rollout (options only change the losses), different value losses once clipping happens
    assert none[0]["objective/scores"] == mean[0]["objective/scores"]
    assert any(entry["val/clipfrac_avg"] > 0 for entry in mean)
    assert none[0]["loss/value_avg"] != mean[0]["loss/value_avg"]


def lm_loss_on(trainer, dataset) -> float:
    from trl_ext.ppo.objective.losses import ptx_lm_loss
    from trl_ext.ppo.ptx_data import _pad_right

    policy = trainer.accelerator.unwrap_model(trainer.model).policy
    batch = _pad_right(list(dataset), trainer.processing_class.pad_token_id)
    with torch.no_grad():
        logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return ptx_lm_loss(logits, batch["input_ids"], batch["attention_mask"]).item()


@pytest.mark.parametrize("mode", ["joint", "separate"])
def test_ptx_lowers_lm_loss_on_ptx_text(tiny_models, tok, data, tmp_path, mode):
    ptx = ptx_dataset()
    off, off_logs = run_ext(tiny_models, tok, data, tmp_path / "off", num_sample_generations=0)
    on, on_logs = run_ext(tiny_models, tok, data, tmp_path / "on", num_sample_generations=0, ptx_coef=1.0,
                          ptx_mode=mode, ptx_max_length=16, trainer_kwargs={"ptx_dataset": ptx})
    assert all(len(seq) <= 16 for seq in on.ptx_dataset["input_ids"])
    loss_off, loss_on = lm_loss_on(off, on.ptx_dataset), lm_loss_on(on, on.ptx_dataset)
    assert loss_on < loss_off - 0.05, (loss_on, loss_off)
    assert all(entry["loss/ptx_avg"] > 0 for entry in on_logs)
    # ptx draws from its own generator: the first rollout (prompts, samples, scores) is unchanged
    for key in ("objective/scores", "objective/kl", "objective/entropy"):
        assert on_logs[0][key] == off_logs[0][key]
    # joint: one ptx batch per micro-batch (3 updates x 2 epochs x 2 micro-batches); separate: one per optimizer
    # step (gradient_accumulation_steps=2: 3 x 2 x 1); 16 texts in batches of 2 = 8 batches per ptx epoch
    consumed = on.ptx_stream.epoch * 8 + on.ptx_stream.batches_in_epoch
    assert consumed == (12 if mode == "joint" else 6)


def test_lora_policy_and_lora_value_model_with_all_options(tiny_models, tok, data, tmp_path):
    from peft import get_peft_model
    from transformers import AutoModelForSequenceClassification

    value = get_peft_model(
        AutoModelForSequenceClassification.from_pretrained(tiny_models.reward),
        lora_config(task_type="SEQ_CLS"),
    )
    head_before = value.base_model.model.score.modules_to_save["default"].weight.detach().clone()
    trainer, logs = run_ext(
        tiny_models, tok, data, tmp_path, peft_config=lora_config(), value_model=value,
        kl_controller="adaptive", kl_target=0.01, kl_horizon=8, value_clip="mean", ptx_coef=0.5,
        trainer_kwargs={"ptx_dataset": ptx_dataset()}, ptx_max_length=16,
    )
    assert len(logs) == 3 and all("loss/ptx_avg" in entry for entry in logs)
    for before, after in zip(logs, logs[1:]):
        expected = adaptive(before["objective/kl_coef"], before["objective/kl"], 0.01, 8, 4)
        assert after["objective/kl_coef"] == pytest.approx(expected, rel=1e-9)
    # the reference is the policy with adapters off: KL starts at 0 and moves once LoRA trains
    assert abs(logs[0]["objective/kl"]) < 1e-5 and abs(logs[-1]["objective/kl"]) > 1e-4
    # the value model trained through its LoRA adapter and its saved score head copy
    head_after = value.base_model.model.score.modules_to_save["default"].weight
    assert not torch.equal(head_before, head_after)
    trainer.save_model(str(tmp_path / "final"))
    assert (tmp_path / "final" / "adapter_model.safetensors").exists()


def test_scalar_outputs_use_the_peft_adapter(tiny_models):
    from peft import get_peft_model
    from transformers import AutoModelForSequenceClassification
    from trl.experimental.utils import get_reward

    from trl_ext.models.scalar_heads import scalar_model_outputs

    base = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    plain = AutoModelForSequenceClassification.from_pretrained(tiny_models.reward)
    query_response = torch.tensor([[5, 6, 7, 8, 9, 0], [10, 11, 12, 13, 0, 0]])
    pad = 0
    # plain model: identical to TRL's get_reward
    ours, trl = scalar_model_outputs(plain, query_response, pad, 2), get_reward(plain, query_response, pad, 2)
    assert all(torch.equal(a, b) for a, b in zip(ours, trl))
    peft_model = get_peft_model(base, lora_config(task_type="SEQ_CLS", init_lora_weights=False))
    with torch.no_grad():
        peft_model.base_model.model.score.modules_to_save["default"].weight.add_(0.5)
        _, score, lengths = scalar_model_outputs(peft_model, query_response, pad, 2)
        assert lengths.tolist() == [4, 3]
        # HF's own pooled logits (last non-pad token) of the adapted model
        expected = peft_model(input_ids=query_response.masked_fill(query_response == pad, 0),
                              attention_mask=query_response != pad).logits.squeeze(-1)
        assert torch.allclose(score, expected, atol=1e-5)
        with peft_model.disable_adapter():
            _, bare, _ = scalar_model_outputs(peft_model, query_response, pad, 2)
        assert not torch.allclose(score, bare, atol=1e-3)


def test_ptx_argument_errors(tiny_models, tok, data, tmp_path):
    import trl_ext

    policy, value, reward = load_models(tiny_models)
    common = dict(processing_class=tok, model=policy, ref_model=None, reward_model=reward, train_dataset=data[0],
                  value_model=value)
    with pytest.raises(ValueError, match="ptx_coef.*ptx_dataset"):
        trl_ext.PPOTrainer(args=trl_ext.PPOConfig(**config_kwargs(tmp_path, ptx_coef=0.1)), **common)
    with pytest.warns(UserWarning, match="ptx_dataset is ignored"):
        trainer = trl_ext.PPOTrainer(args=trl_ext.PPOConfig(**config_kwargs(tmp_path)), ptx_dataset=ptx_dataset(),
                                     **common)
    assert trainer.ptx_stream is None
    from datasets import Dataset

    with pytest.raises(ValueError, match="ptx_dataset.*'text' column"):
        trl_ext.PPOTrainer(args=trl_ext.PPOConfig(**config_kwargs(tmp_path, ptx_coef=0.1)),
                           ptx_dataset=Dataset.from_dict({"content": ["a b c"]}), **common)


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"value_clip": "min"}, "value_clip"),
        ({"kl_controller": "pid"}, "kl_controller"),
        ({"ptx_mode": "both"}, "ptx_mode"),
        ({"kl_target": 0.0}, "kl_target"),
        ({"kl_horizon": -5}, "kl_horizon"),
        ({"ptx_coef": -0.1}, "ptx_coef"),
        ({"kl_coef": -0.01}, "kl_coef"),
        ({"vf_coef": -1.0}, "vf_coef"),
        ({"ptx_batch_size": 0}, "ptx_batch_size"),
        ({"ptx_max_length": 0}, "ptx_max_length"),
    ],
)
def test_config_validation(tmp_path, overrides, field):
    import trl_ext
    from trl_ext.errors import UserInputError

    with pytest.raises(UserInputError, match=f"^{field}:"):
        trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **overrides)


def test_config_defaults_are_trls(tmp_path):
    import trl_ext

    cfg = trl_ext.PPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    assert (cfg.value_clip, cfg.kl_controller, cfg.kl_target, cfg.kl_horizon) == ("max", "fixed", 6.0, 10000)
    assert (cfg.ptx_coef, cfg.ptx_mode, cfg.ptx_batch_size, cfg.ptx_max_length) == (0.0, "joint", None, 512)
    assert cfg.kl_coef == 0.05 and cfg.cliprange_value == 0.2


def test_scalar_outputs_of_a_4bit_lora_model(tiny_models):
    """A QLoRA-style value/reward model (nf4 base + LoRA + trained score head) scores like its own forward."""
    import bitsandbytes as bnb
    from peft import get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForSequenceClassification, BitsAndBytesConfig

    from trl_ext.models.scalar_heads import scalar_model_outputs

    model = AutoModelForSequenceClassification.from_pretrained(
        tiny_models.reward,
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_compute_dtype=torch.float32),
    )
    for module in model.modules():  # CPU repacking trap, see the environment notes
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    model = get_peft_model(model, lora_config(task_type="SEQ_CLS", init_lora_weights=False))
    query_response = torch.tensor([[5, 6, 7, 8, 9, 0], [10, 11, 12, 13, 0, 0]])
    with torch.no_grad():
        _, score, _ = scalar_model_outputs(model, query_response, 0, 2)
        expected = model(input_ids=query_response, attention_mask=query_response != 0).logits.squeeze(-1)
        with model.disable_adapter():
            _, bare, _ = scalar_model_outputs(model, query_response, 0, 2)
    assert torch.allclose(score, expected, atol=1e-5)
    assert not torch.allclose(score, bare, atol=1e-4)


def test_config_parses_from_the_command_line(tmp_path):
    from transformers import HfArgumentParser

    import trl_ext

    (cfg,) = HfArgumentParser(trl_ext.PPOConfig).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--use_cpu", "--report_to", "none", "--value_clip", "mean",
         "--kl_controller", "doubling", "--kl_target", "3", "--ptx_coef", "0.1", "--ptx_mode", "separate",
         "--ptx_batch_size", "3"]
    )
    assert (cfg.value_clip, cfg.kl_controller, cfg.kl_target) == ("mean", "doubling", 3.0)
    assert (cfg.ptx_coef, cfg.ptx_mode, cfg.ptx_batch_size) == (0.1, "separate", 3)
    with pytest.raises(SystemExit):  # argparse rejects a value outside the Literal choices
        HfArgumentParser(trl_ext.PPOConfig).parse_args_into_dataclasses(
            ["--output_dir", str(tmp_path), "--value_clip", "min"]
        )


def test_trl_at_epoch_end_with_accumulation_steps_per_micro_batch_we_per_mini_batch(tiny_models, tok, data, tmp_path):
    """TRL's PPO does not accumulate in the update that takes an epoch's last prompt batch (accelerate's
    `sync_with_dataloader`): it steps on each of its 2 micro-batches. We step once per mini-batch in every update, so
    the runs agree until that update and differ in it."""
    trl_run = parent_run("epoch_end", tiny_models, tok, data, tmp_path / "trl")  # 4 updates: the 4th ends the epoch
    parent = trl_run.logs
    kwargs = SCENARIOS["epoch_end"]["overrides"]
    steps = []
    trainer, child = run_ext(tiny_models, tok, data, tmp_path / "ext", **kwargs,
                             trainer_kwargs={"callbacks": [StepCounting(steps)]})
    assert len(parent) == len(child) == 4
    assert_same_logs(parent[:3], child[:3], trl_run.tolerance, recorded=not trl_run.live)
    if trl_run.live:
        assert_same_logs(reference()["scenarios"]["epoch_end"]["logs"], parent, REFERENCE_TOLERANCE, "recording",
                         recorded=True)
    assert steps[0].count == 4 * 2 * 1  # updates x PPO epochs x mini-batches (TRL: 3 x 2 + 2 x 2 = 10)
    # TRL's last update takes one optimizer step per micro-batch: the policy moves between micro-batches, so the
    # ratio of the second micro-batch is no longer 1 in the first PPO epoch
    assert child[3]["loss/value_avg"] != pytest.approx(parent[3]["loss/value_avg"], abs=1e-4)
    assert child[3]["policy/approxkl_avg"] < parent[3]["policy/approxkl_avg"]


class StepCounting(TrainerCallback):
    """Counts the optimizer's steps from the start of training (`count_optimizer_steps` on the trainer's optimizer,
    which HF's callback handler passes to `on_train_begin`)."""

    def __init__(self, into: list):
        self.into = into

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        from ppo_helpers import OptimizerSteps

        self.into.append(OptimizerSteps(getattr(optimizer, "optimizer", optimizer)))


def test_rollout_cuda_graphs_trains_as_the_dynamic_cache_does_and_logs_its_steps(tiny_models, tok, data, tmp_path):
    """``rollout_cuda_graphs`` on CPU: the static KV cache without graphs (trl_ext.ppo.rollout.decode_graphs). Three
    updates from the same seed sample the same responses and log the same metrics as the default dynamic cache (up
    to float rounding), with ``rollout/cuda_graph_replays`` (0 on CPU) and ``rollout/eager_decode_steps`` (every
    decoding step of every chunk so far: 3 updates x 2 chunks x at most 7 steps after the prefill)."""
    _, plain = run_ext(tiny_models, tok, data, tmp_path / "plain", num_sample_generations=0)
    trainer, graphs = run_ext(tiny_models, tok, data, tmp_path / "graphs", num_sample_generations=0,
                              rollout_cuda_graphs=True)
    assert len(plain) == len(graphs) == 3
    for a, b in zip(plain, graphs):
        for key in ("objective/scores", "objective/kl", "val/num_eos_tokens", "loss/policy_avg", "loss/value_avg"):
            assert b[key] == pytest.approx(a[key], abs=1e-5), key
        assert "rollout/cuda_graph_replays" not in a
    assert [g["rollout/cuda_graph_replays"] for g in graphs] == [0.0, 0.0, 0.0]
    steps = [g["rollout/eager_decode_steps"] for g in graphs]
    assert 0 < steps[0] < steps[1] < steps[2] <= 3 * 2 * 7 and steps[2] == trainer.decode_graphs.eager_steps
