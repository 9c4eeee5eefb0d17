"""Read a step's statistics back from the GPU once, not once or twice for each statistic.

Upstream behaviour (areal 1.0.4): after every step the trainer exports what the update
recorded (`FSDPEngine.export_stats` -> `stats_tracker.export_all`), and
`DistributedStatsTracker.export` reduces each statistic on its own: an average reads its
denominator (`d == 0`) and then its value, a minimum or a maximum compares the micro-batches'
values with Python's `min` and `max` (a read per comparison), checks `isinf` and reads the
result, and each is all-reduced over the data-parallel group first, even a group of one rank,
after an `all_gather_object` of the keys. For the GRPO step of the time-to-accuracy rows that
is 299 host syncs (experiments/bench/update_overheads.py), five times as many as the rest of
the step. Each waits for the trainer's work on the GPU; on a GPU that the dev server shares,
the trainer's kernels wait for their turn behind the server's decoding, so every sync costs
a turn.

Effect: where the reduce group is absent or holds one rank, every statistic is computed with
upstream's operations in upstream's order and left on the device; all of them are read in
one `.tolist()`, and the empty ones (no denominator, only infinities) are told on the host.
The numbers, their keys and their order are upstream's (tests/test_stats_export.py compares
the two exports). Scalars (timings, rewards logged as floats) are averaged in float32 on the
host, where upstream divides a float32 sum by a float32 count on the GPU: the same IEEE
division. With several ranks upstream's code runs.

Off: `AREAL_PATCHES_SKIP=stats_export` (or `apply(skip={"stats_export"})`).

Upstream: not checked against a dated AReaL main. The code index's AReaL main (17df867,
undated) still reads each statistic on its own (`d == 0`, `isinf`, `float(x)`); it compares
minima with `torch.stack(...).min()` and keeps ungrouped scalars on the CPU. Not reported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch

# A statistic's reduction left on the device, how its read value becomes the export's, and for
# an average its denominator (the statistic is left out where that is 0, as upstream leaves it).
Deferred = tuple[str, torch.Tensor, Callable[[float], float | int | None], torch.Tensor | None]


def one_rank(group) -> bool:
    """Whether a reduction over `group` is the identity: no group, or a group of one rank."""
    import torch.distributed as dist

    return group is None or dist.get_world_size(group) == 1


def python_extreme(xs: list[torch.Tensor], beats: Callable) -> torch.Tensor:
    """`min(xs)` (`beats=torch.lt`) or `max(xs)` (`beats=torch.gt`) of 0-dim tensors as Python
    computes them (the first of equals wins; a leading NaN stays), on the device."""
    result = xs[0]
    for x in xs[1:]:
        result = torch.where(beats(x, result), x, result)
    return result


def _finite_or_none(value: float) -> float | None:
    return None if value in (float("inf"), float("-inf")) else value


def deferred(tracker, key: str) -> list[Deferred]:
    """`tracker._aggregate(key, None)`'s entries, their reductions not yet read."""
    from areal.utils.stats_tracker import ReduceType

    kind = tracker.reduce_types.get(key, ReduceType.SCALAR)
    values = tracker.stats[key]
    if not values:  # nothing recorded under the key: upstream's own reduction, cheap here
        return [(name, torch.tensor(float(v)), type(v), None) for name, v in tracker._aggregate(key, None).items()]
    if kind == ReduceType.SCALAR:
        total = torch.tensor(sum(values), dtype=torch.float32)
        count = torch.tensor(len(values), dtype=torch.float32)
        return [(key, total / count, float, None), (key + "__count", count, int, None)]
    if kind == ReduceType.SUM and key not in tracker.denominators:
        return [(key, sum([x.sum() for x in values]), float, None)]
    masks = tracker.stats[tracker.denominators[key]]

    def named(part: str) -> str:
        return f"{key}/{part}" if kind == ReduceType.AVG_MIN_MAX else key

    entries: list[Deferred] = []
    if kind in (ReduceType.AVG_MIN_MAX, ReduceType.AVG, ReduceType.SUM):
        x = sum([torch.where(d, v, 0.0).sum() for v, d in zip(values, masks)])
        if kind == ReduceType.SUM:
            return [(key, x, float, None)]
        d = sum([d.sum() for d in masks])
        entries.append((named("avg"), x / d, float, d))
    if kind in (ReduceType.AVG_MIN_MAX, ReduceType.MIN):
        x = python_extreme([torch.where(d, v, float("inf")).min() for v, d in zip(values, masks)], torch.lt)
        entries.append((named("min"), x, _finite_or_none, None))
    if kind in (ReduceType.AVG_MIN_MAX, ReduceType.MAX):
        x = python_extreme([torch.where(d, v, -float("inf")).max() for v, d in zip(values, masks)], torch.gt)
        entries.append((named("max"), x, _finite_or_none, None))
    return entries


