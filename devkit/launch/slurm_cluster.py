"""A throwaway one-node Slurm cluster on this machine, for tests of AReaL's Slurm launcher.

`python3 -m areal.infra.launcher.slurm` only talks to Slurm through sbatch, srun, squeue
and scancel, so a real (if tiny) cluster is the only faithful way to test it without a
shared one. This module installs Debian's Slurm and MUNGE, writes a private slurm.conf
into a work folder, runs slurmctld and slurmd in the foreground as child processes and
tears everything down again. Nothing system-wide changes beyond the apt install and
MUNGE's runtime folder: the configuration lives in the work folder and every Slurm
command finds it through SLURM_CONF, so the environment that `cluster()` yields is the
one callers must use for srun, sbatch and the launcher.

It needs root (slurmd launches jobs as their submitting user, munged must run as the
munge user) and no systemd. Fake GPUs are device files that every machine has
(/dev/null, /dev/zero, ...) declared as GRES, so `--gres=gpu:N` is scheduled, counted
and answered with CUDA_VISIBLE_DEVICES.

    python3 -m devkit.launch.slurm_cluster up DIR [--gpus N] [--cpus N] [--mem-mb MB]  # until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from devkit.processes import find_free_port, plain, sigterm_raises, stop_group, tail

PACKAGES = ("slurm-wlm", "munge")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
MUNGE_KEY = Path("/etc/munge/munge.key")
MUNGE_RUN_DIR = Path("/run/munge")
# Device files that exist everywhere; slurmd refuses a GRES file listed twice, so each
# fake GPU needs a distinct one.
FAKE_GPU_FILES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def install() -> bool:
    """Install Slurm and MUNGE with apt unless slurmctld is already on PATH.

    Returns True if it installed. Debian's packages try to start their services, which
    fails quietly without systemd; `cluster()` starts the daemons itself.
    """
    if shutil.which("slurmctld"):
        return False
    _require_root("install slurm-wlm and munge with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", *PACKAGES]):
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(
                f"`{' '.join(argv)}` failed with exit code {done.returncode}:\n"
                + tail(done.stdout + done.stderr)
            )
    return True


@contextlib.contextmanager
def cluster(
    workdir: Path, gpus: int = 2, cpus: int | None = None, mem_mb: int | None = None
) -> Iterator[dict[str, str]]:
    """Run a one-node Slurm cluster whose files all live in `workdir`.

    Yields the environment (os.environ plus SLURM_CONF) in which sbatch, srun, squeue,
    scancel and AReaL's launcher reach this cluster. The node offers `gpus` fake GPUs
    and, by default, this machine's CPUs and 95% of its memory (slurmd drains a node
    that has less than its configured memory). `cpus` and `mem_mb` advertise more than
    the machine has, so that jobs sized for a real GPU node (AReaL asks for 8 CPUs and
    32 GB per GPU by default, plus 10 GB per job) can be scheduled; nothing enforces
    either limit here (no cgroups), so small jobs still run. On exit all jobs are
    cancelled and the daemons stopped; munged too if this call started it.
    """
    _require_root("run slurmd and munged")
    if gpus > len(FAKE_GPU_FILES):
        raise ValueError(f"at most {len(FAKE_GPU_FILES)} fake GPUs, asked for {gpus}")
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    conf = _write_config(workdir, gpus, cpus, mem_mb)
    env = dict(os.environ, SLURM_CONF=str(conf))
    procs: dict[str, subprocess.Popen] = {}
    try:
        munged = _start_munged(workdir)
        if munged is not None:
            procs["munged"] = munged
        # -c: start from a clean state even if an earlier run in this folder left one.
        procs["slurmctld"] = _spawn(["slurmctld", "-D", "-c"], workdir, env)
        procs["slurmd"] = _spawn(["slurmd", "-D"], workdir, env)
        _wait_idle(procs, workdir, env)
        yield env
    finally:
        _cancel_jobs(env)
        # slurmd before slurmctld, so that the controller sees the node go; munged last,
        # since both daemons authenticate through it until they exit.
        for name in ("slurmd", "slurmctld", "munged"):
            if name in procs:
                stop_group(procs[name], STOP_TIMEOUT_S)


def _require_root(what: str) -> None:
    """Fail early and clearly instead of deep inside apt-get or slurmd."""
    if os.geteuid() != 0:
        raise PermissionError(f"root is needed to {what}; run this as root")


def _node_hardware() -> dict[str, int]:
    """This machine's CPU topology and memory (MB), as slurmd itself will report them."""
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, check=True).stdout
    fields = dict(item.split("=", 1) for item in out.splitlines()[0].split())
    keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore", "RealMemory")
    return {key: int(fields[key]) for key in keys}


