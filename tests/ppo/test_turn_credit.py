"""Per-turn credit without a value model (``turn_credit: turn``, trl_ext/ppo/objective/turn_credit.py) and the
estimator registry (trl_ext/ppo/objective/estimators.py): each estimator's per-turn advantages on a literal group,
computed by hand; a turn that episodes never reached; one turn gives the episode's numbers; the refusals.

The literal group (k = 3, gamma 0.5, no KL): six positions; ``a`` the policy's tokens, ``o`` an observation.

* episode 0: ``a a o o a a``, turn 1 rewarded 1 on its last token, the final score 2 on the last token;
* episode 1: the same layout, turn 1 rewarded 0, final score 1;
* episode 2: ``a a a`` then padding, one turn, final score 3.

Per-turn rewards: (1, 2), (0, 1), (3); returns-to-go ``G_1 = R_1 + 0.5 G_2``: (2, 2), (0.5, 1), (3).
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import trl_ext
from trl_ext.errors import UserInputError
from trl_ext.ppo.objective.advantages import GRPO_STD_EPS
from trl_ext.ppo.objective.critic import CriticFree
from trl_ext.ppo.objective.estimators import ESTIMATORS, get_estimator, register_estimator
from trl_ext.ppo.objective.turn_credit import turn_index

from ppo_helpers import config_kwargs

ACTIONS = torch.tensor([[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
LAST = [5, 5, 2]
SCORES = torch.tensor([2.0, 1.0, 3.0])
TURN_REWARDS = torch.tensor([[0.0, 1.0, 0, 0, 0, 0], [0.0, 0.0, 0, 0, 0, 0], [0.0] * 6])


def critic(estimator: str, turn_credit: str = "turn", k: int = 3, gamma: float = 0.5, **settings) -> CriticFree:
    args = dict(advantage_estimator=estimator, num_samples_per_prompt=k, kl_in="loss", gamma=gamma, lam=0.95,
                critic_lam=None, length_adaptive_lam_alpha=None, grpo_scale_by_std=True, turn_credit=turn_credit)
    return CriticFree(SimpleNamespace(**{**args, **settings}), None)


def rollout(actions=ACTIONS, scores=SCORES, turn_rewards=TURN_REWARDS):
    return SimpleNamespace(padding_mask=~actions, kl=torch.zeros(actions.shape), scores=scores,
                           turn_rewards=turn_rewards, estimator_stats={})


def advantages(estimator: str, **settings) -> torch.Tensor:
    c, r = critic(estimator, **settings), rollout()
    r.rewards = c.rewards(r, kl_coef=0.05)
    c.advantages(r)
    assert torch.equal(r.returns, r.advantages)
    return r.advantages


def on_layout(turn_1, turn_2, single):
    """The advantages on :data:`ACTIONS`: each episode's turns' values on their tokens, 0 elsewhere."""
    return torch.tensor([[turn_1[0]] * 2 + [0, 0] + [turn_2[0]] * 2, [turn_1[1]] * 2 + [0, 0] + [turn_2[1]] * 2,
                         [single] * 3 + [0, 0, 0]])


def test_rloo_per_turn_by_hand():
    """Turn 1: ``G - mean of the other two``: 2 - (0.5 + 3) / 2, 0.5 - (2 + 3) / 2, 3 - (2 + 0.5) / 2; turn 2, which
    episode 2 never reached, against the one other episode that did: 2 - 1, 1 - 2."""
    expected = on_layout((0.25, -2.0), (1.0, -1.0), 1.75)
    torch.testing.assert_close(advantages("rloo"), expected, rtol=0, atol=1e-6)


def test_grpo_per_turn_by_hand():
    """Turn 1 over (2, 0.5, 3): mean 11/6, unbiased std sqrt(19/12); turn 2 over the two that reached it (2, 1):
    mean 1.5, std sqrt(0.5); Dr. GRPO without the division."""
    s1, s2 = (19 / 12) ** 0.5 + GRPO_STD_EPS, 0.5**0.5 + GRPO_STD_EPS
    expected = on_layout(((2 - 11 / 6) / s1, (0.5 - 11 / 6) / s1), (0.5 / s2, -0.5 / s2), (3 - 11 / 6) / s1)
    torch.testing.assert_close(advantages("grpo"), expected, rtol=0, atol=1e-6)
    dr = on_layout((2 - 11 / 6, 0.5 - 11 / 6), (0.5, -0.5), 3 - 11 / 6)
    torch.testing.assert_close(advantages("grpo", grpo_scale_by_std=False), dr, rtol=0, atol=1e-6)


def whitened(returns: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++'s whitening over the counted tokens, written out: unbiased variance, eps 1e-8."""
    values = returns[mask]
    return (returns - values.mean()) / (values.var() + 1e-8) ** 0.5 * mask


