"""devkit.launch.training.run_trainer, which runs every trainer of the demo and the learning runs, on
a stand-in shaped like AReaL's local launcher: a launcher process, a torchrun-like child, and
a worker in a session of its own that ignores SIGTERM, as a worker whose exit is stuck does.
The stand-in replaces AReaL only to make the interrupt land at a known moment;
tests/test_launchers.py interrupts the real launchers."""

from __future__ import annotations

import _thread
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import alive

from devkit.launch import training

pytestmark = pytest.mark.timeout(120)

WORKER = textwrap.dedent("""
    import os, signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(sys.argv[1], "w").write(str(os.getpid()))
    while True:
        print("worker step", flush=True)
        time.sleep(0.1)
""")
MIDDLE = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:], start_new_session=True); time.sleep(600)"
LAUNCHER = "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(600)"
# AReaL's local launcher once a server has died: it signals its jobs, waits for the shell that
# started each one and exits 1, while the worker may still be in its clean exit. Its jobs write
# through `tee` to their logs: the worker does not hold the launcher's output open.
FAILING_LAUNCHER = textwrap.dedent("""
    import os, subprocess, sys, time
    subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.1)
    time.sleep(0.5)
    sys.exit(1)
""")


def interrupt_when_running(pid_file: Path) -> None:
    """Ctrl-C in the main thread once the worker runs (it prints a step every 0.1 s, so the
    main thread, reading the trainer's output, sees the interrupt at once)."""
    deadline = time.time() + 60
    while time.time() < deadline and not pid_file.exists():
        time.sleep(0.1)
    time.sleep(0.5)
    _thread.interrupt_main()


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler: `interrupt_main` calls whatever handler is set, and modules
    imported by earlier tests in the session may have set theirs."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupted_run_stops_one_at_a_time_and_leaves_no_worker(tmp_path, monkeypatch, python_sigint):
    calls, running = [], []
    real_stop_group = training.stop_group

    def recording_stop_group(proc, **kwargs):
        running.append(proc)
        calls.append(len(running))
        time.sleep(0.5)  # wide enough for a racing second stop to show
        real_stop_group(proc, **kwargs)
        running.remove(proc)

    monkeypatch.setattr(training, "stop_group", recording_stop_group)
    pid_file, log_path = tmp_path / "worker.pid", tmp_path / "train.log"
    cmd = [sys.executable, "-c", LAUNCHER, sys.executable, "-c", MIDDLE,
           sys.executable, "-c", WORKER, str(pid_file)]  # fmt: skip
    threading.Thread(target=interrupt_when_running, args=(pid_file,), daemon=True).start()

    with pytest.raises(KeyboardInterrupt):
        training.run_trainer(cmd, {}, log_path)

    assert calls and max(calls) == 1, f"stops overlapped: {calls}"
    assert not alive(int(pid_file.read_text())), "the worker outlived the run"


def test_a_launcher_that_exits_on_its_own_leaves_no_worker(tmp_path):
    """The worker, in a session of its own, is init's child once the launcher has exited:
    run_trainer finds it by the run's mark in its environment."""
    pid_file, log_path = tmp_path / "worker.pid", tmp_path / "train.log"
    cmd = [sys.executable, "-c", FAILING_LAUNCHER, str(pid_file), sys.executable, "-c", MIDDLE,
           sys.executable, "-c", WORKER, str(pid_file)]  # fmt: skip

    with pytest.raises(RuntimeError, match="training failed"):
        training.run_trainer(cmd, {}, log_path)

    assert not alive(int(pid_file.read_text())), "the worker outlived the run"
