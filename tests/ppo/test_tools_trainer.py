"""PPOTrainer with tools and environments (trl_ext/ppo/episodes), end to end on a tiny Llama that learned, in a few
seconds of training on four transcripts, to call `add` and then answer: the observation tokens are in no loss term
(by gradients), the episodes are what TRL's contract says, failing and hanging tools do not stop a run, an
environment owns its reward, a resumed run matches, the adaptive KL controller gets the action tokens' KL and ptx
runs, TRL's GRPOTrainer takes the same objects, and with tools that are never called every number equals the
single-turn run's. (With the shared base: test_ppo_shared_base.py; on two processes: test_ppo_ddp.py, and under
ZeRO-2 tests/engines/test_engines.py.)"""

import time

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from trl_ext import PPOConfig, PPOTrainer
from trl_ext.ppo.objective.objectives import mini_batch_token_normalizer
from trl_ext.ppo.rollout.sequences import INVALID_LOGPROB
from trl_ext.testing.tools import ADD_PAIRS, add

from ppo_helpers import first_rollout, seed_all

PAIRS = ADD_PAIRS


@pytest.fixture(scope="module")
def models(tool_models):
    """(root, tokenizer): the caller (it calls `add`, then answers), the same model untrained, a value model
    (trl_ext.testing.tools.save_tool_models, saved once per run: fixture `tool_models`)."""
    from transformers import AutoTokenizer

    return tool_models, AutoTokenizer.from_pretrained(tool_models / "tok")


def exact(completions, answer, **kwargs):
    return [1.0 if str(a) in (c[-1]["content"] if isinstance(c, list) else c) else 0.0
            for c, a in zip(completions, answer)]


def prompts_dataset():
    return Dataset.from_list([{"prompt": [{"role": "user", "content": f"Add {a} and {b}."}], "answer": a + b}
                              for a, b in PAIRS])


def config(tmp_path, **overrides):
    settings = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                    gradient_accumulation_steps=1, num_mini_batches=1, total_episodes=4, response_length=64,
                    temperature=0.3, report_to="none", seed=0, num_sample_generations=0, stop_token="eos",
                    save_strategy="no", logging_steps=1, num_ppo_epochs=1)
    settings.update(overrides)
    return PPOConfig(**settings)


def trainer(models, tmp_path, policy="caller", dataset=None, **kwargs):
    root, tok = models
    seed_all(0)
    overrides = kwargs.pop("args", {})
    args = config(tmp_path, **overrides)
    value = None if args.critic_free else AutoModelForSequenceClassification.from_pretrained(root / "value",
                                                                                             num_labels=1)
    kwargs.setdefault("reward_funcs", [exact])
    kwargs.setdefault("tools", [add])
    return PPOTrainer(args, tok, AutoModelForCausalLM.from_pretrained(root / policy), None, None,
                      dataset if dataset is not None else prompts_dataset(), value, **kwargs)


