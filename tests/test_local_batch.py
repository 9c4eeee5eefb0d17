"""local_batch.py keeps a one-rank trainer's rollout batch where it is: the trajectories AReaL's
redistribution returns, in its order, without a collective. Runs AReaL's own code on a
one-process gloo group for the reference."""

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from areal_patches import local_batch


def coordinator(group, packing_algorithm="ffd"):
    """AReaL's DistRolloutCoordinator over an engine whose every group is `group`."""
    from areal.infra.dist_rollout import DistRolloutCoordinator

    engine = SimpleNamespace(
        data_parallel_group=group, context_and_model_parallel_group=group, cpu_group=group,
        config=SimpleNamespace(mb_spec=SimpleNamespace(packing_algorithm=packing_algorithm)),
        current_data_parallel_head=lambda: 0,
    )  # fmt: skip
    return DistRolloutCoordinator(rollout_engine=None, train_engine=engine)


def areal_redistribution():
    """AReaL's method, whether or not local_batch is installed in this process."""
    from areal.infra.dist_rollout import DistRolloutCoordinator

    method = DistRolloutCoordinator._broadcast_and_redistribute_trajectories
    return getattr(method, "__wrapped__", method)


def trajectories(seed: int, groups: int = 12, group_size: int = 4) -> list[dict]:
    """Groups as CountDownWorkflow's grouped rollouts make them: right-padded rows of different
    lengths, a padded width that some groups fill and others do not, and a non-tensor entry."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(groups):
        width = int(torch.randint(6, 40, (1,), generator=g))
        lens = torch.randint(1, width + 1, (group_size,), generator=g)
        if i % 3 == 0:
            lens[0] = width  # this group's longest row fills its width: nothing to trim
        pad = int(torch.randint(0, 5, (1,), generator=g))
        mask = torch.arange(width + pad)[None, :] < lens[:, None]
        out.append({
            "input_ids": torch.randint(0, 1000, (group_size, width + pad), generator=g) * mask,
            "attention_mask": mask,
            "loss_mask": mask.int(),
            "logprobs": torch.randn(group_size, width + pad, generator=g) * mask,
            "versions": torch.full((group_size, width + pad), i, dtype=torch.int64),
            "rewards": torch.randn(group_size, generator=g),
            "tag": f"group {i}",
        })  # fmt: skip
    return out


def assert_same_batch(ours: list[dict], theirs: list[dict]) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.keys() == b.keys()
        for key in a:
            if torch.is_tensor(a[key]):
                assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
                assert torch.equal(a[key], b[key]), key
            else:
                assert a[key] == b[key], key


@pytest.mark.parametrize("packing_algorithm", ["ffd", "kk"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_rank_gets_areals_batch_in_areals_order(one_process_group, packing_algorithm, seed):
    coord = coordinator(one_process_group, packing_algorithm)
    theirs = areal_redistribution()(coord, trajectories(seed))
    ours = local_batch.redistribute(areal_redistribution())(coord, trajectories(seed))
    assert [t["tag"] for t in theirs] != [f"group {i}" for i in range(12)]  # the order is the packing's, not the input's
    assert_same_batch(ours, theirs)


def test_one_rank_runs_no_collective(one_process_group, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a collective ran on one rank")

    for name in ("all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier"):
        monkeypatch.setattr(dist, name, refuse)
    coord = coordinator(one_process_group)
    with pytest.raises(AssertionError, match="a collective ran"):
        areal_redistribution()(coord, trajectories(0))
    batch = local_batch.redistribute(areal_redistribution())(coord, trajectories(0))
    assert len(batch) == 12


def test_areals_redistribution_on_one_rank_moves_every_tensor_twice(one_process_group, monkeypatch):
    """What the fix saves: AReaL all-gathers and broadcasts each of a batch's tensors, each with
    its metadata, on one rank as on many (64 groups of 6 tensors, as the trainer's batch)."""
    counts = {}
    for name in ("all_gather", "all_gather_object", "broadcast", "broadcast_object_list", "barrier"):
        def counted(*args, _call=getattr(dist, name), _name=name, **kwargs):
            counts[_name] = counts.get(_name, 0) + 1
            return _call(*args, **kwargs)

        monkeypatch.setattr(dist, name, counted)
    batch = [{k: v for k, v in t.items() if k != "tag"} for t in trajectories(0, groups=64, group_size=8)]
    areal_redistribution()(coordinator(one_process_group), batch)
    assert counts["all_gather"] == counts["broadcast"] == 64 * 6
    assert counts["all_gather_object"] > 64 * 6 and counts["broadcast_object_list"] > 2 * 64 * 6
    assert sum(counts.values()) > 2000


def test_more_than_one_rank_runs_areals_code(one_process_group, monkeypatch):
    """Mocked: a group of two needs two processes; what matters is which code runs."""
    calls = []
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    redistribute = local_batch.redistribute(lambda self, trajectories: calls.append(trajectories) or "areal's")
    batch = trajectories(0)
    assert redistribute(coordinator(one_process_group), batch) == "areal's"
    assert calls == [batch]


def test_a_rank_without_the_batch_runs_areals_code(one_process_group):
    redistribute = local_batch.redistribute(lambda self, trajectories: "areal's")
    assert redistribute(coordinator(one_process_group), None) == "areal's"


def test_an_empty_batch_stays_empty():
    assert local_batch.local_batch([], "ffd") == []


def test_install_is_idempotent():
    from areal.infra.dist_rollout import DistRolloutCoordinator

    local_batch.install()
    first = DistRolloutCoordinator._broadcast_and_redistribute_trajectories
    local_batch.install()
    assert DistRolloutCoordinator._broadcast_and_redistribute_trajectories is first
    assert first.keeps_one_rank_batch
