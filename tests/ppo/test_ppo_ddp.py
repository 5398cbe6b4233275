"""Two CPU processes (gloo): a LoRA-policy PPO run with the extensions on finishes, where TRL's crashes; and with
tools.

The six runs (tests/ppo/ppo_ddp_script.py) share one launch, the one of tests/runtime/ddp_script.py that the DDP
and engine tests use (`ddp_reference`, tests/conftest.py), one after the other in the same two processes, each from
freshly loaded models: the processes' start and imports, most of a launch on tiny models, are paid once."""

import pytest


@pytest.fixture(scope="module")
def launched(ddp_reference):
    return ddp_reference


def ranks_of(launched, mode):
    """Both ranks' results of ``mode``; fails with the mode's error."""
    ranks = [rank["ppo_ddp"][mode] for rank in launched]
    for rank in ranks:
        assert "error" not in rank, rank.get("error")
    return ranks


def test_lora_policy_ppo_under_ddp_with_ptx_and_adaptive_kl(launched):
    # ptx_mode="separate" also exercises the hand-made gradient all-reduce of the separate ptx step
    ranks = ranks_of(launched, "separate")
    assert [r["world_size"] for r in ranks] == [2, 2]
    # both ranks end with identical weights and the same KL coefficient (the KL is averaged over processes)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert ranks[0]["kl_coef"] == ranks[1]["kl_coef"] and ranks[0]["kl_coef"][0] == 0.05
    assert ranks[0]["kl_coef"][1] != 0.05  # adaptive controller moved it
    assert len(ranks[0]["ptx_losses"]) == 2


def test_shared_base_ppo_under_ddp_identical_ranks_and_resume(launched):
    """Reward and value as adapters on the policy's base, 2 processes: identical ranks; resuming from checkpoint-2
    under 2 processes ends with the uninterrupted run's weights."""
    ranks = ranks_of(launched, "shared")
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and ranks[0]["kl"] == ranks[1]["kl"]
    assert ranks[0]["kl_coef"][1] != 0.05 and len(ranks[0]["ptx_losses"]) == 3  # adaptive KL and ptx were on
    for rank in ranks:
        assert rank["resumed_checksum"] == rank["checksum"]
        assert rank["resumed_kl"][2] == rank["kl"][2]
    # the checkpoint holds the policy's adapter (no reward/ or value/ adapter folders) and the value adapter + head
    files = ranks[0]["checkpoint_files"]
    assert "adapter_model.safetensors" in files and "reward" not in files and "value" not in files
    assert ranks[0]["value_model_files"] == ["adapter_config.json", "adapter_model.safetensors"]


def test_critic_free_ppo_under_ddp_whitens_over_both_processes(launched):
    """REINFORCE++-baseline (2 samples per prompt, no value model) with ptx and adaptive KL on 2 processes: identical
    ranks, and the advantages are whitened over the tokens of both processes together (not each alone)."""
    import torch

    ranks = ranks_of(launched, "critic_free")
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and ranks[0]["kl_coef"] == ranks[1]["kl_coef"]
    assert ranks[0]["kl_coef"][1] != 0.05 and len(ranks[0]["ptx_losses"]) == 2
    for rank in ranks:  # each process: one prompt, sampled twice
        assert rank["queries"][0] == rank["queries"][1]
    assert ranks[0]["queries"][0] != ranks[1]["queries"][0]
    counted = [torch.tensor(r["advantages"])[torch.tensor(r["mask"])] for r in ranks]
    together = torch.cat(counted)
    assert together.mean().item() == pytest.approx(0.0, abs=1e-5)
    assert together.std().item() == pytest.approx(1.0, abs=1e-4)
    # whitened on its own, each process's tokens would have std 1
    assert max(abs(c.std().item() - 1) for c in counted) > 1e-2