@pytest.mark.parametrize("settings", [
    {},
    {"advantage_estimator": "grpo", "num_samples_per_prompt": 2, "kl_in": "loss", "entropy_coef": 0.01,
     "loss_aggregation": "global_token_mean"},
    {"advantage_estimator": "rloo", "num_samples_per_prompt": 2, "rollout_engine": "continuous_batching",
     "peft": True},
], ids=["gae", "grpo-kl-in-loss-entropy", "rloo-engine-lora"])
def test_observation_tokens_are_in_no_loss_term_by_gradients(models, tmp_path, settings):
    settings = dict(settings)
    extra = {}
    if settings.pop("peft", False):
        from peft import LoraConfig

        extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                          task_type="CAUSAL_LM")
    ppo = trainer(models, tmp_path, args=settings, **extra)
    rollout, kl_coef = first_rollout(ppo)
    obs = rollout.observation_mask
    assert obs is not None and obs.any(), "the model called no tool: the test needs one"
    tok, box = models[1], ppo.multi_turn.toolbox
    for i, episode in enumerate(rollout.episodes.episodes):  # the observations are exactly the tool suffixes
        tool_messages = [m for m in episode.messages if m["role"] == "tool"]
        if tool_messages:
            assert rollout.responses[i][obs[i]].tolist() == box.tool_suffix_ids(tool_messages)
    assert torch.all(rollout.logprobs[obs] == INVALID_LOGPROB) and torch.all(rollout.kl[obs] == 0)
    assert torch.all(rollout.advantages[obs] == 0) and torch.all(rollout.values[obs] == 0)
    captured = {}

    def keep(name):
        def hook(module, inputs):
            inputs[0].retain_grad()
            captured[name] = inputs[0]
        return hook

    handles = [ppo.model.policy.lm_head.register_forward_pre_hook(keep("policy"))]
    if not ppo.args.critic_free:
        handles.append(ppo.model.value_model.score.register_forward_pre_hook(keep("value")))
    inds = np.arange(rollout.queries.shape[0])
    normalizer = mini_batch_token_normalizer(ppo.objective, rollout, inds, 1, ppo.accelerator)
    out = ppo.compute_micro_batch_loss(ppo.model, rollout, inds, kl_coef=kl_coef, token_normalizer=normalizer)
    out.loss.backward()
    for handle in handles:
        handle.remove()
    width = rollout.responses.shape[1]
    # the policy's LM head ran on the positions that predict a response token alone (logits_to_keep)
    assert captured["policy"].shape[1] == width + 1 < rollout.query_responses.shape[1]

    def response_predictors(hidden):  # the hidden states that predict response tokens 0..width-1: the positions
        start = hidden.shape[1] - width - 1  # context - 1 of every position; of the last width + 1 (logits_to_keep)
        return hidden.grad[:, start : start + width]

    for name, grad in ((n, response_predictors(t).abs().sum(-1)) for n, t in captured.items()):
        assert torch.all(grad[obs] == 0), name
        assert torch.all(grad[~rollout.padding_mask].sum() > 0), name  # the actions do get gradients


def test_episodes_follow_trls_contract_and_metrics_count_them(models, tmp_path):
    seen = {}

    def record(prompts, completions, completion_ids, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids)
        return [0.0] * len(prompts)

    ppo = trainer(models, tmp_path, reward_funcs=[exact, record], args={"log_completions": True})
    ppo.train()
    metrics = ppo.state.log_history[-1]
    completions = seen["completions"]
    calls = sum(len(m.get("tool_calls") or []) for c in completions for m in c if m["role"] == "assistant")
    assert calls > 0 and metrics["tools/call_frequency"] == calls / len(completions)
    for completion, ids in zip(completions, seen["completion_ids"]):
        for message, nxt in zip(completion, completion[1:]):
            if message.get("tool_calls"):  # each call is answered by TRL's tool message, str() of the result
                call = message["tool_calls"][0]["function"]
                assert nxt == {"role": "tool", "name": "add", "content": str(add(**call["arguments"]))}
        assert ids[-1] == models[1].eos_token_id or len(ids) == 64
    turns = [sum(m["role"] == "assistant" for m in c) for c in completions]
    assert metrics["episodes/turns_mean"] == pytest.approx(np.mean(turns))
    assert metrics["tools/failure_frequency"] == 0 and metrics["tools/timeout_frequency"] == 0
    assert metrics["completions/mean_length"] == metrics["episodes/action_tokens_mean"]  # TRL: the model's tokens
    assert metrics["episodes/observation_tokens_mean"] > 0
    import json

    rows = [json.loads(line) for line in open(tmp_path / "out" / "completions.jsonl")]
    assert any("[observation]\n<|im_start|>user\n<tool_response>" in row["episode"] for row in rows)