def test_reinforce_pp_per_turn_by_hand():
    """Each turn's reward stays on its turn's last token (1 on episode 0's position 1), the score on the last one; a
    KL of -0.1 (``kl_coef`` 0.05, KL in the reward) on episode 0's first token. The returns-to-go, discounted once
    per turn: episode 0 (1.9, 1 + 0.5 * 2, -, -, 2, 2), episode 1 (0.5, 0.5, -, -, 1, 1), episode 2 (3, 3, 3)."""
    c, r = critic("reinforce_pp", kl_in="reward"), rollout()
    r.kl[0, 0] = 2.0
    r.rewards = c.rewards(r, kl_coef=0.05)
    expected_rewards = torch.zeros(3, 6)
    expected_rewards[0, 0], expected_rewards[0, 1] = -0.1, 1.0
    expected_rewards[torch.arange(3), LAST] += SCORES
    torch.testing.assert_close(r.rewards, expected_rewards, rtol=0, atol=1e-7)
    c.advantages(r)
    returns = torch.tensor([[1.9, 2.0, 0, 0, 2.0, 2.0], [0.5, 0.5, 0, 0, 1.0, 1.0], [3.0, 3.0, 3.0, 0, 0, 0]])
    torch.testing.assert_close(r.advantages, whitened(returns, ACTIONS), rtol=0, atol=1e-5)


def test_reinforce_pp_baseline_per_turn_by_hand():
    """The environment's returns-to-go centred on their group's same turn, ``C``: turn 1 minus 11/6 (1/6, -4/3,
    7/6), turn 2 minus 1.5 (0.5, -0.5); each turn's last token gets ``D_t = C_t - 0.5 * C_{t+1}``: (-1/12, 0.5),
    (-13/12, -0.5), (7/6); their returns-to-go at each turn are ``C`` there."""
    c, r = critic("reinforce_pp_baseline"), rollout()
    r.rewards = c.rewards(r, kl_coef=0.05)
    expected_rewards = torch.zeros(3, 6)
    expected_rewards[0, 1], expected_rewards[0, 5] = -1 / 12, 0.5
    expected_rewards[1, 1], expected_rewards[1, 5] = -13 / 12, -0.5
    expected_rewards[2, 2] = 7 / 6
    torch.testing.assert_close(r.rewards, expected_rewards, rtol=0, atol=1e-6)
    c.advantages(r)
    returns = on_layout((1 / 6, -4 / 3), (0.5, -0.5), 7 / 6)
    torch.testing.assert_close(r.advantages, whitened(returns, ACTIONS), rtol=0, atol=1e-5)


def test_a_turn_no_other_episode_reached_gets_no_credit():
    """k = 2, a pair: episode 0 (2 turns) and episode 2 (1 turn). Turn 1: 2 against 3. Turn 2 has nothing to
    compare with: 0 for RLOO and GRPO; REINFORCE++-baseline centres it on itself (0 on its last token)."""
    pick = [0, 2]
    r = rollout(ACTIONS[pick], SCORES[pick], TURN_REWARDS[pick])
    for estimator in ("rloo", "grpo", "reinforce_pp_baseline"):
        c = critic(estimator, k=2)
        r.rewards = c.rewards(r, kl_coef=0.0)
        c.advantages(r)
        if estimator == "reinforce_pp_baseline":  # C: turn 1 (2 - 2.5, 3 - 2.5), turn 2 (0)
            assert r.rewards[0, 5] == 0 and r.rewards[0, 1] == pytest.approx(-0.5)
        else:
            assert torch.all(r.advantages[0, 4:] == 0) and torch.all(r.advantages[0, :2] < 0)
            assert torch.all(r.advantages[1, :3] > 0)


