"""The run's critic (trl_ext/ppo/objective/critic.py): chosen once from the config, and the only place outside the
config and its rules that knows whether the estimator is critic-free."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator

import trl_ext
from trl_ext.ppo.objective.critic import CriticFree, ValueCritic, build_critic

from ppo_helpers import config_kwargs

PACKAGE = Path(trl_ext.__file__).resolve().parent


@pytest.mark.parametrize("estimator, k", [("gae", 1), ("rloo", 2), ("grpo", 2), ("reinforce_pp", 1),
                                          ("reinforce_pp_baseline", 2)])
def test_the_config_chooses_one_critic_and_it_agrees_on_the_value_model(estimator, k, tmp_path):
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, advantage_estimator=estimator, num_samples_per_prompt=k))
    critic = build_critic(args, Accelerator(cpu=True))
    assert type(critic) is (ValueCritic if estimator == "gae" else CriticFree)
    assert critic.has_value_model is args.has_value_model is (estimator == "gae")
    assert args.critic_free is not args.has_value_model


def test_without_a_critic_values_and_value_loss_are_zero():
    query_response = torch.ones(3, 7, dtype=torch.long)
    values = CriticFree.values(None, query_response, 0, context_length=4)
    assert values.shape == (3, 3) and not values.any()
    loss = CriticFree.value_loss(None, None, [0, 1], torch.device("cpu"))
    assert loss.loss.item() == 0.0 and loss.clipfrac.item() == 0.0


def test_only_the_config_its_rules_and_the_critic_name_critic_free():
    naming = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                    if re.search("critic_free", path.read_text()))
    assert naming == ["ppo/config.py", "ppo/config_rules.py", "ppo/objective/critic.py"]
