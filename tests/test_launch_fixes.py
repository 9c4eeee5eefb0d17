"""The launch-path fixes in areal_patches/ and the SGLang seam (devkit/dev_server/sglang_seam), each
on its own; tests/test_launchers.py runs them inside AReaL's real single controller and
launchers."""

from __future__ import annotations

import http.server
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from areal_patches import (
    clean_exit, cpu_platform, port_draw, ray_workers, server_start, server_watchdog, slurm_container,
    slurm_job_exit,
)  # fmt: skip
from conftest import alive
from devkit import ROOT
from devkit.dev_server import sglang_launch_server
from devkit.dev_server.__main__ import build_arg_parser
from devkit.processes import find_free_port

SEAM = ROOT / "devkit" / "dev_server" / "sglang_seam"


def engine(setup_timeout: float, healthy: bool = False) -> SimpleNamespace:
    """What `wait_for_server` reads of a RemoteInfEngine: its config and its health check."""
    return SimpleNamespace(config=SimpleNamespace(setup_timeout=setup_timeout), check_health=lambda url: healthy)


def test_a_server_that_exits_at_start_ends_the_wait_at_once():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"inference server 10\.0\.0\.1:1 exited with code 3"):
        server_start.wait_for_server(engine(setup_timeout=60), "10.0.0.1:1", process)
    assert time.monotonic() - start < 5  # AReaL waits the whole setup_timeout


def test_a_healthy_server_ends_the_wait_and_a_silent_one_times_out():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        server_start.wait_for_server(engine(setup_timeout=60, healthy=True), "10.0.0.1:1", sleeper)
        with pytest.raises(TimeoutError, match="no answer to /health in 2 s"):
            server_start.wait_for_server(engine(setup_timeout=2), "10.0.0.1:1", sleeper)
    finally:
        sleeper.kill()


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_the_watchdog_names_a_silent_server_and_leaves_a_healthy_one_alone():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    alive = f"127.0.0.1:{server.server_address[1]}"
    dead = f"127.0.0.1:{find_free_port()}"  # nothing listens there
    messages = []
    try:
        server_watchdog.watch([alive, dead], grace=1.0, interval=0.2, on_dead=messages.append).join(timeout=10)
    finally:
        server.shutdown()
    assert len(messages) == 1 and f"rollout server {dead} has not answered /health for 1 s" in messages[0]
    messages.clear()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        thread = server_watchdog.watch([f"127.0.0.1:{server.server_address[1]}"], grace=0.5, interval=0.1,
                                       on_dead=messages.append)  # fmt: skip
        time.sleep(1.5)
        assert thread.is_alive() and messages == []
    finally:
        server.shutdown()


# A process that starts a child in a session of its own (as torchrun starts its workers),
# prints the child's pid, then fails or waits to be terminated. "stuck" plays the exit that
# hung in CI: the clean-up after the SIGTERM waits on a lock that is never released.
CHILD_SCRIPT = textwrap.dedent("""
    import subprocess, sys, threading, time
    from areal_patches import clean_exit
    clean_exit.SIGTERM_GRACE_SECONDS = 2
    never_released = threading.Lock()
    never_released.acquire()
    with clean_exit.no_process_left():
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
        try:
            print(child.pid, flush=True)
            if sys.argv[1] == "fail":
                raise RuntimeError("failed")
            time.sleep(120)
        finally:
            if sys.argv[1] == "stuck":
                never_released.acquire()
""")


@pytest.mark.parametrize("how", ["fail", "sigterm", "stuck"])
def test_no_process_is_left_after_a_failure_or_sigterm(how):
    proc = subprocess.Popen([sys.executable, "-c", CHILD_SCRIPT, how], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT)  # fmt: skip
    child = int(proc.stdout.readline())
    if how != "fail":
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == (1 if how == "fail" else 128 + signal.SIGTERM)
    assert not alive(child)
    assert ("ending by force" in proc.stderr.read()) == (how == "stuck")


def test_the_schedulers_finalizer_does_nothing_at_interpreter_shutdown(monkeypatch):
    from areal.infra.scheduler.local import LocalScheduler

    clean_exit.install()
    clean_exit.install()  # idempotent: wraps AReaL's finalizer, not the first wrapper
    deleted = []
    scheduler = SimpleNamespace(delete_workers=lambda: deleted.append(True))
    LocalScheduler.__del__(scheduler)
    assert deleted == [True]
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    LocalScheduler.__del__(scheduler)
    assert deleted == [True]  # AReaL's would start threads now and block for ever


def test_the_cpu_platform_gets_a_device_control_variable():
    module = SimpleNamespace(CpuPlatform=type("CpuPlatform", (), {"device_control_env_var": ""}))
    cpu_platform.install(module)
    assert module.CpuPlatform.device_control_env_var == "CUDA_VISIBLE_DEVICES"


