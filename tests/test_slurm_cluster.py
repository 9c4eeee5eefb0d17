"""devkit/launch/slurm_cluster.py: the one-node cluster schedules fake GPUs, CPUs and memory for
srun and sbatch, and leaves no Slurm process behind, even with a job still running.

This is the ground the tests of AReaL's Slurm launcher stand on. It needs root (it
installs Slurm with apt if missing and runs slurmd and munged); elsewhere it is skipped.
"""

import os
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from devkit.launch import slurm_cluster

pytestmark = pytest.mark.launchers

SLURM_PROCESSES = {"slurmctld", "slurmd", "slurmstepd"}
SLEEPER = ["sleep", "613"]  # a job's command line that nothing else on the machine has


def live_processes(names: set[str], cmdline: list[str] | None = None) -> set[int]:
    """Pids of running processes with one of these names, or with this command line.

    Zombies are left aside: they are dead, and it is init that reaps orphans.
    """
    pids = set()
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text()
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
        except OSError:  # the process ended while we looked
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        if (name in names or args == cmdline) and state != "Z":
            pids.add(int(proc.name))
    return pids


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)


def test_cluster_runs_jobs_and_cleans_up(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: it installs Slurm and runs slurmd and munged")
    slurm_cluster.install()
    before = live_processes(SLURM_PROCESSES, SLEEPER)
    cpus = min(2, os.cpu_count() or 1)

    # The cluster in a short folder: slurmd's socket paths have 107 bytes at most, and
    # pytest-xdist's temp folders are long.
    with tempfile.TemporaryDirectory(prefix="slurm-", dir="/tmp") as short, \
            slurm_cluster.cluster(Path(short), gpus=2) as env:
        assert live_processes({"slurmctld", "slurmd"}) - before

        srun = run(["srun", "--gres=gpu:1", "bash", "-c", "echo $CUDA_VISIBLE_DEVICES"], env)
        assert srun.returncode == 0, srun.stderr
        assert srun.stdout.strip() == "0"
        too_many = run(["srun", "--gres=gpu:3", "true"], env)
        assert too_many.returncode != 0
        assert "Requested node configuration is not available" in too_many.stderr

        # The options AReaL's launcher puts in its sbatch scripts: CPUs, memory, all GPUs.
        out = tmp_path / "job.out"
        script = tmp_path / "job.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"#SBATCH --nodes=1-1 --ntasks-per-node=1 --cpus-per-task={cpus} --mem=1024M\n"
            "#SBATCH --gres=gpu:2 --no-requeue --open-mode=append\n"
            'echo "cpus=$SLURM_CPUS_PER_TASK gpus=$CUDA_VISIBLE_DEVICES"\n'
        )
        sbatch = run(["sbatch", "--wait", f"--output={out}", str(script)], env)
        assert sbatch.returncode == 0, sbatch.stderr
        assert out.read_text().strip() == f"cpus={cpus} gpus=0,1"

        # A job still running when the cluster stops must not outlive it.
        sleeper = run(["sbatch", "--output=/dev/null", "--wrap", " ".join(SLEEPER)], env)
        assert sleeper.returncode == 0, sleeper.stderr
        deadline = time.monotonic() + 30
        while not live_processes(set(), SLEEPER) - before:
            assert time.monotonic() < deadline, run(["squeue"], env).stdout
            time.sleep(0.2)

    assert not live_processes(SLURM_PROCESSES, SLEEPER) - before
