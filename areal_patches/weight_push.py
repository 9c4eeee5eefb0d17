"""Make AReaL's disk weight push stop sleeping a second per step.

Why this module exists: in areal 1.0.4 a disk weight push (`FSDPEngine._update_weights_from_disk`)
pauses generation, starts the inference client's wait for the trainer's "weights saved"
record (`name_resolve.wait`), saves the model, writes the record, and resumes generation
when the servers have loaded it. The wait checks for the record, finds it missing (the save
has only just begun), then sleeps its default `poll_frequency` of one second before looking
again. So every step spends about a second with the GPU idle and generation paused, whatever
the save took. That is noise for a 3B model, whose save takes seconds, but it was 0.9 s of a
4.5 s step for the 25M model of docs/results/learning.md and most of the CPU demo's push.

Each sleep also adds a random 0-100 ms "to reduce concurrency", so even a short poll wakes a
mean 50 ms after the record is written, and with areal_patches/pause_at_load.py the servers
sit paused through that wait.

`install()` makes waits that do not choose their own polling interval (in areal 1.0.4 that is
only this one) poll every 20 ms, without the random addition. `areal_patches.apply()` applies
it: train.py's `main()` in the SPMD trainer process, `python3 -m areal_patches.worker` in the
single-controller workers. A missing record costs one file lookup per poll; the timeout is
unchanged. Waits that choose their interval keep AReaL's loop.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0 tag (`wait`
still polls once a second by default); not reported.
"""

from __future__ import annotations

import time

from areal.utils import name_resolve

POLL_SECONDS = 0.02
REPOSITORIES = (name_resolve.NameRecordRepository, name_resolve.RayNameResolveRepository)


def poll(repository, name: str, timeout: float | None, seconds: float) -> str:
    """`repository.get(name)` once the record exists, looking every `seconds`; TimeoutError
    after `timeout` seconds (None: never), as AReaL's wait raises it."""
    start = time.monotonic()
    while True:
        try:
            return repository.get(name)
        except name_resolve.NameEntryNotFoundError:
            pass
        if timeout is not None and time.monotonic() - start > timeout:
            raise TimeoutError(f"Timeout waiting for key '{name}' ({type(repository).__name__})")
        time.sleep(seconds)


def install(poll_seconds: float = POLL_SECONDS) -> None:
    """Give every name_resolve repository's `wait` a default poll of `poll_seconds` (idempotent)."""
    for repository in REPOSITORIES:
        original = getattr(repository.wait, "__wrapped__", repository.wait)

        def wait(self, name, timeout=None, poll_frequency=None, _original=original):
            if poll_frequency is not None:
                return _original(self, name, timeout=timeout, poll_frequency=poll_frequency)
            return poll(self, name, timeout, poll_seconds)

        wait.__wrapped__ = original
        repository.wait = wait
    name_resolve.wait = name_resolve.DEFAULT_REPOSITORY.wait  # bound before install; reconfigure rebinds it
