"""stats_export.py exports a step's statistics as AReaL's tracker does, reading them back once:
the same keys, order and numbers as AReaL's own export of the same records, with and without a
one-rank process group, and no read per statistic."""

import math

import pytest
import torch
import torch.distributed as dist

from areal_patches import stats_export


def areal_export():
    """AReaL's `DistributedStatsTracker.export`, whether or not the fix is installed here."""
    from areal.utils.stats_tracker import DistributedStatsTracker

    return getattr(DistributedStatsTracker.export, "__wrapped__", DistributedStatsTracker.export)


def recorded(seed: int):
    """A tracker holding what a GRPO step records: per micro-batch masks and values (one mask
    all false), statistics of every reduce type, timings and float scalars."""
    from areal.utils.stats_tracker import DistributedStatsTracker, ReduceType

    g = torch.Generator().manual_seed(seed)
    tracker = DistributedStatsTracker()
    for micro_batch in range(3):
        n = 50 + 17 * micro_batch
        mask = torch.rand(n, generator=g) < 0.7
        values = torch.randn(n, generator=g) * 3
        values[0] = -0.0
        if micro_batch == 1:
            values[1], mask[1] = float("inf"), False  # infinite where the mask is off: ignored
        tracker.denominator(n_tokens=mask, nothing=torch.zeros(n, dtype=torch.bool), every=torch.ones(n, dtype=torch.bool))
        with tracker.scope("update"):
            tracker.denominator(n_valid=mask)
            tracker.stat(denominator="n_valid", loss=values, ratio=values.exp())
            tracker.stat(denominator="n_valid", reduce_type=ReduceType.AVG, entropy=values.abs())
            tracker.stat(denominator="n_valid", reduce_type=ReduceType.MIN, lowest=values)
            tracker.stat(denominator="n_valid", reduce_type=ReduceType.MAX, highest=values)
            tracker.stat(denominator="n_valid", reduce_type=ReduceType.SUM, total=values)
        tracker.stat(denominator="nothing", unseen=values)  # every token masked: left out
        tracker.stat(denominator="every", seen=values)  # the infinity counts: no max, as AReaL
        zeros = torch.zeros(n) if micro_batch == 0 else -torch.zeros(n)
        tracker.stat(denominator="every", zeros=zeros)  # micro-batches tie at 0.0 and -0.0: the first wins
        with tracker.scope("timeperf"):  # what record_timing records, a known duration
            tracker.scalar(train_step=0.1 * (micro_batch + 1))
        tracker.scalar(reward=float(torch.rand(1, generator=g)), lr=1e-5)
    return tracker


def exports_alike(group):
    """AReaL's export and the fix's, of the same records."""
    ours = stats_export.export_once(areal_export())
    for seed in range(4):
        theirs_tracker, ours_tracker = recorded(seed), recorded(seed)
        theirs = areal_export()(theirs_tracker, reduce_group=group)
        mine = ours(ours_tracker, reduce_group=group)
        assert list(mine) == list(theirs)  # the same keys in the same order
        for key, value in theirs.items():
            assert type(mine[key]) is type(value), key
            assert mine[key] == value or (math.isnan(value) and math.isnan(mine[key])), key
            assert math.copysign(1, mine[key]) == math.copysign(1, value), key
        assert not ours_tracker.stats and ours(ours_tracker, reduce_group=group) == {}  # reset
    return theirs


def test_the_export_is_areals_without_a_group():
    exported = exports_alike(None)
    assert not {"unseen/avg", "unseen/min", "unseen/max", "seen/max"} & set(exported)  # as AReaL leaves them out
    assert {"update/loss/avg", "update/loss/min", "update/loss/max", "update/entropy", "update/lowest",
            "update/highest", "update/total", "update/n_valid", "timeperf/train_step",
            "timeperf/train_step__count", "reward", "reward__count", "seen/avg", "seen/min"} <= set(exported)  # fmt: skip


def test_the_export_is_areals_on_a_one_rank_group(one_process_group):
    exported = exports_alike(one_process_group)
    assert exported["timeperf/train_step__count"] == 3


def counted_reads(monkeypatch) -> list[str]:
    """Every read of a tensor's value by the host: `.item()`, `.tolist()`, and what `float()`,
    `bool()` and comparisons of a 0-dim tensor run (`_local_scalar_dense`)."""
    reads: list[str] = []
    for name in ("item", "tolist"):
        def counted(self, *args, _read=getattr(torch.Tensor, name), _name=name, **kwargs):
            reads.append(_name)
            return _read(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    from torch.utils._python_dispatch import TorchDispatchMode

    class Scalars(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default:
                reads.append("scalar")
            return func(*args, **(kwargs or {}))

    return reads, Scalars


def test_one_read_instead_of_one_or_two_per_statistic(monkeypatch, one_process_group):
    reads, Scalars = counted_reads(monkeypatch)
    theirs, ours = recorded(0), recorded(0)
    reads.clear()
    with Scalars():
        exported = areal_export()(theirs, reduce_group=one_process_group)
    assert len(reads) >= len(exported)  # AReaL: a read or more per statistic
    reads.clear()
    with Scalars():
        stats_export.export_once(areal_export())(ours, reduce_group=one_process_group)
    assert reads == ["tolist"]  # every statistic is on the CPU here: one device, one read


def test_several_ranks_run_areals_export(monkeypatch):
    calls = []

    def upstream(self, key=None, reduce_group=None, reset=True):
        calls.append(reduce_group)
        return {"from": "upstream"}

    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    group = object()
    assert stats_export.export_once(upstream)(recorded(0), reduce_group=group) == {"from": "upstream"}
    assert calls == [group]
    assert stats_export.export_all_once(lambda **kw: {"from": "upstream"})(reduce_group=group) == {"from": "upstream"}


def test_export_all_drains_every_tracker_as_areal_does(one_process_group):
    from areal.utils import stats_tracker

    stats_export.install()
    stats_export.install()  # idempotent
    assert stats_tracker.DistributedStatsTracker.export.reads_once
    assert stats_tracker.export.__func__ is stats_tracker.DistributedStatsTracker.export
    stats_tracker.get("rollout").scalar(reward=1.0)
    stats_tracker.get("rollout").scalar(reward=0.0)
    stats_tracker.scalar(lr=2e-5)
    exported = stats_tracker.export_all(reduce_group=one_process_group)
    lr = float(torch.tensor(2e-5, dtype=torch.float32))  # scalars are averaged in float32, as AReaL does
    assert exported == {"lr": lr, "lr__count": 1, "rollout/reward": 0.5, "rollout/reward__count": 2}
    assert stats_tracker.export_all(reduce_group=one_process_group) == {}


@pytest.mark.parametrize("values", [[3.0, 1.0, 2.0], [1.0, float("nan"), 0.5], [float("nan"), 1.0], [0.0, -0.0], [-0.0, 0.0]])
def test_min_and_max_as_python_computes_them(values):
    xs = [torch.tensor(v) for v in values]
    for mine, theirs in ((stats_export.python_extreme(xs, torch.lt), min(xs)), (stats_export.python_extreme(xs, torch.gt), max(xs))):
        assert float(mine) == float(theirs) or (math.isnan(mine) and math.isnan(theirs))
        assert math.copysign(1, mine) == math.copysign(1, theirs)  # ties: the first one, as Python keeps it