def test_objectives_under_ddp_global_token_mean_and_dynamic_sampling(launched):
    """GRPO with the global token mean, clip-higher, entropy bonus and dynamic sampling on 2 processes, gradient
    accumulation 2 and 2 mini-batches: identical ranks; one optimizer step per mini-batch (2 updates x 2 PPO epochs x
    2 mini-batches); each mini-batch's normalizer is the token count of both processes (unequal: responses cut after
    3 and 5 tokens) over its micro-batches (1) times P = 2, not either process's own count; both processes run the
    same sampling rounds."""
    ranks = ranks_of(launched, "objectives")
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and ranks[0]["sampling"] == ranks[1]["sampling"]
    assert ranks[0]["optimizer_steps"] == ranks[1]["optimizer_steps"] == 2 * 2 * 2  # updates x epochs x mini-batches
    assert len(ranks[0]["normalizers"]) == len(ranks[1]["normalizers"]) == 2 * 2 * 2
    for (local0, normalizer0), (local1, normalizer1) in zip(ranks[0]["normalizers"], ranks[1]["normalizers"]):
        assert (local0, local1) == (2 * 3, 2 * 5)  # 2 episodes per process and mini-batch
        assert normalizer0 == normalizer1 == (local0 + local1) / 2
    assert len(ranks[0]["sampling"]) == 2
    for entry in ranks[0]["sampling"]:
        assert entry["sampling/completions"] == 8 * entry["sampling/rounds"]  # 2 processes x 4 per round


def test_tools_under_ddp_identical_ranks_and_metrics_over_both_processes(launched):
    """A LoRA policy that calls `add`, GAE with a value model and adaptive KL, `tools=[add]`, 2 processes: tool calls
    ran on both, both end with identical weights, and the logged `tools/*` and `episodes/*` metrics are the means over
    the episodes of both processes (rank 1's tool answers have 3 more digits, so each process's own means differ)."""
    ranks = ranks_of(launched, "tools")
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["checksum"] == ranks[1]["checksum"] and ranks[0]["kl_coef"] == ranks[1]["kl_coef"]
    assert ranks[0]["kl_coef"][1] != 0.05  # the adaptive controller moved it, by the same KL on both
    assert ranks[0]["logged"] == ranks[1]["logged"] and len(ranks[0]["logged"]) == 2
    for rank in ranks:  # every episode of both processes called the tool: its result is a tool message
        assert all(any(m["role"] == "tool" for m in episode) for update in rank["episodes"] for episode in update)
        assert all(own["tools/call_frequency"] > 0 for own in rank["own"])
    for logged, own0, own1 in zip(ranks[0]["logged"], ranks[0]["own"], ranks[1]["own"]):
        assert own0["episodes/observation_tokens_mean"] + 2 <= own1["episodes/observation_tokens_mean"]
        for key, value in logged.items():  # 2 episodes per process: the mean over all is the mean of the means
            if key not in ("tools/failure_frequency", "tools/timeout_frequency"):  # (0 calls failed: 0 / calls)
                assert value == pytest.approx((own0[key] + own1[key]) / 2), key
        assert logged["tools/failure_frequency"] == own0["tools/failure_frequency"] == 0
    # the value model's own rate (critic_learning_rate 3e-3 beside the policy's 1e-3), and its health over both
    # processes' tokens (each rank's own would differ: rank 1's tool results differ), per turn too
    assert ranks[0]["learning_rates"] == ranks[1]["learning_rates"] == [1e-3, 3e-3]
    assert ranks[0]["health"] == ranks[1]["health"]
    assert all({"critic/vf_explained_var", "critic/vf_explained_var/turn_1", "critic/value_rmse/turn_2"} <= set(h)
               for h in ranks[0]["health"])


def test_evaluation_under_ddp_gathers_every_eval_prompt_once(launched, tiny_models, tmp_path):
    """5 eval prompts over 2 processes in batches of 2: rank 0 scores rows 0-2, rank 1 rows 3-4 and a repeat of row
    3 that the metrics leave out; both ranks log the metrics of a one-process evaluation of the same weights."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from ppo_ddp_script import evaluation_trainer

    def untimed(metrics):
        return {k: v for k, v in metrics.items() if "runtime" not in k and "per_second" not in k}

    ranks = ranks_of(launched, "evaluation")
    assert [r["before_seen"] for r in ranks] == [["e0", "e1", "e2"], ["e3", "e4", "e3"]]
    assert untimed(ranks[0]["before"]) == untimed(ranks[1]["before"])
    seen = []
    alone = evaluation_trainer(tiny_models, tmp_path, seen).evaluate()
    assert seen == ["e0", "e1", "e2", "e3", "e4"]
    for key in ("eval_reward", "eval_reward_std", "eval_rewards/digest/mean", "eval_rewards/reward_model/mean",
                "eval_completions/mean_length"):
        assert ranks[0]["before"][key] == pytest.approx(alone[key], rel=1e-5), key
    logged = [r["logged"] for r in ranks]
    assert [[e["step"] for e in entries] for entries in logged] == [[0, 1], [0, 1]]  # evaluate(), then update 1
    assert untimed(logged[0][1]) == untimed(logged[1][1])
