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


def test_no_module_but_the_registry_branches_on_an_estimators_name():
    """Each rule about an estimator is read from its registration (trl_ext/ppo/objective/estimators.py): no module
    compares a value with a registered estimator's name, so that an estimator is added in the registry alone."""
    from trl_ext.ppo.objective.estimators import ESTIMATORS

    names = "|".join(ESTIMATORS)
    branch = re.compile(rf"""(==|!=|\bin\b)\s*[(\[{{]?[^)\]\n]*?["']({names})["']""")
    assert branch.search('if args.advantage_estimator == "gae":') and branch.search("x in ('rloo', 'grpo')")
    branching = sorted(path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")
                       if any(branch.search(line) for line in path.read_text().splitlines()))
    assert branching == []


def test_both_critics_are_one_protocol(tmp_path):
    """ValueCritic and CriticFree answer the trainer's calls of :class:`Critic`; neither saves nor loads a value
    model (the checkpoint step does, when ``has_value_model``)."""
    from trl_ext.ppo.objective.critic import Critic

    for estimator, k in (("gae", 1), ("rloo", 2)):
        args = trl_ext.PPOConfig(**config_kwargs(tmp_path, advantage_estimator=estimator, num_samples_per_prompt=k))
        critic = build_critic(args, Accelerator(cpu=True))
        assert isinstance(critic, Critic)
        assert not hasattr(critic, "save_value_model") and not hasattr(critic, "load_value_model")
