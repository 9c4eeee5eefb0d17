"""A throwaway one-node Ray cluster on this machine, for runs of AReaL's Ray launcher.

`python3 -m areal.infra.launcher.ray` calls `ray.init()` with no address: it joins the
cluster that RAY_ADDRESS names and submits the inference servers and the trainer to it as
Ray tasks with GPU, CPU and memory requests. This module starts a head node with
`ray start --head` (fake GPUs: Ray only counts them; no dashboard) and stops it again.

Ray's workers are started by the raylet and inherit the environment of `ray start`, so the
`env` given to `cluster()` (the seam's PATH and PYTHONPATH, say) reaches every task, and
the tasks start in the folder `ray start` ran in (AReaL passes the trainer script as a
relative path). `ray start` runs in a session of its own, and every process of the
cluster stays in that session (daemons, workers and what they start, the dev server say)
and carries a marker variable in its environment: on exit all of them are stopped, and
only they (`ray stop` would stop every Ray cluster on the machine: it matches processes
by name).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from devkit.processes import find_free_port, tail

START_TIMEOUT_S = 90.0
# Ray's GCS server and agents outlive a SIGTERM for long (seconds to minutes): a short
# grace, then SIGKILL, as `ray stop --force` does at once.
STOP_GRACE_S = 2.0
STOP_TIMEOUT_S = 10.0
MARKER = "COUNTDOWN_RAY_CLUSTER"
RAY = [sys.executable, "-m", "ray.scripts.scripts"]  # the `ray` command of this interpreter
# AReaL's defaults per GPU (SchedulingSpec: 8 CPUs, 32 GB): the launcher asks that much for
# each server and trainer GPU, whatever the machine has. Nothing enforces either here.
CPUS_PER_GPU = 8
MEM_GB_PER_GPU = 32


@contextlib.contextmanager
def cluster(
    workdir: Path,
    gpus: int = 2,
    env: Mapping[str, str] | None = None,
    cpus: int | None = None,
    mem_gb: int | None = None,
    cwd: Path | None = None,
) -> Iterator[dict[str, str]]:
    """Run a one-node Ray cluster whose logs live in `workdir`.

    Yields `env` (default os.environ) plus RAY_ADDRESS, the environment in which `ray`
    and AReaL's launcher reach this cluster, and RAY_DEDUP_LOGS=0: a driver then prints
    every line its tasks write (Ray folds lines of different processes that differ only
    in numbers into one "[repeated Nx across cluster]"). The node offers `gpus` GPUs and,
    by default, AReaL's default CPUs and memory for each (a node sized like a GPU node, so
    that the launcher's requests can be scheduled on a small machine). Tasks start in
    `cwd` (default: this process's folder). On exit every process of the cluster is
    stopped, whatever state the run is in.
    """
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    # Ray puts Unix sockets under its temp folder (107 bytes at most for their paths):
    # a short link in /tmp keeps the path short and the logs in workdir.
    short = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    temp_dir = short / "t"
    temp_dir.symlink_to(workdir)
    port = find_free_port()
    base = dict(os.environ if env is None else env)
    base.pop("RAY_ADDRESS", None)
    daemon_env = {**base, MARKER: str(short), "RAY_USAGE_STATS_ENABLED": "0"}
    argv = [
        *RAY, "start", "--head",
        f"--port={port}", f"--num-gpus={gpus}",
        f"--num-cpus={cpus or CPUS_PER_GPU * max(gpus, 1)}",
        f"--memory={(mem_gb or MEM_GB_PER_GPU * max(gpus, 1)) * 1024**3}",
        f"--object-store-memory={256 * 1024**2}",
        "--include-dashboard=false", "--disable-usage-stats",
        f"--ray-client-server-port={find_free_port()}",
        f"--dashboard-agent-listen-port={find_free_port()}",
        f"--temp-dir={temp_dir}",
    ]  # fmt: skip
    session = None
    try:
        session = _start(argv, daemon_env, workdir, cwd)
        client_env = {**base, "RAY_ADDRESS": f"127.0.0.1:{port}", "RAY_DEDUP_LOGS": "0"}
        _wait_up(client_env, gpus, workdir)
        yield client_env
    finally:
        stop(session, str(short))
        temp_dir.unlink(missing_ok=True)
        short.rmdir()
        latest = workdir / "session_latest"  # Ray's link to the session's logs, via /tmp
        if latest.is_symlink():
            target = Path(os.readlink(latest)).name
            latest.unlink()
            latest.symlink_to(target)


def _start(argv: list[str], env: dict[str, str], workdir: Path, cwd: Path | None) -> int:
    """`ray start`, which returns once the daemons run; returns the id of the session that
    they stay in (away from a terminal's Ctrl-C) until stop()."""
    log_path = workdir / "ray-start.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        proc.wait(START_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise TimeoutError(
            f"`ray start` did not return within {START_TIMEOUT_S:.0f} s:\n"
            + tail(log_path.read_text())
        ) from None
    if proc.returncode != 0:
        raise RuntimeError(
            f"`ray start` failed with exit code {proc.returncode}:\n" + tail(log_path.read_text())
        )
    return proc.pid


def _wait_up(env: dict[str, str], gpus: int, workdir: Path) -> None:
    """Wait until `ray status` shows the node with its GPUs (bounded)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    want = f"/{float(gpus)} GPU"
    out = ""
    while time.monotonic() < deadline:
        try:
            status = subprocess.run(
                [*RAY, "status"],
                env=env, capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            out = status.stdout + status.stderr
            if status.returncode == 0 and (want in out or gpus == 0):
                return
        except subprocess.TimeoutExpired:
            out = "ray status timed out"
        time.sleep(1)
    raise TimeoutError(
        f"the Ray node is not up after {START_TIMEOUT_S:.0f} s (`ray status`):\n{tail(out)}\n"
        f"logs: {workdir}"
    )


def processes(session: int | None, marker: str) -> list[int]:
    """Live processes (zombies aside) in `session` or with MARKER=marker in their environment.

    The session is what counts for Ray's own processes: they rename themselves
    (`ray::IDLE`, `ray::DashboardAgent`) and that overwrites what /proc shows of their
    environment. The marker catches a process that started a session of its own.
    """
    needle = f"{MARKER}={marker}".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc / "stat").read_text()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # ended while we looked, or not ours to read
            continue
        state, _, _, sid = stat[stat.rindex(")") + 2 :].split()[:4]
        ours = int(sid) == session or needle in environ
        if ours and state != "Z" and int(proc.name) != os.getpid():
            found.append(int(proc.name))
    return found


def stop(session: int | None, marker: str) -> None:
    """SIGTERM every process of the cluster, SIGKILL what is left after STOP_GRACE_S.

    Processes that appear meanwhile (a worker the raylet was starting) are caught by the
    next round; raises if any is still there after STOP_TIMEOUT_S. Not
    devkit.processes.stop_group: `ray start` has exited, so its daemons are no one's children
    here and are found by session and marker instead.
    """
    start = time.monotonic()
    while pids := processes(session, marker):
        waited = time.monotonic() - start
        if waited > STOP_TIMEOUT_S:
            raise RuntimeError(f"processes of the Ray cluster survived SIGKILL: {pids}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL if waited > STOP_GRACE_S else signal.SIGTERM)
        time.sleep(0.2)
