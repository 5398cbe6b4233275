"""Two CPU processes (gloo), one launch: reward, DPO and PPO with LoRA and the extensions on; PPO checkpoint+resume;
PPO with reward functions and with the continuous-batching rollout engine."""

import pytest


@pytest.fixture(scope="module")
def ranks(ddp_reference):
    return ddp_reference  # one launch of ddp_script.py per session (tests/conftest.py), shared with tests/engines


@pytest.mark.parametrize("run", ["reward", "dpo", "ppo", "ppo_resumed", "ppo_reward_funcs",
                                 "ppo_continuous_batching"])
def test_ranks_end_with_identical_weights(ranks, run):
    assert [r[run]["world_size"] for r in ranks] == [2, 2]
    assert ranks[0][run]["checksum"] == ranks[1][run]["checksum"]


def test_extensions_were_on(ranks):
    rank0 = ranks[0]
    assert rank0["dpo"]["loss_types"] == ["robust"]  # cDPO (label smoothing) through TRL's robust loss
    assert rank0["dpo"]["losses"][0] == pytest.approx(0.693147, abs=1e-5)  # LoRA: policy == reference at step 1
    assert len(rank0["reward"]["losses"]) == 3 and len(rank0["ppo"]["ptx"]) == 3


def test_kl_controller_sees_the_kl_averaged_over_processes(ranks):
    """Both ranks log the same (gathered) KL and keep the same adaptive coefficient, which follows the formula."""
    a, b = ranks[0]["ppo"], ranks[1]["ppo"]
    assert a["kl"] == b["kl"] and a["kl_coef"] == b["kl_coef"] and a["final_kl_coef"] == b["final_kl_coef"]
    beta = 0.05
    for kl, logged in zip(a["kl"], a["kl_coef"]):
        assert logged == pytest.approx(beta)
        beta *= 1 + min(max(kl / 0.01 - 1, -0.2), 0.2) * 4 / 8  # target 0.01, horizon 8, 4 episodes per update
    assert a["final_kl_coef"] == pytest.approx(beta)


def test_ppo_resume_under_two_processes(ranks):
    """Per-process RNG and PPO state files; resuming from checkpoint-2 ends with the uninterrupted run's weights."""
    files = ranks[0]["ppo"]["checkpoint_files"]
    for name in ("rng_state_0.pth", "rng_state_1.pth", "trl_ext_ppo_state_0.pt", "trl_ext_ppo_state_1.pt",
                 "adapter_model.safetensors", "value_model", "optimizer.pt"):
        assert name in files
    for rank in ranks:
        assert rank["ppo_resumed"]["checksum"] == rank["ppo"]["checksum"]
        assert rank["ppo_resumed"]["kl"] == pytest.approx(rank["ppo"]["kl"], abs=1e-6)
        assert rank["ppo_resumed"]["final_kl_coef"] == pytest.approx(rank["ppo"]["final_kl_coef"], rel=1e-9)


def test_reward_functions_see_each_rank_s_own_rows_with_their_columns(ranks):
    """Under two processes each rank's reward function gets its own prompts, k = 2 samples in a row, and the
    dataset columns of those very rows; the ranks see different prompts and log the same (gathered) mean reward."""
    seen = []
    for rank in ranks:
        run = rank["ppo_reward_funcs"]
        assert [call["step"] for call in run["calls"]] == [0, 1]
        for call in run["calls"]:
            assert call["answer"][0::2] == call["answer"][1::2]
            assert call["prompts"] == [run["prompt_of"][a] for a in call["answer"]]
            seen.append(set(call["answer"]))
    assert not seen[0] & seen[2] and not seen[1] & seen[3]  # rank 0 and rank 1, same update: different rows
    assert ranks[0]["ppo_reward_funcs"]["reward_mean"] == ranks[1]["ppo_reward_funcs"]["reward_mean"]
    # gradient accumulation 2 x 2 mini-batches: 2 updates x 2 PPO epochs x 2 mini-batches, one step per mini-batch
    assert [rank["ppo_reward_funcs"]["optimizer_steps"] for rank in ranks] == [8, 8]


def test_continuous_batching_under_two_processes(ranks):
    """rollout_engine continuous_batching under DDP: each rank's engine samples its own prompts (responses of uneven
    length, cut at the stop token), the engine's log-probs are the rollout's (first update on-policy), both ranks log
    the same gathered metrics and end with the same weights."""
    runs = [rank["ppo_continuous_batching"] for rank in ranks]
    assert [r["world_size"] for r in runs] == [2, 2] and runs[0]["checksum"] == runs[1]["checksum"]
    for run in runs:
        assert run["engine"] == "continuous_batching" and run["logprobs_from_engine"] is True
        assert len(run["responses"]) == 2 and all(len(update["ids"]) == 4 for update in run["responses"])
        for update in run["responses"]:
            assert all(ids[-1] == run["eos"] or len(ids) == 16 for ids in update["ids"])  # cut at the stop token
            assert all(run["eos"] not in ids[:-1] for ids in update["ids"])
        assert run["metrics"][0]["policy/ratio_avg"] == pytest.approx(1, abs=1e-5)
    for update in range(2):
        mine, theirs = runs[0]["responses"][update]["ids"], runs[1]["responses"][update]["ids"]
        assert not set(runs[0]["responses"][update]["prompts"]) & set(runs[1]["responses"][update]["prompts"])
        assert mine != theirs  # each rank generated responses to its own prompts
        lengths = [len(ids) for ids in mine + theirs]
        assert min(lengths) < max(lengths)  # uneven lengths: what the engine is for
        for run in runs:  # the logged length statistics are those of both ranks' responses (gathered)
            logged = run["metrics"][update]
            assert logged["completions/mean_length"] == pytest.approx(sum(lengths) / len(lengths))
            assert logged["completions/min_length"] == min(lengths)
            assert logged["completions/max_length"] == max(lengths)
    assert runs[0]["metrics"] == runs[1]["metrics"]
