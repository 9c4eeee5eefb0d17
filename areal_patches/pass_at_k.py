"""GRPO advantages for pass@k instead of pass@1 (opt-in: `actor.pass_at_k` > 1).

Upstream behaviour (areal 1.0.4): `PPOActor` normalises each group's rewards by their mean
and std (`actor.reward_norm`). That pushes every puzzle's share of right samples towards 1:
greedy pass@1 rises, and the rarer right answers are sampled less and less. Measured here,
pass@32 of the test puzzles falls over two GRPO calls while pass@1 rises (docs/results/goal-65.md,
"what GRPO does to pass@k").

Effect, with `actor.pass_at_k: k`: each completion's advantage is the analytic pass@k
advantage of Chen et al. 2025 ("Pass@k Training for Adaptively Balancing Exploration and
Exploitation of Large Reasoning Models", arXiv 2508.10751). The reward of a group is whether
a k-subset of its n completions holds a right one; a completion's advantage is the mean, over
the k-subsets holding it, of that reward less the group's mean, over the group's std. Right
completions get (1 - mean) / std, wrong ones less, and a group with at most k - 1 wrong
completions gets none: puzzles the policy already solves often stop pulling, the rarely solved
ones pull harder. A completion counts as right when its reward is compute_score's full score;
the format score does not count. k = 1 is GRPO on right/wrong with the population std.
The measured effect: docs/results/goal-65.md ("Pass@k advantages").

Off: `actor.pass_at_k: 1` (train_config.yaml ships it) keeps AReaL's `reward_norm`;
`areal_patches.install(pass_at_k=False)` removes the option.

Upstream: AReaL has no pass@k advantage on AReaL's main as of cbff54d (2026-08-22) and in the
v2.0.0 tag (main adds grouped reward-normalisation controls and variable-size groups, PRs #1516
and #1454); not proposed upstream.
"""

from __future__ import annotations

import functools
import math

import torch

from evaluate import pass_at_k
from reward_score import SOLVED_SCORE


def group_advantages(solved: list[bool], k: int) -> list[float]:
    """The pass@k advantage of each completion of one group."""
    n, c = len(solved), sum(solved)
    mean = pass_at_k(n, c, k)
    std = math.sqrt(mean * (1.0 - mean))
    if std == 0.0:
        return [0.0] * n
    # A k-subset holding a given wrong completion is rescued when one of its other k - 1
    # members, drawn from the other n - 1 completions, is right.
    rescued = pass_at_k(n - 1, c, k - 1) if k > 1 else 0.0
    return [((1.0 if s else rescued) - mean) / std for s in solved]


class PassAtKNorm:
    """Stands in for `actor.reward_norm`: maps a batch of consecutive groups' rewards to
    their pass@k advantages. AReaL's GAE (no critic) then gives each token its sequence's."""

    def __init__(self, k: int, group_size: int, solved_reward: float):
        self.k, self.group_size, self.solved_reward = k, group_size, solved_reward

    @torch.no_grad()
    def __call__(self, rewards: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if rewards.numel() % self.group_size:
            raise ValueError(f"{rewards.numel()} rewards do not split into groups of {self.group_size}")
        solved = torch.isclose(rewards.float(), torch.tensor(self.solved_reward)).tolist()
        groups = [solved[i : i + self.group_size] for i in range(0, len(solved), self.group_size)]
        advantages = [a for group in groups for a in group_advantages(group, self.k)]
        return torch.tensor(advantages, dtype=torch.float32, device=rewards.device)


def install() -> None:
    from areal.trainer.ppo.actor import PPOActor

    if getattr(PPOActor.__init__, "knows_pass_at_k", False):
        return
    PPOActor.__init__ = with_pass_at_k(PPOActor.__init__)


def with_pass_at_k(init):
    """`PPOActor.__init__`, with `reward_norm` replaced where the config asks for pass@k > 1."""

    @functools.wraps(init)
    def __init__(self, config, engine):
        init(self, config, engine)
        k = getattr(config, "pass_at_k", 1)
        if k > 1:
            solved_reward = (SOLVED_SCORE + config.reward_bias) * config.reward_scaling
            self.reward_norm = PassAtKNorm(k, config.reward_norm.group_size, solved_reward)

    __init__.knows_pass_at_k = True
    return __init__