def _write_config(workdir: Path, gpus: int, cpus: int | None, mem_mb: int | None) -> Path:
    """Write slurm.conf (and gres.conf) for this host as the only node; return slurm.conf."""
    host = socket.gethostname().split(".")[0]  # what slurmd matches NodeName against
    hardware = _node_hardware()
    hardware["RealMemory"] = mem_mb or hardware["RealMemory"] * 95 // 100
    if cpus:
        # Sockets, cores and threads must multiply up to CPUs; one core per CPU does.
        hardware = {"CPUs": cpus, "RealMemory": hardware["RealMemory"]}
    node = " ".join(f"{key}={value}" for key, value in hardware.items())
    # slurmd puts a Unix socket per job step, <spool>/<host>_<job>.<step>, in its spool
    # folder, and such a path may have 107 bytes at most: otherwise steps fail late.
    socket_path = f"{workdir}/spool/{host}_4294967294.4294967294"
    if len(socket_path.encode()) > 107:
        raise ValueError(f"{workdir} is too long a path for slurmd's sockets; use a shorter one")
    for sub in ("state", "spool"):
        (workdir / sub).mkdir(exist_ok=True)
    lines = [
        "ClusterName=areal-test",
        # 127.0.0.1 spares us from depending on the host name resolving to this machine.
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={find_free_port()}",
        f"SlurmdPort={find_free_port()}",
        "SlurmUser=root",
        "AuthType=auth/munge",
        f"StateSaveLocation={workdir / 'state'}",
        f"SlurmdSpoolDir={workdir / 'spool'}",
        f"SlurmctldPidFile={workdir / 'slurmctld.pid'}",
        f"SlurmdPidFile={workdir / 'slurmd.pid'}",
        # No cgroups in a container without systemd: track job processes by their parents.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        # Memory is consumable, as on real clusters, so --mem and --mem-per-cpu are
        # checked; a job that gives neither gets a per-CPU share, not the whole node.
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={hardware['RealMemory'] // hardware['CPUs']}",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "MpiDefault=none",
        # A node that went down (slurmd restarted, say) takes jobs again when it is back.
        "ReturnToService=2",
        # scancel's SIGTERM turns into SIGKILL after 5 s (not 30), within STOP_TIMEOUT_S.
        "KillWait=5",
        "MailProg=/bin/true",
    ]
    if cpus or mem_mb:
        # Trust slurm.conf over what slurmd finds, instead of draining the node.
        lines.append("SlurmdParameters=config_overrides")
    gres = ""
    if gpus:
        lines.append("GresTypes=gpu")
        gres = f" Gres=gpu:{gpus}"
        (workdir / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={host} Name=gpu File={','.join(FAKE_GPU_FILES[:gpus])}\n"
        )
    lines += [
        f"NodeName={host} NodeAddr=127.0.0.1 {node}{gres} State=UNKNOWN",
        f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = workdir / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _munge_works() -> bool:
    return subprocess.run(["munge", "-n"], capture_output=True).returncode == 0


def _start_munged(workdir: Path) -> subprocess.Popen | None:
    """Start munged unless one already answers; return it if this call started it.

    Slurm authenticates every message with MUNGE. munged runs in the foreground as a
    child so that it can be stopped with the cluster.
    """
    if _munge_works():
        return None
    if not MUNGE_KEY.exists():
        raise RuntimeError(
            f"{MUNGE_KEY} is missing; create it with `mungekey --create` "
            "(or `create-munge-key` on older MUNGE), owned by munge:munge, mode 0400"
        )
    MUNGE_RUN_DIR.mkdir(exist_ok=True)
    shutil.chown(MUNGE_RUN_DIR, "munge", "munge")
    proc = _spawn(["munged", "--foreground"], workdir, os.environ, user="munge")
    deadline = time.monotonic() + 10
    while not _munge_works():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_group(proc, STOP_TIMEOUT_S)
            raise RuntimeError(
                "munged did not start:\n" + tail((workdir / "munged.log").read_text())
            )
        time.sleep(0.1)
    return proc


def _spawn(
    argv: list[str], workdir: Path, env: Mapping[str, str], user: str | None = None
) -> subprocess.Popen:
    """Start a daemon in the foreground with its output in workdir/<name>.log.

    A session of its own keeps a terminal's Ctrl-C away from it, so that the daemons are
    stopped in order by `cluster()` rather than all at once by the signal.
    """
    with open(workdir / f"{Path(argv[0]).name}.log", "ab") as log:
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, user=user, group=user,
            extra_groups=[] if user else None,
            cwd=workdir, start_new_session=True,
        )  # fmt: skip


def _wait_idle(procs: dict[str, subprocess.Popen], workdir: Path, env: dict[str, str]) -> None:
    """Wait until sinfo reports the node idle; raise with the daemon's log if one died."""
    deadline = time.monotonic() + START_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        for name, proc in procs.items():
            if proc.poll() is not None:
                log = tail((workdir / f"{name}.log").read_text())
                raise RuntimeError(f"{name} exited with code {proc.returncode}:\n{log}")
        try:
            sinfo = subprocess.run(
                ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10
            )
            state = (sinfo.stdout + sinfo.stderr).strip()
        except subprocess.TimeoutExpired:
            state = "sinfo timed out"
        if state == "idle":
            return
        time.sleep(0.2)
    logs = "\n".join(
        f"--- {name}.log\n" + tail((workdir / f"{name}.log").read_text(), 15)
        for name in ("slurmctld", "slurmd")
    )
    raise TimeoutError(
        f"the node is not idle after {START_TIMEOUT_S:.0f} s (sinfo: {state!r})\n{logs}"
    )


def _cancel_jobs(env: dict[str, str]) -> None:
    """Cancel every job and wait (bounded) until they are gone.

    With proctrack/linuxproc it is slurmstepd that kills a job's processes, so the jobs
    must end before slurmd stops, or their processes would outlive the cluster.
    """
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            squeue = subprocess.run(
                ["squeue", "-h", "-o", "%A"], env=env, capture_output=True, text=True, timeout=5
            )
        except subprocess.TimeoutExpired:
            return
        jobs = squeue.stdout.split()
        if squeue.returncode != 0 or not jobs:
            return
        subprocess.run(["scancel", *jobs], env=env, capture_output=True, timeout=5)
        time.sleep(0.5)


# Where AReaL's Slurm jobs write their output: <fileroot>/logs/<user>/<experiment>/<trial>/<job>.log
JOB_LOGS = "logs/*/*/*/*.log"


def tail_job_logs(run_dir: Path, echo: Callable[[str], None], done: threading.Event) -> None:
    """Pass each new complete line of the run's job logs to `echo` until `done` is set."""
    seen: dict[Path, int] = {}
    while True:
        last = done.is_set()
        for path in sorted(run_dir.glob(JOB_LOGS)):
            with path.open("rb") as f:
                f.seek(seen.get(path, 0))
                text = f.read()
            end = text.rfind(b"\n") + 1
            seen[path] = seen.get(path, 0) + end
            for line in text[:end].decode(errors="replace").splitlines():
                echo(line)
        if last:
            return
        done.wait(0.5)


@contextlib.contextmanager
def for_run(run_dir: Path, echo: Callable[[str], None]) -> Iterator[dict[str, str]]:
    """A cluster for one run of AReaL's Slurm launcher with `run_dir` as its fileroot; yields
    the environment its commands need (SLURM_CONF).

    The jobs write their output to their own logs, not to the launcher's: `echo` gets their
    lines as they come, and the logs are added, without colours, to the run's full log
    (train.log) at the end, with the daemons' logs kept in run_dir/slurm. The cluster lives in
    a short temporary folder: slurmd's per-step socket paths may have 107 bytes at most.
    """
    done = threading.Event()
    job_logs = threading.Thread(target=tail_job_logs, args=(run_dir, echo, done), daemon=True)
    workdir = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
    try:
        install()
        # Room for AReaL's two jobs whatever this machine has (1 CPU and 1 GB each, see
        # devkit.launch.training.SLURM_JOB_ON_THIS_NODE, plus AReaL's fixed 10 GB a job); nothing
        # enforces either.
        cpus, mem_mb = max(2, os.cpu_count() or 1), 2 * (1024 + 10240)
        with cluster(workdir, gpus=2, cpus=cpus, mem_mb=mem_mb) as env:
            job_logs.start()
            yield {"SLURM_CONF": env["SLURM_CONF"]}
    finally:
        done.set()
        if job_logs.is_alive():
            job_logs.join()
        with (run_dir / "train.log").open("a") as full_log:
            for path in sorted(run_dir.glob(JOB_LOGS)):
                full_log.write(f"\n===== Slurm job log {path}\n")
                full_log.write(plain(path.read_text(errors="replace")))  # AReaL colours the jobs' lines
        for log in workdir.glob("*.log"):
            (run_dir / "slurm").mkdir(parents=True, exist_ok=True)
            shutil.copy(log, run_dir / "slurm" / log.name)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    """`up DIR`: install if needed, run the cluster until Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python3 -m devkit.launch.slurm_cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="run a one-node cluster in the foreground")
    up.add_argument("dir", type=Path, help="work folder for its configuration, state and logs")
    up.add_argument("--gpus", type=int, default=2, help="fake GPUs on the node (default 2)")
    up.add_argument("--cpus", type=int, help="CPUs to advertise (default: this machine's)")
    up.add_argument("--mem-mb", type=int, help="memory to advertise (default: 95%% of it)")
    args = parser.parse_args(argv)

    install()
    # SIGTERM ends the run the way Ctrl-C does, through cluster()'s clean-up.
    with sigterm_raises(), cluster(args.dir, args.gpus, args.cpus, args.mem_mb) as env:
        print(f"export SLURM_CONF={env['SLURM_CONF']}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    main()