def test_failing_and_hanging_tools_do_not_stop_the_run(models, tmp_path):
    def add(a: int, b: int) -> int:  # noqa: F811 - the name the model calls
        """Adds two integers.

        Args:
            a: The first number.
            b: The second number.

        Returns:
            The sum of a and b.
        """
        if a % 2:
            raise ValueError("odd numbers are not supported")
        time.sleep(5)
        return a + b

    seen = []
    ppo = trainer(models, tmp_path, tools=[add], reward_funcs=[lambda completions, **kw: seen.extend(completions)
                                                             or [0.0] * len(completions)],
                  args={"tool_timeout_s": 0.3, "total_episodes": 2, "response_length": 128})
    ppo.train()
    metrics = ppo.state.log_history[-1]
    results = [m["content"] for c in seen for m in c if m["role"] == "tool"]
    errors = [r for r in results if r == "{'error': 'odd numbers are not supported'}"]
    timeouts = [r for r in results if r == "{'error': 'Tool add timed out after 0.3 s'}"]
    assert results and len(errors) + len(timeouts) == len(results)
    assert metrics["tools/failure_frequency"] == 1.0
    assert metrics["tools/timeout_frequency"] == len(timeouts) / len(results)


class AddEnv:
    """The environment form of the same tool: it counts the calls and owns the reward."""

    def __init__(self):
        self.calls, self.row = 0, None

    greeting = None  # what reset adds to the prompt

    def reset(self, **row):
        self.calls, self.row = 0, row
        return self.greeting

    def add(self, a: int, b: int) -> int:
        """Adds two integers.

        Args:
            a: The first number.
            b: The second number.

        Returns:
            The sum of a and b.
        """
        self.calls += 1
        return a + b

    def get_reward(self) -> float:
        return 1.0 if self.calls else 0.0


def test_an_environment_is_reset_with_its_row_and_owns_its_reward(models, tmp_path):
    seen = {}

    def record(prompts, completions, environments, **kwargs):
        seen.update(prompts=prompts, environments=list(environments), completions=completions)
        return [None] * len(prompts)

    ppo = trainer(models, tmp_path, tools=None, environment_factory=AddEnv, reward_funcs=[record],
                  args={"total_episodes": 2})
    ppo.train()
    metrics = ppo.state.log_history[-1]
    envs = seen["environments"]
    for prompt, env in zip(seen["prompts"], envs):  # reset got the row (its prompt and answer)
        assert env.row["prompt"] == prompt
        assert env.row["answer"] == sum(int(w.strip(".")) for w in prompt[-1]["content"].split()[1::2])
    called = [float(any(m["role"] == "tool" for m in c)) for c in seen["completions"]]
    assert [float(e.calls > 0) for e in envs] == called and sum(called) > 0
    assert metrics["rewards/AddEnv/mean"] == pytest.approx(np.mean(called))
    assert metrics["objective/scores"] == pytest.approx(np.mean(called))  # `record` said None: the env's reward


def test_the_text_reset_returns_joins_the_prompt_reward_functions_get(models, tmp_path):
    class GreetingAddEnv(AddEnv):
        greeting = " Use the tool."

    seen = {}
    ppo = trainer(models, tmp_path, policy="untrained", tools=None, environment_factory=GreetingAddEnv,
                  reward_funcs=[lambda prompts, **kw: seen.setdefault("prompts", prompts) and [0.0] * len(prompts)],
                  args={"total_episodes": 2})
    ppo.train()
    for prompt, env in zip(seen["prompts"], ppo.multi_turn.toolbox.environments):
        assert prompt[-1]["content"] == env.row["prompt"][-1]["content"] + " Use the tool."
        assert ppo.processing_class.decode(ppo.multi_turn.toolbox.render_prompt(prompt, 0)).count("Use the tool.") == 1


