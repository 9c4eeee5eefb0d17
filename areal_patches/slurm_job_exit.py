"""A worker job that fails ends as FAILED under AReaL's single controller on Slurm (`scheduler.type=slurm`).

Upstream behaviour (areal 1.0.4): `SlurmScheduler` writes each worker job as one pipeline,
`srun ... 2>&1 | tee -a <role log> >(sed ... >> <merged log>)`, and bash gives a pipeline the
exit status of its last command, `tee`'s. A worker that fails at start (a container runtime
the node lacks, a Python without the project, a bad worker command) therefore ends its job
COMPLETED, not FAILED. The controller's wait (`get_workers`) stops early only for FAILED or
CANCELLED jobs, so it waits out its whole start-up timeout (300 s) and then says
`WorkerTimeoutError`, with the cause in the role's log only.

Effect: each job script sets bash's `pipefail` option, so the job ends with srun's status:
Slurm marks it FAILED, and AReaL's own status check ends the wait within seconds with
`WorkerFailedError: Job <id> FAILED`, followed by the last lines of the role's log.
docs/results/areal-fixes.md ("The single controller on Slurm") has the measurement.

Off: `areal_patches.apply(skip={"slurm_job_exit"})`.

Upstream: the long wait is fixed on main in e786869 (PR #1583: every terminal job state,
COMPLETED included, ends the wait with `WorkerFailedError` and the log tail), after the v2.0.0
tag and in no release on PyPI. The job script there is still a pipeline without `pipefail`, so
such a job still ends COMPLETED rather than FAILED. Drop this fix once an areal release ships
#1583.
"""

from __future__ import annotations

from areal_patches.patching import wrap_once

PIPEFAIL = "set -o pipefail  # areal_patches.slurm_job_exit: the job ends with the worker's status"


def install() -> None:
    from areal.infra.scheduler.slurm import SlurmScheduler

    wrap_once(SlurmScheduler, "_generate_sbatch_script", with_pipefail, "sets_pipefail")


def with_pipefail(generate):
    """`SlurmScheduler._generate_sbatch_script`, with `set -o pipefail` after the #SBATCH lines."""

    def _generate_sbatch_script(self, *args, **kwargs):
        return pipefail_after_options(generate(self, *args, **kwargs))

    return _generate_sbatch_script


def pipefail_after_options(script: str) -> str:
    """`script` with PIPEFAIL after its shebang and #SBATCH lines (sbatch reads no option after a command)."""
    lines = script.splitlines()
    header = 1 + max((i for i, line in enumerate(lines) if line.startswith("#SBATCH")), default=0)
    return "\n".join([*lines[:header], PIPEFAIL, *lines[header:]]) + "\n"