@pytest.mark.parametrize("estimator", ["rloo", "grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_one_turn_gives_the_episodes_numbers(estimator):
    """Single-turn responses (episode 2's layout for all three), a KL in the reward: ``turn`` equals ``episode``."""
    actions = ACTIONS[[2, 2, 2]]
    runs = {}
    for mode in ("episode", "turn"):
        c, r = critic(estimator, turn_credit=mode, gamma=0.9, kl_in="reward"), rollout(actions, SCORES, None)
        r.kl = torch.tensor([[0.5, 1.0, 0.2, 0, 0, 0], [0.1, 0.0, 0.3, 0, 0, 0], [0.0, 0.4, 0.2, 0, 0, 0]])
        r.rewards = c.rewards(r, kl_coef=0.1)
        c.advantages(r)
        runs[mode] = r
    torch.testing.assert_close(runs["turn"].rewards, runs["episode"].rewards, rtol=0, atol=1e-6)
    torch.testing.assert_close(runs["turn"].advantages, runs["episode"].advantages, rtol=0, atol=1e-5)
    assert runs["episode"].advantages.abs().sum() > 0


def test_turn_index_and_episode_credit_sums_every_turn():
    """The turns of the literal layout; ``episode`` credit: RLOO on each episode's total (3, 1, 3), on every token."""
    assert turn_index(ACTIONS).tolist() == [[1, 1, 0, 0, 2, 2], [1, 1, 0, 0, 2, 2], [1, 1, 1, 0, 0, 0]]
    expected = torch.tensor([1.0, -2.0, 1.0]).unsqueeze(1) * ACTIONS
    torch.testing.assert_close(advantages("rloo", turn_credit="episode"), expected, rtol=0, atol=1e-6)


def test_the_registry_holds_each_estimator_once_with_what_the_rules_read():
    assert list(ESTIMATORS) == ["gae", "rloo", "grpo", "reinforce_pp", "reinforce_pp_baseline"]
    assert [n for n, e in ESTIMATORS.items() if e.value_model] == ["gae"]
    assert [n for n, e in ESTIMATORS.items() if e.group] == ["rloo", "grpo", "reinforce_pp_baseline"]
    assert [n for n, e in ESTIMATORS.items() if e.kl_in == "loss"] == ["grpo"]
    assert [n for n, e in ESTIMATORS.items() if e.turn_credit] == ["rloo", "grpo", "reinforce_pp",
                                                                    "reinforce_pp_baseline"]
    from trl_ext.field_rules import choices_of

    assert choices_of(trl_ext.PPOConfig.__dataclass_fields__["advantage_estimator"].type) == tuple(ESTIMATORS)
    with pytest.raises(ValueError, match="'rloo' is already registered"):
        register_estimator("rloo")(lambda batch, settings: None)
    with pytest.raises(ValueError, match="unknown 'ppo'; registered: gae, rloo"):
        get_estimator("ppo")
    try:  # a new estimator is one registration: the critic uses it
        register_estimator("halved", group=True)(
            lambda batch, settings: get_estimator("rloo").fn(batch, settings)._replace(
                advantages=get_estimator("rloo").fn(batch, settings).advantages / 2))
        c, r = critic("halved", turn_credit="episode"), rollout()
        r.rewards = c.rewards(r, 0.0)
        c.advantages(r)
        torch.testing.assert_close(r.advantages, advantages("rloo", turn_credit="episode") / 2)
    finally:
        ESTIMATORS.pop("halved", None)


@pytest.mark.parametrize("settings, message", [
    (dict(turn_credit="turn"), r"turn_credit: 'turn' is a form of rloo, grpo, reinforce_pp, reinforce_pp_baseline; "
                               r"advantage_estimator 'gae' has none"),
    (dict(turn_credit="steps"), r"turn_credit: invalid choice 'steps' \(valid: one of episode, turn\)"),
])
def test_config_refuses_turn_credit_without_a_per_turn_form(tmp_path, settings, message):
    with pytest.raises(UserInputError, match=f"^{message}") as caught:
        trl_ext.PPOConfig(**config_kwargs(tmp_path, **settings))
    assert "\n" not in str(caught.value)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, advantage_estimator="rloo", num_samples_per_prompt=2,
                                             turn_credit="turn"))
    assert args.turn_credit == "turn"
    assert trl_ext.PPOConfig(**config_kwargs(tmp_path)).turn_credit == "episode"


# ------------------------------------------------------------------------------------- in the trainer, scripted turns
# tests/ppo/test_turn_rewards.py's game: two samples of one prompt (k = 2) play their scripted plans; per-turn rewards
# (None, 0.5, 1.0) and (None, -0.5, 1.0), then the answer, scored 1.0 each: per-turn rewards (0, 0.5, 1, 1) and
# (0, -0.5, 1, 1); gamma 0.9: returns-to-go (1.989, 2.21, 1.9, 1) and (1.089, 1.21, 1.9, 1).

from test_turn_rewards import HotCold, models, trainer  # noqa: E402, F401 (the module's fixture)

from ppo_helpers import first_rollout  # noqa: E402

GAPS = (0.9, 1.0, 0.0, 0.0)
"""Row 0's return-to-go minus row 1's, per turn."""


def per_turn_on_tokens(rollout, values_by_row):
    turns = turn_index(~rollout.padding_mask)
    table = torch.tensor([[0.0, *row] for row in values_by_row])
    return torch.gather(table, 1, turns)


