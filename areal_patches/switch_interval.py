"""Let the rollout client take its turns with the interpreter while the trainer runs Python.

Upstream behaviour (areal 1.0.4): under the SPMD launchers (local, Ray, Slurm) the rollout
client, `RemoteInfEngine`'s `AsyncTaskRunner`, is an asyncio loop in a thread of the trainer's
process: it sends every episode's request, reads every answer and runs the workflow (decode,
score, tensors) there. While the trainer's main thread runs Python, as a small model's update
does (its time goes to launching kernels), a thread that gave up the interpreter's lock to
wait for a socket gets it back only when the holder is made to let go, at CPython's switch
interval: 5 ms. Every turn of the client's event loop then waits up to 5 ms, answers pile up
unread and new requests go unsent, and the servers idle until the trainer waits for its batch
and the client catches up (docs/results/time-to-accuracy.md, "Is row D's wait in the rollout
pipeline itself?").

Effect: the process's switch interval is cut to SWITCH_SECONDS (1 ms), or left where it is if
already shorter, so the client's turns come five times as often. The interpreter does the same
work; only how the trainer's thread and the client's share it changes. Applied in every process
that applies the fixes: the SPMD trainer, where it matters, and the single controller's workers.

Off: `areal_patches.apply(skip={"switch_interval"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) (no switch interval is set; the
client thread still shares the trainer's interpreter under the SPMD launchers); not reported.
"""

from __future__ import annotations

import sys

SWITCH_SECONDS = 0.001


def install() -> None:
    if sys.getswitchinterval() > SWITCH_SECONDS:
        sys.setswitchinterval(SWITCH_SECONDS)
