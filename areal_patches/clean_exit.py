"""End a single-controller run on any path with no process left and no hang.

Upstream behaviour (areal 1.0.4): the controller's `LocalScheduler` deletes its workers in
`PPOTrainer.close()` and otherwise only in `LocalScheduler.__del__`. When the trainer fails
in its constructor (a worker that cannot be configured, a server that does not start),
`close()` never runs: the workers are left to `__del__`, which runs during interpreter
shutdown and starts threads there, and `Thread.start` then waits forever. The controller
printed its error and hung (over 200 s after a SIGINT, in
`LocalScheduler._cleanup_workers`); another run exited and left both workers running.
SIGTERM kills the controller without any clean-up at all.

Effect: `no_process_left()` (train.py's `main()` runs inside it) turns SIGTERM into
SystemExit and, on every way out, kills every process the controller started and waits for
them. SystemExit lands wherever the main thread happens to be; once (a CI run of the SPMD
local launcher, interrupted) that was inside tensorboardX's event-queue lock, and the exit
then waited forever on that lock in tensorboardX's own clean-up, leaving a worker running
after its launcher had gone. So a SIGTERM also arms a timer: a clean exit that has not
finished `SIGTERM_GRACE_SECONDS` later ends with the same kill and `os._exit`. `install()`
makes `LocalScheduler.__del__` do nothing once the interpreter is shutting down, when nothing
it would stop is left.

Off: `areal_patches.apply(skip={"clean_exit"})` leaves `__del__` as it is; `no_process_left`
is the project's own policy (the run's processes end with it) and has no switch.

Upstream: `LocalScheduler.__del__` unchanged on AReaL's main as of cbff54d (2026-08-22) and in
the v2.0.0 tag; not reported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

import psutil


def kill_descendants(timeout: float = 10.0) -> None:
    """SIGKILL every process this one started, directly or not, and reap them.

    Not devkit.processes.stop_group: the AReaL fixes import nothing of devkit, and this ends a
    run's leftovers (or a stuck exit) at once, where stop_group gives a child's tree a grace."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    psutil.wait_procs(children, timeout=timeout)


SIGTERM_GRACE_SECONDS = 30.0


def end_now(message: str, code: int = 1) -> None:
    """Write `message`, kill every process this one started and exit at once, skipping the
    clean-up: for a thread that finds the run cannot go on, or a clean exit that is stuck.

    The line goes to fd 2 directly: `print` would wait on sys.stderr's lock, which a stuck
    main thread may hold."""
    os.write(2, (message + "\n").encode())
    kill_descendants()
    os._exit(code)


def exit_on_sigterm(signum: int, frame) -> None:
    """Exit cleanly (finally blocks, atexit), or by force if that has not ended in the grace.

    Not devkit.processes.sigterm_raises: the AReaL fixes import nothing of devkit, and this one
    arms the forced exit too."""
    message = f"clean exit still running {SIGTERM_GRACE_SECONDS:g} s after SIGTERM; ending by force"
    timer = threading.Timer(SIGTERM_GRACE_SECONDS, end_now, args=(message, 128 + signum))
    timer.daemon = True
    timer.start()
    sys.exit(128 + signum)


@contextlib.contextmanager
def no_process_left() -> Iterator[None]:
    """Run the body; whatever happens (an error, Ctrl-C, SIGTERM), stop its processes after."""
    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        yield
    finally:
        kill_descendants()
        signal.signal(signal.SIGTERM, previous)


def install() -> None:
    from areal.infra.scheduler.local import LocalScheduler

    upstream_del = getattr(LocalScheduler.__del__, "__wrapped__", LocalScheduler.__del__)

    def __del__(self) -> None:
        if not sys.is_finalizing():
            upstream_del(self)

    __del__.__wrapped__ = upstream_del
    LocalScheduler.__del__ = __del__
