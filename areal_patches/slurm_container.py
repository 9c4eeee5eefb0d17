"""Each job's own container settings under AReaL's single controller on Slurm (`scheduler.type=slurm`).

Upstream behaviour (areal 1.0.4): `SlurmScheduler` takes `container_type` ("apptainer") and
`container_mounts` from its constructor, and the trainers build it from the config alone
(`SlurmScheduler(exp_config=...)`), so every worker starts as `singularity exec ... <image>`
whatever `scheduling_spec.container_type` and `mount` say (the SPMD Slurm launcher reads
them). On a cluster without Singularity the worker's job fails at once (`execve():
singularity: No such file or directory`, in the role's log only) and the controller waits out
its start-up timeout (300 s) before `WorkerTimeoutError: Timeout waiting for worker 'actor'`.

Effect: each job's sbatch script is written with its own spec's `container_type` and `mount`:
`container_type: none` runs the worker command as it is, `apptainer` (the default) as before.

Off: `areal_patches.apply(skip={"slurm_container"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0 tag (the
trainers still build `SlurmScheduler(exp_config=...)` with the constructor's container
defaults); not reported.
"""

from __future__ import annotations

import inspect

from areal_patches.patching import wrap_once


def install() -> None:
    from areal.infra.scheduler.slurm import SlurmScheduler

    wrap_once(SlurmScheduler, "_generate_sbatch_script", with_spec_container, "reads_spec_container")


def with_spec_container(generate):
    """`SlurmScheduler._generate_sbatch_script`, with the job's first spec's container settings."""
    signature = inspect.signature(generate)

    def _generate_sbatch_script(self, *args, **kwargs):
        spec = signature.bind(self, *args, **kwargs).arguments["schedulings"][0]
        saved = self.container_type, self.container_mounts
        self.container_type, self.container_mounts = spec.container_type, spec.mount
        try:
            return generate(self, *args, **kwargs)
        finally:
            self.container_type, self.container_mounts = saved

    return _generate_sbatch_script