def slurm_worker_script(tmp_path: Path, container_type: str) -> str:
    """The sbatch script AReaL's SlurmScheduler writes for one actor worker whose spec says
    `container_type` (a scheduler built as `SlurmScheduler(exp_config=...)` builds it, with
    the constructor's container defaults; no Slurm needed to write the script)."""
    from areal.api.cli_args import NameResolveConfig, SchedulingSpec
    from areal.infra.scheduler.slurm import SlurmScheduler

    scheduler = SlurmScheduler.__new__(SlurmScheduler)
    scheduler.__dict__.update(
        experiment_name="e", trial_name="t", fileroot=str(tmp_path), _n_gpus_per_node=1,
        name_resolve_config=NameResolveConfig(type="nfs", nfs_record_root=str(tmp_path / "nr")),
        container_type="apptainer", container_mounts="/storage:/storage", srun_additional_args="--unbuffered",
    )  # fmt: skip
    spec = SchedulingSpec(cmd="python3 -m areal_patches.worker", container_type=container_type, mount="/data:/data")
    return scheduler._generate_sbatch_script(role="actor", replicas=1, nodes=1, total_gpus=1, cpus_per_task=1,
                                             mem_per_task=1024, schedulings=[spec], nodelist=None, exclude=None)  # fmt: skip


def test_each_slurm_job_runs_in_the_container_its_spec_names(tmp_path):
    slurm_container.install()
    native = slurm_worker_script(tmp_path, "none")
    assert "singularity" not in native
    assert re.search(r"srun --unbuffered [^\n]*--gres=gpu:1 bash -c '[^']*python3 -m areal_patches.worker", native), native
    apptainer = slurm_worker_script(tmp_path, "apptainer")
    assert re.search(r"srun [^\n]* singularity exec [^\n]*--bind /data:/data ", apptainer), apptainer


@pytest.mark.parametrize("worker_status", [0, 7])
def test_a_slurm_job_ends_with_its_workers_exit_status(worker_status, tmp_path):
    """Run as a plain bash script, with a fake `srun` (no Slurm needed) that exits as the
    worker would: upstream the job's status is tee's, 0 either way, and Slurm calls a job
    whose worker failed COMPLETED."""
    slurm_container.install()
    slurm_job_exit.install()
    script = tmp_path / "actor.sh"
    script.write_text(slurm_worker_script(tmp_path, "none"))
    fake = tmp_path / "bin" / "srun"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho worker starting\nexit {worker_status}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == worker_status, proc.stderr
    assert "worker starting" in proc.stdout


def test_two_runs_with_one_seed_draw_different_ports():
    """What two runs with the same `seed` draw for their servers and workers once the trainer
    has seeded `random` (upstream: the same ports, which one of them cannot bind); the seed
    still decides `random`'s own draws."""
    from areal.utils import network, seeding

    port_draw.install()
    ports, draws = [], []
    for _ in range(2):
        seeding.set_random_seed(1, key="trainer0")
        ports.append(network.find_free_ports(4))
        draws.append(random.random())
    assert ports[0] != ports[1]
    assert draws[0] == draws[1]


@pytest.mark.timeout(60)
def test_a_ray_address_that_never_answers_is_named_after_the_connect_timeout():
    """A head behind a firewall that drops packets, or a host that is down: the connection
    neither succeeds nor is refused. Made here by a listener whose accept queue is full (the
    kernel then drops the SYNs); Ray's own connect would retry for minutes."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as head, socket.create_connection(head.getsockname()):
        address = "%s:%d" % head.getsockname()
        problem = ray_workers.unreachable_ray_address(address, timeout=0.5)
    assert problem is not None and problem.startswith(f"nothing answers at RAY_ADDRESS={address} (timed out); ")
    with socket.create_server(("127.0.0.1", 0)) as head:
        assert ray_workers.unreachable_ray_address("ray://%s:%d" % head.getsockname()) is None


def run_with_seam(code: str, seam: bool = True) -> str:
    env = {"PYTHONPATH": str(SEAM)} if seam else {}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env}, cwd="/")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


@pytest.mark.e2e
def test_the_seam_puts_the_dev_server_in_sglangs_place_and_only_there():
    find = "import importlib.util; print(importlib.util.find_spec('areal.experimental.inference_service.sglang.launch_server').origin)"
    assert run_with_seam(find) == str(ROOT / "devkit" / "dev_server" / "sglang_launch_server.py")
    assert run_with_seam(find, seam=False).endswith("areal/experimental/inference_service/sglang/launch_server.py")
    version = "import importlib.metadata as m; print(m.version('sglang'))"
    assert run_with_seam(version) == "0.5.10.post1"
    platform = "from areal.infra.platforms.cpu import CpuPlatform; print(repr(CpuPlatform.device_control_env_var))"
    assert run_with_seam(platform) == "'CUDA_VISIBLE_DEVICES'"
    assert run_with_seam(platform, seam=False) == "''"


def test_sglangs_flags_become_the_dev_servers():
    flags = ["--model-path", "/m", "--tokenizer-path", "/m", "--host", "10.1.2.3", "--port", "4567",
             "--random-seed", "9", "--dtype", "bfloat16", "--tp-size", "1", "--mem-fraction-static", "0.8",
             "--skip-tokenizer-init", "--base-gpu-id", "1"]  # fmt: skip
    argv = sglang_launch_server.dev_server_argv(flags, cuda=True, parent_pid=42, extra="--decoder hf")
    args = build_arg_parser().parse_args(argv)
    assert (args.model, args.host, args.port, args.seed) == ("/m", "10.1.2.3", 4567, 9)
    assert (args.dtype, args.device, args.parent_pid, args.decoder) == ("bfloat16", "cuda:1", 42, "hf")
    on_cpu = build_arg_parser().parse_args(
        sglang_launch_server.dev_server_argv(["--model-path", "/m", "--dtype", "auto"], cuda=False, parent_pid=1)
    )
    assert (on_cpu.device, on_cpu.dtype) == ("cpu", "float32")
