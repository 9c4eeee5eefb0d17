"""A step's `rollout/*` scalars average all the episodes they cover.

Upstream behaviour (areal 1.0.4): `PPOTrainer._export_and_commit_stats` exports the actor's
stats, then the rollout engine's, and merges them with `dict.update`. Under the SPMD launchers
the rollout engine runs in the trainer's process, and both exports drain the same
process-wide trackers (`stats_tracker.export_all`): the actor's export takes every episode
recorded since the last step, and the rollout's takes only the few that finished in between.
Where there are any, their averages replace the step's, key by key: a step can log a success
of 1.0 from a handful of solved 3-number puzzles beside the 4-number success of the whole
step.

Effect: where both exports have a scalar with its `__count`, the step logs the average over
both sets of episodes. Keys without counts (the single controller's rollout export, which
runs in other processes and never overlaps) keep AReaL's `update`. What the GPU curves
showed, and a CPU check where the overlap did not occur: docs/results/areal-fixes.md ("A step's rollout
scalars").

Off: `areal_patches.apply(skip={"rollout_stats"})`.

Upstream: `PPOTrainer._export_and_commit_stats` unchanged on AReaL's main as of cbff54d
(2026-08-22) and in the v2.0.0 tag; not reported (AReaL issue #1477, fixed by PR #1478,
concerned the v2 rollout controller's export, not this merge).
"""

from __future__ import annotations


def merge_exports(earlier: dict[str, float], later: dict[str, float]) -> dict[str, float]:
    """`earlier` updated by `later`, where a scalar both counted is averaged over both counts."""
    merged = dict(earlier)
    for key, value in later.items():
        if key.endswith("__count"):
            continue
        count_key = key + "__count"
        n_earlier, n_later = earlier.get(count_key, 0), later.get(count_key, 0)
        if key in earlier and n_earlier > 0 and n_later > 0:
            merged[key] = (earlier[key] * n_earlier + value * n_later) / (n_earlier + n_later)
            merged[count_key] = n_earlier + n_later
        else:
            merged[key] = value
            merged.pop(count_key, None)
            if count_key in later:
                merged[count_key] = n_later
    return merged


def install() -> None:
    from areal.trainer.rl_trainer import PPOTrainer

    if getattr(PPOTrainer._export_and_commit_stats, "merges_by_count", False):
        return
    PPOTrainer._export_and_commit_stats = _export_and_commit_stats


def _export_and_commit_stats(self, epoch: int, epoch_step: int, global_step: int) -> None:
    """AReaL's `PPOTrainer._export_and_commit_stats`, merging by `merge_exports`."""
    import torch.distributed as dist
    from areal.infra import current_platform
    from areal.utils.environ import is_single_controller

    stats = self.actor.export_stats()
    for engine in (self.rollout, self.eval_rollout):
        if engine is not None:
            stats = merge_exports(stats, engine.export_stats())
    self.stats_logger.commit(epoch, epoch_step, global_step, stats)
    if not is_single_controller():
        dist.barrier(group=self.actor.cpu_group)
        current_platform.synchronize()


_export_and_commit_stats.merges_by_count = True
