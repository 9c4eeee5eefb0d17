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


def stop_group(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process group that `proc` leads and every process it started (torchrun's
    workers have sessions of their own), SIGKILL whatever is left after `timeout` seconds."""
    try:
        leader = psutil.Process(proc.pid)
        tree = [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
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
