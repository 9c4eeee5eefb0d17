"""fewer_syncs.py reads the GPU less often in GRPO's reward normalisation and staleness
statistics, and computes AReaL's numbers."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from areal_patches import fewer_syncs


class CountingSyncs(TorchDispatchMode):
    """Counts the ops that wait for the GPU on CUDA (.item(), bool(), nonzero, boolean-mask
    indexing) and `.tolist()` calls, which run no aten op on a CPU tensor."""

    def __init__(self):
        super().__init__()
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        boolean_index = name == "aten::index" and any(i is not None and i.dtype == torch.bool for i in args[1])
        self.syncs += name in ("aten::_local_scalar_dense", "aten::nonzero", "aten::is_nonzero") or boolean_index
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self.tolist = torch.Tensor.tolist

        def counted(tensor, *args):
            self.syncs += 1
            return self.tolist(tensor, *args)

        torch.Tensor.tolist = counted
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self.tolist
        return super().__exit__(*exc)


def areal_normalisation_call():
    """AReaL's Normalization.__call__, whether or not fewer_syncs is installed in this process."""
    from areal.utils.data import Normalization

    call = Normalization.__call__
    return call.__wrapped__ if getattr(call, "normalises_groups_at_once", False) else call


def normalisation(mean_level="group", std_level="group", group_size=8, unbiased=True, leave1out=False, eps=1e-5):
    from areal.api.cli_args import NormConfig
    from areal.utils.data import Normalization

    return Normalization(NormConfig(mean_level=mean_level, std_level=std_level, group_size=group_size,
                                    std_unbiased=unbiased, mean_leave1out=leave1out, eps=eps))  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    n_groups=st.integers(1, 70), group_size=st.sampled_from([2, 3, 8, 16]), unbiased=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-6, 0.0]), kind=st.sampled_from(["binary", "uniform", "countdown"]),
    seed=st.integers(0, 2**31 - 1),
)  # fmt: skip
def test_group_normalisation_at_once_gives_areals_rewards_bit_for_bit(n_groups, group_size, unbiased, eps, kind, seed):
    """Rewards as GRPO normalises them (per sequence, groups of completions of one prompt),
    including groups whose rewards are all alike (zero deviation)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (n_groups * group_size,)
    rewards = {"binary": lambda: torch.randint(0, 2, shape, generator=gen).float(),
               "uniform": lambda: torch.rand(shape, generator=gen) * 10 - 5,
               "countdown": lambda: torch.randint(0, 11, shape, generator=gen).float() / 10}[kind]()  # fmt: skip
    norm = normalisation(group_size=group_size, unbiased=unbiased, eps=eps)
    areal = areal_normalisation_call()
    want, got = areal(norm, rewards), fewer_syncs.normalise(areal)(norm, rewards)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.isnan(), want.isnan())  # eps 0 and a group of equal rewards: 0/0 in both
    assert torch.equal(got.nan_to_num(), want.nan_to_num())


def test_group_normalisation_of_a_grpo_batch_reads_the_gpu_never_where_areal_reads_it_per_group():
    rewards = torch.randint(0, 2, (512,), generator=torch.Generator().manual_seed(0)).float()
    norm, areal = normalisation(), areal_normalisation_call()
    counts = []
    for call in (areal, fewer_syncs.normalise(areal)):
        with CountingSyncs() as mode:
            call(norm, rewards)
        counts.append(mode.syncs)
    assert counts == [2 * 64, 0]


@pytest.mark.parametrize("settings_, with_mask", [
    (dict(mean_level="batch", std_level="batch"), True),  # adv_norm: AReaL's own code
    (dict(leave1out=True), False),
    (dict(group_size=8), True),
])  # fmt: skip
def test_other_normalisations_run_areals_code(settings_, with_mask):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(24, 10, generator=gen)
    mask = torch.randint(0, 2, (24, 10), generator=gen).float() if with_mask else None
    norm, areal = normalisation(**settings_), areal_normalisation_call()
    with CountingSyncs() as areal_mode:
        want = areal(norm, x, mask)
    with CountingSyncs() as fixed_mode:
        got = fewer_syncs.normalise(areal)(norm, x, mask)
    assert torch.equal(got, want) and fixed_mode.syncs == areal_mode.syncs > 0


def areal_staleness_function():
    from areal.trainer.ppo import actor

    return getattr(actor, "_areal_log_version_staleness_stats", actor._log_version_staleness_stats)


def logged(function, *args) -> tuple[dict, int]:
    """What `function` logs (AReaL's stats tracker, exported) and the syncs it made."""
    from areal.utils import stats_tracker

    stats_tracker.export()  # start from an empty tracker
    with CountingSyncs() as mode:
        function(*args)
    return stats_tracker.export(), mode.syncs


@settings(max_examples=100, deadline=None)
@given(
    rows=st.integers(1, 6), width=st.integers(1, 300), current=st.integers(0, 500),
    lag=st.integers(0, 40), generated=st.floats(0, 1), seed=st.integers(0, 2**31 - 1),
)  # fmt: skip
def test_staleness_statistics_are_areals_with_one_read(rows, width, current, lag, generated, seed):
    """A packed micro-batch's versions (-1 at prompt tokens) and a token mask, including
    micro-batches with no generated token under the mask (AReaL logs no scalars then)."""
    gen = torch.Generator().manual_seed(seed)
    versions = current - torch.randint(0, lag + 1, (rows, width), generator=gen)
    versions[torch.rand(rows, width, generator=gen) >= generated] = -1
    mask = torch.rand(rows, width, generator=gen) < 0.7
    want, want_syncs = logged(areal_staleness_function(), versions, current, mask)
    got, got_syncs = logged(fewer_syncs.log_version_staleness_stats, versions, current, mask)
    assert got == want
    assert got_syncs == 1
    assert want_syncs == (10 if (mask & (versions >= 0)).any() else 1)


def test_install_replaces_both_once_and_keeps_areals_functions():
    from areal.trainer.ppo import actor
    from areal.utils.data import Normalization

    fewer_syncs.install()
    call, staleness = Normalization.__call__, actor._log_version_staleness_stats
    fewer_syncs.install()
    assert Normalization.__call__ is call and actor._log_version_staleness_stats is staleness
    assert staleness is fewer_syncs.log_version_staleness_stats
    assert actor._areal_log_version_staleness_stats.__name__ == "_log_version_staleness_stats"
    assert call.normalises_groups_at_once and call.__wrapped__.__qualname__ == "Normalization.__call__"


def side_by_side(stdout: str) -> dict[str, list[int]]:
    """experiments/bench/update_overheads' last table: phase -> ops and syncs, upstream then fixed."""
    rows = [line.strip("| ").split(" | ") for line in stdout.splitlines() if line.count("|") == 8]
    return {r[0]: [int(v) for v in r[1:5]] for r in rows if len(r) == 7 and r[1].isdigit()}


def test_the_bench_counts_the_syncs_the_fix_removes_and_no_others():
    """The counting bench on 16 sequences (2 groups, 2 minibatches): group normalisation's two
    reads per group and the staleness statistics' ten per minibatch go; nothing else moves."""
    import subprocess
    import sys

    from devkit import ROOT

    run = subprocess.run([sys.executable, "-m", "experiments.bench.update_overheads", "--seqs", "16", "--steps", "0",
                          "--ab", "fewer_syncs"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    table = side_by_side(run.stdout)
    assert table["compute_advantages"][2:] == [3 + 2 * 2, 3]
    assert table["loss: staleness statistics"][2:] == [2 * 10, 2 * 1]
    unchanged = {name: counts for name, counts in table.items()
                 if name not in ("compute_advantages", "loss: staleness statistics")}
    assert unchanged and all(ops == ops_fixed and syncs == syncs_fixed
                             for ops, ops_fixed, syncs, syncs_fixed in unchanged.values())