@pytest.mark.parametrize("estimator", ["rloo", "grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_per_turn_credit_of_the_scripted_episodes(models, tmp_path, estimator):  # noqa: F811
    """Each turn's tokens get their turn's credit against the other sample's same turn: RLOO the gap (0.9, 1, 0,
    0), GRPO the gap over the pair's std (1/sqrt(2) of it), REINFORCE++ the returns-to-go whitened, and
    REINFORCE++-baseline half the gap each side, whitened."""
    ppo = trainer(models, tmp_path, HotCold, advantage_estimator=estimator, num_samples_per_prompt=2, kl_in="loss",
                  turn_credit="turn")
    rollout, _ = first_rollout(ppo)
    actions = ~rollout.padding_mask
    assert turn_index(actions).max() == 4 and rollout.scores.tolist() == [1.0, 1.0]
    assert int(actions[0].sum()) == int(actions[1].sum())  # equal plans' lengths: the whitening is symmetric
    if estimator == "rloo":
        expected = per_turn_on_tokens(rollout, [GAPS, [-g for g in GAPS]])
    elif estimator == "grpo":
        scaled = [g / 2 / (g / 2**0.5 + GRPO_STD_EPS) for g in GAPS]
        expected = per_turn_on_tokens(rollout, [scaled, [-g for g in scaled]])
    elif estimator == "reinforce_pp":
        returns = per_turn_on_tokens(rollout, [[1.989, 2.21, 1.9, 1.0], [1.089, 1.21, 1.9, 1.0]])
        expected = whitened(returns, actions)
    else:
        expected = whitened(per_turn_on_tokens(rollout, [[g / 2 for g in GAPS], [-g / 2 for g in GAPS]]), actions)
    torch.testing.assert_close(rollout.advantages, expected, rtol=0, atol=1e-5)
    assert rollout.advantages[0, actions[0]].abs().sum() > 0


def test_turn_credit_without_turns_is_refused_before_the_models_load(models, tmp_path, monkeypatch, capsys,
                                                                     tiny_models):  # noqa: F811
    """The trainer without tools or environments; a recipe without them (``trl-ext check``: exit 2, one line)."""
    import yaml

    from trl_ext.cli import main
    from ppo_helpers import left_tokenizer, load_models, prompt_dataset

    message = (r"turn_credit: 'turn' needs episodes of turns \(tools or environment_factory\) and this run has none "
               r"\(each response is one turn\); set turn_credit to 'episode'")
    tok = left_tokenizer(tiny_models)
    policy, _, reward = load_models(tiny_models)
    args = trl_ext.PPOConfig(**config_kwargs(tmp_path, advantage_estimator="rloo", num_samples_per_prompt=2,
                                             turn_credit="turn", num_sample_generations=0))
    with pytest.raises(UserInputError, match=f"^{message}$"):
        trl_ext.PPOTrainer(args=args, processing_class=tok, model=policy, ref_model=None, reward_model=reward,
                           train_dataset=prompt_dataset(tok, n=4), value_model=None)
    root = Path(__file__).resolve().parents[2]
    demo = yaml.safe_load((root / "recipes" / "demo" / "ppo_rloo.yaml").read_text())
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**demo, "reward_model_path": "tiny://reward", "output_dir": str(tmp_path / "o"),
                                      "turn_credit": "turn"}, sort_keys=False))
    monkeypatch.chdir(root)
    monkeypatch.setenv("TRL_EXT_TINY_DIR", str(tiny_models.root))
    capsys.readouterr()
    assert main(["check", str(recipe)]) == 2
    assert re.fullmatch(f"trl-ext: error: {message}", capsys.readouterr().err.strip())


class TurnsOnly(HotCold):
    """HotCold's per-turn rewards and nothing at the end: what an episode earned is its turns' rewards alone."""

    def get_reward(self) -> float:
        return 0.0


@pytest.mark.parametrize("estimator", ["gae", "rloo", "grpo", "reinforce_pp", "reinforce_pp_baseline"])
def test_metrics_count_the_per_turn_rewards(models, tmp_path, estimator):  # noqa: F811
    """Final rewards 0, per-turn rewards summing to 1.5 and 0.5 (k = 2, one group): ``reward`` 1 (std sqrt(0.5)),
    the group differs (its std sqrt(0.5), no group of equal scores), and the summary's headline is what the
    episodes earned, 1; ``objective/scores`` keeps the final rewards (0)."""
    from trl_ext.recipe_loader.summary import headline

    ppo = trainer(models, tmp_path, TurnsOnly, advantage_estimator=estimator, num_samples_per_prompt=2)
    ppo.train()
    log = ppo.state.log_history[0]
    assert log["objective/scores"] == 0.0 and log["episodes/turn_reward_mean"] == 1.0
    assert log["reward"] == log["episodes/reward_mean"] == 1.0
    assert log["reward_std"] == pytest.approx(0.5**0.5) and log["frac_reward_zero_std"] == 0.0
    if estimator != "gae":
        assert log["objective/group_scores_std"] == pytest.approx(0.5**0.5)
        assert log["objective/frac_groups_equal_scores"] == 0.0
    assert headline(ppo.state.log_history, "ppo") == ("episodes/reward_mean", 1.0, 1.0, 1)