def read_once(tensors: list[torch.Tensor]) -> list[float]:
    """The 0-dim tensors' values, one `.tolist()` per device (the host's own scalars, the GPU's)."""
    values = [0.0] * len(tensors)
    for device in {t.device for t in tensors}:
        at = [i for i, t in enumerate(tensors) if t.device == device]
        for i, value in zip(at, torch.stack([tensors[i].reshape(()).to(torch.float64) for i in at]).tolist()):
            values[i] = value
    return values


def read_all(entries: list[Deferred]) -> dict[str, float | int]:
    """The entries' values, read at once; an average whose denominator is 0 and a minimum or
    maximum that is infinite left out, as upstream leaves them out."""
    read = iter(read_once([torch.as_tensor(t) for _, value, _, d in entries for t in (value, d) if t is not None]))
    result = {}
    for name, _, convert, denominator in entries:
        value = next(read)
        if denominator is not None and next(read) == 0:
            continue
        converted = convert(value)
        if converted is not None:
            result[name] = converted
    return result


def export_once(original):
    """`DistributedStatsTracker.export`, reading every statistic at once on one rank."""

    def export(self, key=None, reduce_group=None, reset=True):
        if key is not None or not one_rank(reduce_group):
            return original(self, key=key, reduce_group=reduce_group, reset=reset)
        with self.lock:
            keys = list(self.stats.keys())
            if reduce_group is not None:  # upstream orders the keys as its all-gather leaves them
                keys = sorted(set(keys))
            result = read_all([entry for k in keys for entry in deferred(self, k)])
            if reset:
                self.denominators, self.reduce_types, self.stats = {}, {}, defaultdict(list)
            return result

    return export


def export_all_once(original):
    """`stats_tracker.export_all`, without gathering the trackers' names on one rank."""

    def export_all(reduce_group=None, reset=True):
        from areal.utils import stats_tracker

        if not one_rank(reduce_group):
            return original(reduce_group=reduce_group, reset=reset)
        names = list(stats_tracker.TRACKERS)
        if reduce_group is not None:
            names = sorted(set(names))
        stats, duplicates = {}, set()
        for name in names:
            exported = stats_tracker.get(name).export(reduce_group=reduce_group, reset=reset)
            duplicates |= exported.keys() & stats.keys()
            stats.update(exported)
        if duplicates:
            stats_tracker.logger.warning(f"Duplicate stat keys detected: {list(duplicates)}")
        return stats

    return export_all


def install() -> None:
    """The replacement in this process (idempotent)."""
    from areal.utils import stats_tracker

    from areal_patches.patching import wrap_once

    wrap_once(stats_tracker.DistributedStatsTracker, "export", export_once, "reads_once")
    wrap_once(stats_tracker, "export_all", export_all_once, "reads_once")
    if getattr(stats_tracker.export, "__self__", None) is stats_tracker.DEFAULT_TRACKER:  # bound before install
        stats_tracker.export = stats_tracker.DEFAULT_TRACKER.export
