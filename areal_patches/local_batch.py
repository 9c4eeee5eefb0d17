"""On one training rank, hand the rollout batch to the trainer as it is: no collectives.

Upstream behaviour (areal 1.0.4): after `prepare_batch` (and `rollout_batch`) the SPMD trainer
passes the batch through `DistRolloutCoordinator._broadcast_and_redistribute_trajectories`,
which spreads it over the data-parallel ranks and broadcasts it to the context- and
model-parallel ones, whatever their number. On one GPU both groups hold one rank, and still
`all_gather_tensor_container` runs an `all_gather_object` for every trajectory's keys and for
every tensor's shape, plus an `all_gather` of the tensor, then one `.item()` a trajectory for
its length and another for its padding, then `broadcast_tensor_container` broadcasts each
tensor with its metadata, and two device synchronisations and barriers close it: over 2,000
collectives for a 64-puzzle batch (`tests/test_local_batch.py` counts them). Each waits for
the GPU, which the dev server shares, and all of them run Python under the interpreter lock
that the rollout client's thread needs to send the next requests. In the trainer's profile on one GPU this was
most of its "wait for rollouts" while the batch was already complete, and it held the next
step's requests back from the server.

Effect: where the data-parallel group and the context-and-model-parallel group both hold
one rank, the batch is the one upstream's code would return: the same trajectories, with
their trailing padding trimmed as `split_and_unpad_tensor` trims it, in the order the
configured packing algorithm (`mb_spec.packing_algorithm`) gives them, the lengths read from
the device in one go. Anywhere else, upstream's code runs unchanged. Measured on one GPU
that the dev server shares (docs/results/areal-fixes.md): the wait goes, but the step does not
get shorter, because the server then decodes beside the update and push and they slow as
much. Where the servers have GPUs of their own nothing should take the freed time back; that
is not measured.

Off: `AREAL_PATCHES_SKIP=local_batch` (or `apply(skip={"local_batch"})`).

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22); not reported.
"""

from __future__ import annotations

from typing import Any

import torch

Trajectory = dict[str, Any]


def one_rank(train_engine) -> bool:
    """Whether the trainer's batch stays on the one rank that made it: a data-parallel group
    and a context-and-model-parallel group of one rank each."""
    import torch.distributed as dist

    return (dist.get_world_size(train_engine.data_parallel_group) == 1
            and dist.get_world_size(train_engine.context_and_model_parallel_group) == 1)


def lengths(trajectories: list[Trajectory]) -> tuple[list[int], list[int]]:
    """Each trajectory's tokens (its attention mask's sum) and its longest row, in one read."""
    masks = [t["attention_mask"] for t in trajectories]
    read = torch.stack([torch.stack([m.sum(), m.sum(-1).max()]) for m in masks]).tolist()
    return [int(tokens) for tokens, _ in read], [int(longest) for _, longest in read]


def local_batch(trajectories: list[Trajectory], packing_algorithm: str) -> list[Trajectory]:
    """What upstream's redistribution returns on one rank: each trajectory trimmed to its
    longest row, in the order of the packing algorithm's one group."""
    from areal.utils.data import split_and_unpad_tensor
    from areal.utils.seqpack import get_allocate_fn

    if not trajectories:
        return []
    tokens, longest = lengths(trajectories)
    trimmed = [
        split_and_unpad_tensor(t, n_trajs=1, traj_group_sizes=[t["attention_mask"].shape[0]], traj_seqlens=[n])[0]
        for t, n in zip(trajectories, longest)
    ]
    (order,) = get_allocate_fn(packing_algorithm)(tokens, capacity=int(1e12), min_groups=1)
    return [trimmed[i] for i in order]


def redistribute(original):
    """`DistRolloutCoordinator._broadcast_and_redistribute_trajectories`, without collectives
    on one rank."""

    def call(self, trajectories):
        if trajectories is None or not one_rank(self.train_engine):
            return original(self, trajectories)
        mb_spec = getattr(getattr(self.train_engine, "config", None), "mb_spec", None)
        return local_batch(trajectories, getattr(mb_spec, "packing_algorithm", "ffd"))

    return call


def install() -> None:
    """The replacement in this process (idempotent)."""
    from areal.infra.dist_rollout import DistRolloutCoordinator

    from areal_patches.patching import wrap_once

    wrap_once(DistRolloutCoordinator, "_broadcast_and_redistribute_trajectories", redistribute, "keeps_one_rank_batch")
