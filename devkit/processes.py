"""Small helpers for the processes and logs of runs and servers, shared by devkit and the
experiments; standard library and psutil only."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
from collections.abc import Iterator

import psutil

# AReaL colours its log lines whatever the output is: files get them plain.
COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def plain(line: str) -> str:
    return COLOUR.sub("", line)


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(text: str, lines: int = 30) -> str:
    """The last `lines` lines of a log's text."""
    return "\n".join(text.strip().splitlines()[-lines:])


# The environment variable that marks a run's processes (run_trainer gives each run its own
# value): those a launcher started in sessions of their own stay findable after it has exited.
RUN_ID = "DEVKIT_RUN_ID"


def marked_processes(run_id: str) -> list[psutil.Process]:
    """Live processes whose environment carries RUN_ID=`run_id` (those of other users aside)."""
    return [p for p in psutil.process_iter(["environ"]) if (p.info["environ"] or {}).get(RUN_ID) == run_id]


def stop_group(proc: subprocess.Popen, timeout: float = 15.0, run_id: str | None = None) -> None:
    """SIGTERM the process group that `proc` leads, every process it started (torchrun's
    workers have sessions of their own) and, with `run_id`, every process marked with it;
    SIGKILL whatever is left after `timeout` seconds.

    Why the mark: a launcher that exits on its own (AReaL's local launcher, after a server
    died) leaves its workers to init, in the middle of their clean exit, where no walk down
    from the launcher finds them."""
    try:
        leader = psutil.Process(proc.pid)
        tree = [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if run_id:
        tree += [p for p in marked_processes(run_id) if p not in tree]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(sig)
        _, tree = psutil.wait_procs(tree, timeout=timeout)
    proc.wait()


@contextlib.contextmanager
def sigterm_raises(exception: BaseException | type[BaseException] = KeyboardInterrupt) -> Iterator[None]:
    """SIGTERM (`kill`, `timeout`) raises `exception` in the block, so that it ends through the
    same clean-up as Ctrl-C: a KeyboardInterrupt by default, `SystemExit(143)` for that status.
    Once: a second SIGTERM must not cut the clean-up short."""

    def raise_once(*_) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise exception

    previous = signal.signal(signal.SIGTERM, raise_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