def test_resume_with_an_environment_logs_what_the_uninterrupted_run_logs(models, tmp_path):
    keys = ("objective/scores", "loss/policy_avg", "loss/value_avg", "tools/call_frequency", "objective/kl")
    full = trainer(models, tmp_path / "a", tools=None, environment_factory=AddEnv, reward_funcs=None,
                   args={"total_episodes": 4, "save_strategy": "steps", "save_steps": 1})
    full.train()
    resumed = trainer(models, tmp_path / "a", tools=None, environment_factory=AddEnv, reward_funcs=None,
                      args={"total_episodes": 4, "output_dir": str(tmp_path / "b")})
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "out" / "checkpoint-1"))
    expected = [{k: h[k] for k in keys} for h in full.state.log_history if "objective/scores" in h]
    got = [{k: h[k] for k in keys} for h in resumed.state.log_history if "objective/scores" in h]
    assert got[-1] == expected[-1]


def test_with_tools_never_called_every_number_is_the_single_turn_runs(models, tmp_path):
    tok = models[1]
    with_tools = trainer(models, tmp_path / "tools", policy="untrained", args={"total_episodes": 4})
    box, rendered = with_tools.multi_turn.toolbox, []
    render = box.render_prompt
    box.render_prompt = lambda prompt, row: rendered.append(row) or render(prompt, row)
    with_tools.train()
    assert rendered == []  # no environment: the prompts are the dataset's, rendered once when the trainer was built
    rendered = prompts_dataset().map(lambda row: {"input_ids": tok.apply_chat_template(
        row["prompt"], tools=[add], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]})
    without = trainer(models, tmp_path / "plain", policy="untrained", tools=None, dataset=rendered,
                      args={"total_episodes": 4})
    without.train()
    assert all(h["tools/call_frequency"] == 0 for h in with_tools.state.log_history if "tools/call_frequency" in h)

    def numbers(history):
        return [{k: v for k, v in h.items() if not k.startswith(("tools/", "episodes/", "time/", "eps"))
                 and "/turn_" not in k} for h in history]

    assert numbers(with_tools.state.log_history) == numbers(without.state.log_history)
    for h in with_tools.state.log_history:  # one turn: the critic's health of turn 1 is the whole episode's
        if "critic/vf_explained_var" in h:
            assert h["critic/vf_explained_var/turn_1"] == pytest.approx(h["critic/vf_explained_var"], rel=1e-9)



def test_the_sampling_keys_reach_every_turn(models, tmp_path):
    """top_k 1 with tools: every turn samples through the trainer's rollout path with the key (the argmax), so two
    seeds give the same episodes, tool calls and results included; each turn's stored log-probs are the
    temperature-scaled full distribution's (a top-1 truncated one would be 0 at every token)."""
    from trl_ext.ppo.rollout.engine import teacher_forced_logprobs

    ppo = trainer(models, tmp_path, args={"top_k": 1})
    ppo.init_train_state()
    ppo.init_data_streams()
    data = ppo.next_prompt_batch()
    rollouts = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        with torch.no_grad():
            rollouts.append(ppo.sample_and_score(dict(data))[0])
    first, second = rollouts
    assert first.observation_mask.any(), "the model called no tool: the test needs one"
    assert torch.equal(first.query_responses, second.query_responses)
    assert torch.equal(first.observation_mask, second.observation_mask)
    with torch.no_grad():
        full = teacher_forced_logprobs(ppo.accelerator.unwrap_model(ppo.model).policy, first.query_responses,
                                       first.context_length, models[1].pad_token_id, ppo.args.temperature, 2)
    actions = ~first.padding_mask
    assert (first.logprobs - full)[actions].abs().max() < 1e-4 and first.logprobs[actions].min() < -1e-3


