"""Resend the rollouts a weight push interrupted within 20 ms of the resume, not on a half-second poll.

Upstream behaviour (areal 1.0.4): a disk weight push pauses the servers, which abort the
requests they are running; `RemoteInfEngine.agenerate` resends each one (its tokens so far
appended to the prompt) once the rollout dispatcher is resumed, which it learns by polling
`workflow_executor.is_paused()` with `asyncio.sleep(0.5)`. The trainer resumes the dispatcher
at the end of its step, so every interrupted rollout waits a further 0-0.5 s after that while
the servers may have nothing else to do (docs/results/time-to-accuracy.md, "Where a step's
time goes": the server idle after each load).

Effect: that poll, the only sleep in `areal/infra/remote_inf_engine.py`, waits at most
20 ms, as `weight_push`'s does. The module sees `asyncio` through a stand-in whose `sleep` is
capped; everything else is asyncio's own. Applied only where that module's source still holds
the one poll, word for word; otherwise it logs one line and changes nothing.

Off: `areal_patches.apply(skip={"resume_poll"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) (the 0.5 s poll is still in
`agenerate`); not reported.
"""

from __future__ import annotations

import asyncio
import inspect

from areal_patches import logger  # the package's: AReaL replaces the logging root when it makes a logger
from areal_patches.weight_push import POLL_SECONDS

UPSTREAM_POLL = "while self.workflow_executor.is_paused():\n                await asyncio.sleep(0.5)"


class CappedSleep:
    """`asyncio` but for `sleep`, which sleeps at most `cap` seconds."""

    def __init__(self, cap: float):
        self.cap = cap

    async def sleep(self, delay: float, result=None):
        return await asyncio.sleep(min(delay, self.cap), result)

    def __getattr__(self, name: str):
        return getattr(asyncio, name)


def holds_only_the_poll(source: str) -> bool:
    """Whether the module's one sleep is agenerate's pause poll."""
    return source.count("asyncio.sleep(") == 1 and UPSTREAM_POLL in source


def install(cap: float = POLL_SECONDS) -> None:
    from areal.infra import remote_inf_engine

    if isinstance(remote_inf_engine.asyncio, CappedSleep):
        return
    if not holds_only_the_poll(inspect.getsource(remote_inf_engine)):
        logger.warning("resume_poll: areal/infra/remote_inf_engine.py no longer holds the 0.5 s pause poll "
                       "alone; not applied (check its upstream status in docs/areal-bugs.md)")
        return
    remote_inf_engine.asyncio = CappedSleep(cap)
