"""The project's fixes in the workers of AReaL's single controller on Ray (`scheduler.type=ray`).

Upstream behaviour (areal 1.0.4): `RayScheduler` starts every training and rollout worker as
a Ray actor running AReaL's `RayRPCServer`; it never reads `scheduling_spec.cmd`, so
`python3 -m areal_patches.worker` (train_config.yaml's worker command, which installs the
fixes under the local and Slurm schedulers) never runs. The workers then compute and train
on AReaL's code as released: packed sequences attend to each other under `sdpa`, and none
of the other fixes apply.

Effect: `install` connects the controller to Ray before AReaL does, with Ray's
`worker_process_setup_hook`, which runs `setup_worker` in every worker process of the job
before any actor starts in it: each training and rollout worker installs the fixes, as
under the other schedulers, and says so in one line on the run's log. docs/results/areal-fixes.md
has what it changes in a run. The hook imports this package, so the
project must be importable on every node of the cluster (`pip install -e .`), as the worker
command needs it to be under the other schedulers.

Off: leave out the `ray_workers.install(...)` call in `train.py`'s or `sft.py`'s `main()`;
Ray then starts the workers as AReaL does.

Before connecting, `install` checks that something answers at the address RAY_ADDRESS names.
Upstream, `ray.init()` with an unreachable RAY_ADDRESS retries the connection for many
minutes, printing one GCS time-out after another; here the run stops at once with one line
that names RAY_ADDRESS (docs/areal-bugs.md).

Upstream: the cause is gone on main since 59c1043 (PR #1441), after the v2.0.0 tag and in no
release on PyPI: the Ray-native scheduler and its `RayRPCServer` actors were replaced by an HTTP
Ray scheduler that starts each worker with `scheduling_spec.cmd`, so `areal_patches.worker`
installs the fixes there as under the other schedulers. Drop the setup hook once an areal
release ships #1441; the RAY_ADDRESS check is about Ray's own `ray.init()` and not AReaL's to
fix.
"""

from __future__ import annotations

import os
import socket

INSTALLED = "areal_patches: the project's fixes are installed in this Ray worker"
CONNECT_TIMEOUT_S = 10.0


def install(scheduler_type: str | None) -> None:
    """Connect to Ray with the setup hook when the controller schedules on Ray; else nothing.

    `ray.init()` with no address joins the cluster that RAY_ADDRESS names (or the one
    `ray start` left on this node), as AReaL's own first Ray call would.
    """
    if scheduler_type != "ray":
        return
    if problem := unreachable_ray_address(os.environ.get("RAY_ADDRESS", "")):
        raise SystemExit(f"scheduler.type=ray: {problem}")
    import ray

    ray.init(runtime_env={"worker_process_setup_hook": f"{__name__}.setup_worker"})


def unreachable_ray_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> str | None:
    """Why nothing answers at RAY_ADDRESS's host:port, or None (also for no address, `auto`, `local`).

    A TCP connection is all it tries: it tells a wrong address or a cluster that is not up
    from one that is, without Ray's retries.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as e:
        return (f"nothing answers at RAY_ADDRESS={address} ({e.strerror or e}); start the "
                "cluster (`ray start --head` on its head node), set RAY_ADDRESS to its head's address "
                "(host:6379), or unset it to run on a Ray instance of this machine")  # fmt: skip
    return None


def setup_worker() -> None:
    """Ray runs this in each new worker process of the job: the fixes, as areal_patches.worker."""
    import areal_patches

    areal_patches.apply()
    print(f"{INSTALLED} (pid {os.getpid()})", flush=True)
