"""areal_patches/pass_at_k: advantages for pass@k, through AReaL's own PPOActor."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
import torch

from areal_patches import pass_at_k

ROOT_CONFIG = str(Path(__file__).resolve().parent.parent / "train_config.yaml")


def brute_force_advantages(solved: list[bool], k: int) -> list[float]:
    """The definition: a k-subset scores 1 when it holds a right completion; a completion's
    advantage is the mean over the k-subsets holding it of (score - group mean) / group std."""
    subsets = list(itertools.combinations(range(len(solved)), k))
    score = {s: float(any(solved[i] for i in s)) for s in subsets}
    mean = sum(score.values()) / len(subsets)
    std = math.sqrt(sum((v - mean) ** 2 for v in score.values()) / len(subsets))
    if std == 0:
        return [0.0] * len(solved)
    return [
        sum(score[s] - mean for s in subsets if i in s) / sum(i in s for s in subsets) / std
        for i in range(len(solved))
    ]


@pytest.mark.parametrize("n", [4, 6, 8])
def test_group_advantages_match_the_definition(n):
    for k in range(1, n + 1):
        for c in range(n + 1):
            solved = [True] * c + [False] * (n - c)
            got = pass_at_k.group_advantages(solved, k)
            assert got == pytest.approx(brute_force_advantages(solved, k), abs=1e-9), (n, k, c)
            assert sum(got) == pytest.approx(0.0, abs=1e-9)


def test_k_of_one_is_grpo_on_right_and_wrong():
    solved = [True, False, False, True, False, False, False, False]
    r = torch.tensor(solved, dtype=torch.float64)
    grpo = (r - r.mean()) / r.std(unbiased=False)
    assert pass_at_k.group_advantages(solved, 1) == pytest.approx(grpo.tolist())


def test_often_solved_puzzles_stop_pulling_and_rare_ones_pull_harder():
    one_right = pass_at_k.group_advantages([True] + [False] * 7, 4)
    four_right = pass_at_k.group_advantages([True] * 4 + [False] * 4, 4)
    five_right = pass_at_k.group_advantages([True] * 5 + [False] * 3, 4)
    assert five_right == [0.0] * 8  # every 4-subset holds a right completion
    assert one_right[0] > 5 * four_right[0] > 0
    assert 0 > one_right[1] > pass_at_k.group_advantages([True] + [False] * 7, 1)[1]


def actor_config(overrides: list[str]):
    from areal.api.cli_args import parse_cli_args, to_structured_cfg
    from omegaconf import OmegaConf

    from train import CountDownConfig

    cfg, _ = parse_cli_args(["--config", ROOT_CONFIG, "gconfig.n_samples=4", *overrides])
    return OmegaConf.to_object(to_structured_cfg(cfg, CountDownConfig)).actor


def compute_advantages(name: str):
    """AReaL's `PPOActor._compute_advantages`, or fast_step's replacement (shipped on the GPU)."""
    from areal.trainer.ppo.actor import PPOActor

    from areal_patches import fast_step

    if name == "fast_step":
        return fast_step.compute_advantages
    return getattr(PPOActor, "_areal_compute_advantages", PPOActor._compute_advantages)


def synthetic_batch(rewards: list[float]) -> dict[str, torch.Tensor]:
    """One 3-token completion after a 2-token prompt per reward, as a rollout batch."""
    bs = len(rewards)
    return {
        "input_ids": torch.ones(bs, 5, dtype=torch.long),
        "attention_mask": torch.ones(bs, 5, dtype=torch.bool),
        "loss_mask": torch.tensor([[0, 0, 1, 1, 1]] * bs, dtype=torch.int32),
        "logprobs": torch.zeros(bs, 5),
        "rewards": torch.tensor(rewards),
    }


def advantages_from_ppo_actor(overrides: list[str], rewards: list[float], compute: str) -> torch.Tensor:
    """A PPOActor's advantages for a batch of 3-token completions after a 2-token prompt; no
    engine is needed for them, so none is given. Returns one advantage per sequence (no
    critic, discount 1: every completion token has its sequence's)."""
    from areal.trainer.ppo.actor import PPOActor

    config = actor_config([*overrides, "actor.adv_norm=null"])
    actor = PPOActor(config, engine=None)
    advantages = compute_advantages(compute)(actor, synthetic_batch(rewards))["advantages"]
    per_token = advantages[:, 1:4]  # the rolled loss mask: tokens 2..4 are predicted at 1..3
    torch.testing.assert_close(per_token, per_token[:, :1].expand_as(per_token))
    return per_token[:, 0]


REWARDS = [1.0, 0.1, 0.0, 0.1, 1.0, 1.0, 0.1, 0.1]  # two groups of 4: 1 right, then 2 right


@pytest.mark.parametrize("compute", ["areal", "fast_step"])
def test_the_patched_actor_uses_pass_at_k_advantages(compute):
    pass_at_k.install()
    got = advantages_from_ppo_actor(["actor.pass_at_k=2"], REWARDS, compute)
    solved = [r == 1.0 for r in REWARDS]
    expected = pass_at_k.group_advantages(solved[:4], 2) + pass_at_k.group_advantages(solved[4:], 2)
    torch.testing.assert_close(got, torch.tensor(expected), atol=1e-5, rtol=0)


@pytest.mark.parametrize("compute", ["areal", "fast_step"])
def test_pass_at_k_of_one_keeps_areals_reward_norm(compute):
    """The shipped setting: the format score still counts, as in AReaL's group normalisation."""
    pass_at_k.install()
    got = advantages_from_ppo_actor([], REWARDS, compute)
    r = torch.tensor(REWARDS).view(2, 4)
    expected = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-5)).flatten()
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize("k", ["0", "5"])
def test_a_k_the_group_cannot_hold_is_refused(k):
    with pytest.raises(ValueError, match=rf"actor.pass_at_k={k}: use 1 .*gconfig.n_samples"):
        actor_config([f"actor.pass_at_k={k}"])
