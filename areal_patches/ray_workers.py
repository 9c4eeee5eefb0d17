"""The project's fixes in the workers of AReaL's single controller on Ray (`scheduler.type=ray`).

Upstream behaviour (areal 1.0.4): `RayScheduler` starts every training and rollout worker as
a Ray actor running AReaL's `RayRPCServer`; it never reads `scheduling_spec.cmd`, so
`python3 -m areal_patches.worker` (train_config.yaml's worker command, which installs the
fixes under the local and Slurm schedulers) never runs. The workers then compute and train
on AReaL's code as released: packed sequences attend to each other under `sdpa`, and
`actor.pass_at_k` and `actor.entropy_coef` are silently ignored.

Effect: `install` connects the controller to Ray before AReaL does, with Ray's
`worker_process_setup_hook`, which runs `setup_worker` in every worker process of the job
before any actor starts in it: each training and rollout worker installs the fixes, as
under the other schedulers, and says so in one line on the run's log. docs/results.md
("scheduler.type=ray") has what it changes in a run. The hook imports this package, so the
project must be importable on every node of the cluster (`pip install -e .`), as the worker
command needs it to be under the other schedulers.

Off: leave out the `ray_workers.install(...)` call in `train.py`'s or `sft.py`'s `main()`;
Ray then starts the workers as AReaL does.
"""

from __future__ import annotations

import os

INSTALLED = "areal_patches: the project's fixes are installed in this Ray worker"


def install(scheduler_type: str | None) -> None:
    """Connect to Ray with the setup hook when the controller schedules on Ray; else nothing.

    `ray.init()` with no address joins the cluster that RAY_ADDRESS names (or the one
    `ray start` left on this node), as AReaL's own first Ray call would.
    """
    if scheduler_type != "ray":
        return
    import ray

    ray.init(runtime_env={"worker_process_setup_hook": f"{__name__}.setup_worker"})


def setup_worker() -> None:
    """Ray runs this in each new worker process of the job: the fixes, as areal_patches.worker."""
    import areal_patches

    areal_patches.install()
    print(f"{INSTALLED} (pid {os.getpid()})", flush=True)
