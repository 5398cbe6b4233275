"""A dataset with fewer rows than one batch: refused in one line, not an endless wait for a batch that never comes
(the PPO DataLoader drops its incomplete batch, so such an epoch is empty)."""

from __future__ import annotations

import pytest
import torch
from ppo_helpers import config_kwargs, left_tokenizer, load_models, prompt_dataset
from torch.utils.data import DataLoader

from trl_ext.errors import UserInputError
from trl_ext.ppo.rollout.prompt_stream import PromptStream


def test_the_prompt_stream_refuses_an_epoch_without_a_batch():
    empty = PromptStream(DataLoader(torch.arange(3), batch_size=4, drop_last=True))
    with pytest.raises(UserInputError, match=r"train_dataset \(the PPO prompts\) gives no batch"):
        next(empty)
    stream = PromptStream(DataLoader(torch.arange(8), batch_size=4, drop_last=True))
    taken = [next(stream).tolist() for _ in range(5)]  # two batches an epoch, into the third epoch
    assert taken == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2 + [[0, 1, 2, 3]] and stream.epoch == 2


def test_the_trainer_refuses_fewer_prompts_than_one_batch(tiny_models, tmp_path):
    import trl_ext

    tok = left_tokenizer(tiny_models)
    policy, value, reward = load_models(tiny_models)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path))  # 2 x 2 = 4 prompts per batch
    with pytest.raises(UserInputError, match=r"train_dataset has 3 rows, fewer than one batch of 4 prompts"):
        trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                           value_model=value, train_dataset=prompt_dataset(tok, n=3),
                           eval_dataset=prompt_dataset(tok, n=2))
