"""Remove host syncs from two per-step computations of AReaL's GRPO update, with the same results.

Why this module exists: experiments/bench/update_overheads.py counts the aten ops and host
syncs (reads of a GPU value by the host, which wait for the GPU) of a GRPO step by phase. At
the 25M model's size a step is mostly such fixed costs, and two computations stand out
because they read values the host never needs one at a time (docs/results/areal-fixes.md has
the counts):

- **Group reward normalisation** (`reward_norm` with `mean_level: group` and `std_level:
  group`, GRPO's). AReaL's `Normalization` loops over the groups in Python, computing each
  group's mean and standard deviation with its own kernels and reading the element count
  back from the GPU twice per group (`factor.item()`), though without a mask that count is
  the group size, known on the host: two syncs and about 18 kernels per group, every step.
  The replacement computes all groups' means and deviations at once, in AReaL's dtypes and
  order of operations.
- **Version staleness statistics.** Every micro-batch of ppo_update, the loss function logs
  the staleness of its tokens (`_log_version_staleness_stats`): one `.any()`, two boolean-mask
  selections (`nonzero`), six `.item()` calls and one more for the token count, ten syncs.
  The replacement computes the same seven numbers on the device with masked reductions and
  reads them in one `.tolist()`.

Other settings (a loss mask, leave-one-out means, batch-level normalisation, a batch that is
not a whole number of groups) run AReaL's own code. The results are AReaL's: the normalised
rewards to the last bit in float32 (tests/test_fewer_syncs.py; the group sums and squared
deviations are reduced in float64 over the same elements), and the staleness statistics
exactly, because staleness is a whole number of versions and its per-micro-batch sums stay
far below float32's 2**24 of exact integers.

`install()` replaces `Normalization.__call__` and the module function the loss function calls,
through `areal_patches.apply()`; `AREAL_PATCHES_SKIP=fewer_syncs` runs AReaL's code.

Upstream: not checked against a dated AReaL main. Undated later versions of AReaL in the
code index still normalise group by group (one selects each group with a `nonzero`) and
rewrote `_log_version_staleness_stats` with another signature (a loss mask, episode ids) and
more reads per row; the replacement here checks for 1.0.4's signature and leaves any other
function alone. Not reported.
"""

from __future__ import annotations

import inspect

import torch

STALENESS_PARAMETERS = ["versions", "current_version", "version_metrics_mask"]


def group_normalisable(norm, x: torch.Tensor, loss_mask: torch.Tensor | None) -> bool:
    """Whether `norm` (an AReaL Normalization) is GRPO's group normalisation on whole groups
    without a mask: the case computed here at once."""
    return (
        norm.mean_level == "group"
        and norm.std_level == "group"
        and not norm.mean_leave1out
        and loss_mask is None
        and norm.group_size > 1
        and x.dim() >= 1
        and x.shape[0] % norm.group_size == 0
    )


def group_normalise(x: torch.Tensor, group_size: int, unbiased: bool, eps: float,
                    high_precision: bool = True) -> torch.Tensor:
    """AReaL's group normalisation without a mask, every group at once: each group's mean and
    standard deviation over all its elements, as `Normalization._compute_mean` and
    `_compute_std` compute them (sums in float64 with high_precision, stored back in x's dtype
    as AReaL's loop stores them)."""
    dtype = torch.float64 if high_precision else torch.float32
    groups = x.reshape(x.shape[0] // group_size, -1)
    n = groups.shape[1]
    mean = (groups.to(dtype).sum(1, keepdim=True) / torch.tensor(n, dtype=dtype, device=x.device)).to(x.dtype)
    centered = groups.to(dtype) - mean.to(dtype)
    sum_sq = (centered**2).sum(1, keepdim=True)
    factor = torch.tensor(n - 1 if unbiased else n, dtype=dtype, device=x.device)
    std = (sum_sq / factor).sqrt().to(x.dtype)
    x_centered = groups - mean.expand_as(groups)
    return (x_centered / (std.expand_as(groups) + eps)).float().reshape(x.shape)


def normalise(original):
    """`Normalization.__call__`, GRPO's case computed at once (see the module docstring)."""

    def call(self, x, loss_mask=None, high_precision=True, reduce_group=None):
        if not group_normalisable(self, x, loss_mask):
            return original(self, x, loss_mask, high_precision, reduce_group)
        return group_normalise(x, self.group_size, self.std_unbiased, self.eps, high_precision)

    return torch.no_grad()(call)


def staleness_numbers(versions: torch.Tensor, current_version: int,
                      mask: torch.Tensor) -> tuple[int, list[float]]:
    """The generated tokens under `mask` and, over them, the mean, max and min staleness
    against the proximal version (current - 1), then against the current one, read from the
    device at once. The means are float32 divisions on the device, as AReaL's `mean()`."""
    valid = mask & (versions >= 0)
    v_behave = versions.float()
    count = valid.sum()
    values = [count.float()]
    for version in (current_version - 1, current_version):
        staleness = version - v_behave
        values += [
            torch.where(valid, staleness, 0.0).sum() / count,
            torch.where(valid, staleness, -torch.inf).max(),
            torch.where(valid, staleness, torch.inf).min(),
        ]
    numbers = torch.stack(values).tolist()
    return int(numbers[0]), numbers[1:]


def log_version_staleness_stats(versions: torch.Tensor, current_version: int,
                                version_metrics_mask: torch.Tensor) -> None:
    """areal 1.0.4's `_log_version_staleness_stats` with one read of the device instead of ten:
    the same denominator and, when any generated token is under the mask, the same scalars."""
    from areal.utils import stats_tracker

    with stats_tracker.scope("version_stats"):
        stats_tracker.denominator(n_valid_tokens=version_metrics_mask.bool())
        count, numbers = staleness_numbers(versions, current_version, version_metrics_mask)
        if count == 0:
            return
        proximal_avg, proximal_max, proximal_min, theta_avg, theta_max, theta_min = numbers
        stats_tracker.scalar(
            sample_staleness_proximal_avg=proximal_avg,
            sample_staleness_proximal_max=proximal_max,
            sample_staleness_proximal_min=proximal_min,
            sample_staleness_theta_avg=theta_avg,
            sample_staleness_theta_max=theta_max,
            sample_staleness_theta_min=theta_min,
            v_theta=current_version,
            v_proximal=current_version - 1,
            n_valid_generated_tokens=count,
        )


def install() -> None:
    """Both replacements in this process (idempotent)."""
    from areal.trainer.ppo import actor
    from areal.utils.data import Normalization

    from areal_patches.patching import wrap_once

    wrap_once(Normalization, "__call__", normalise, "normalises_groups_at_once")
    current = actor._log_version_staleness_stats
    if current is not log_version_staleness_stats and list(inspect.signature(current).parameters) == STALENESS_PARAMETERS:
        actor._areal_log_version_staleness_stats = current
        actor._log_version_staleness_stats = log_version_staleness_stats