def test_adaptive_kl_gets_the_action_tokens_kl_and_ptx_runs_with_tools(models, tmp_path):
    """GAE, adaptive KL and PPO-ptx (joint) with tools, 2 updates. The KL the controller receives is, by a sum of our
    own, the mean over episodes of the sampled minus the reference log-probs over the action tokens only (each
    episode's `action` flags, not the trainer's masks); the observation tokens' terms, were they counted (their
    log-prob slot holds 0), would move it by more than 1. The coefficient follows the controller's formula; the ptx
    loss is logged and every logged number is finite."""
    from datasets import Dataset

    ptx = Dataset.from_dict({"text": [f"Add {a} and {b}. The sum is {a + b}." for a, b in PAIRS]})
    ppo = trainer(models, tmp_path, ptx_dataset=ptx, args={
        "kl_controller": "adaptive", "kl_target": 0.5, "kl_horizon": 8, "ptx_coef": 0.5, "ptx_max_length": 16,
        "learning_rate": 1e-3})
    refs, updates, received = [], [], []
    compute_ref_logprobs, compute_rewards, update = ppo.compute_ref_logprobs, ppo.compute_rewards, ppo.kl_ctl.update

    def keep_ref(*args):
        refs.append(compute_ref_logprobs(*args))
        return refs[-1]

    def keep_rollout(rollout, kl_coef):
        updates.append((rollout.episodes.episodes, torch.cat(refs, 0)))
        refs.clear()
        return compute_rewards(rollout, kl_coef)

    ppo.compute_ref_logprobs, ppo.compute_rewards = keep_ref, keep_rollout
    ppo.kl_ctl.update = lambda kl, n_steps: received.append(kl) or update(kl, n_steps)
    ppo.train()
    logs = [h for h in ppo.state.log_history if "objective/kl" in h]
    assert len(logs) == len(updates) == len(received) == 2
    coef = 0.05
    for log, (episodes, ref), kl in zip(logs, updates, received):
        assert sum(not a for e in episodes for a in e.action) > 0, "no tool was called: the test needs one"
        actions, everything = [], []
        for i, e in enumerate(episodes):
            terms = torch.tensor(e.logprobs) - ref[i, : len(e.ids)]
            actions.append(terms[torch.tensor(e.action)].sum().item())
            everything.append(terms.sum().item())
        assert kl == log["objective/kl"] == pytest.approx(np.mean(actions), abs=1e-5)
        assert abs(np.mean(everything) - kl) > 1.0
        assert log["objective/kl_coef"] == pytest.approx(coef)  # Ziegler et al.'s update from the KL it received
        coef *= 1 + float(np.clip(kl / 0.5 - 1, -0.2, 0.2)) * 2 / 8
        assert log["tools/call_frequency"] > 0 and log["loss/ptx_avg"] > 0
        assert all(np.isfinite(v) for v in log.values() if isinstance(v, (int, float)))
    assert ppo.kl_ctl.value == pytest.approx(coef)


def test_trls_grpo_trainer_takes_the_same_tools_and_environment_and_renders_alike(models, tmp_path):
    """The objects a TRL user has run with GRPOTrainer unchanged: TRL renders the prompts and the tool results into
    the same tokens as ours, and trains with the same environment class for a step."""
    from trl import GRPOConfig, GRPOTrainer

    root, tok = models
    grpo_args = GRPOConfig(output_dir=str(tmp_path / "grpo"), use_cpu=True, bf16=False, per_device_train_batch_size=2,
                           num_generations=2, max_completion_length=64, max_steps=1, report_to="none",
                           logging_steps=1, temperature=0.3, save_strategy="no")
    grpo = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(root / "caller"), processing_class=tok,
                       reward_funcs=[exact], args=grpo_args, train_dataset=prompts_dataset(),
                       environment_factory=AddEnv)
    grpo.train()
    assert "tools/call_frequency" in grpo.state.log_history[0] and "rewards/AddEnv/mean" in grpo.state.log_history[0]
    ours = trainer(models, tmp_path, tools=None, environment_factory=AddEnv, reward_funcs=[exact])
    box = ours.multi_turn.toolbox
    prompts = [row["prompt"] for row in prompts_dataset()]
    box.start_batch([{"prompt": p} for p in prompts], prompts)
    grpo._batch_environments = [None] * len(prompts)
    assert grpo._tokenize_prompts(prompts)[0] == [box.render_prompt(p, i) for i, p in enumerate(prompts)]
    results = [{"role": "tool", "name": "add", "content": "5"}, {"role": "tool", "name": "add", "content": "7"}]
    assert grpo._get_tool_suffix_ids(results) == box.tool_suffix_ids(results)
