"""Resend the rollouts a weight push interrupted as soon as the servers hold the new weights,
not when the trainer resumes its dispatcher; start new rollouts as soon as it does; and look
every 20 ms, not every half second.

Upstream behaviour (areal 1.0.4): a disk weight push pauses the servers, which abort the
requests they are running; `RemoteInfEngine.agenerate` resends each one (its tokens so far
appended to the prompt) once the rollout dispatcher is resumed, which it learns by polling
`workflow_executor.is_paused()` with `asyncio.sleep(0.5)`. The trainer paused the dispatcher
before the push (to start no new rollouts) and resumes it at the end of its step, after the
save, the evaluation and the statistics, so every interrupted rollout waits for all of that,
and then 0-0.5 s more, while the servers may have nothing else to do
(docs/results/time-to-accuracy.md, "Where a step's time goes": the server idle after each load).
New rollouts wait too: the dispatcher's `AsyncTaskRunner`, finding itself paused while
rollouts still run, sleeps `poll_sleep_time` (0.5 s) at a time, and starts nothing queued,
the next step's first rollouts included, until its sleep ends, 0-0.5 s after the resume.

Effect: an interrupted rollout is resent once the push is over: the servers have loaded the
new weights and continued, and the client holds the new version (the trainer's `set_version`
right after the push), so its new tokens are tagged with the version that made them. No new
rollout starts before the trainer resumes the dispatcher, as upstream. Until then it is
`WorkflowExecutor.is_paused()`, whose one caller is that wait, that answers "not paused" for
resends; a pause of the dispatcher or of the servers holds them again. The wait's poll, the
only sleep in `areal/infra/remote_inf_engine.py`, sleeps at most 20 ms, as `weight_push`'s
does: the module sees `asyncio` through a stand-in whose `sleep` is capped. Applied only where
that module's source still holds the one poll, word for word, as the wait's one check;
otherwise it logs one line and leaves the resends as upstream's. Every `AsyncTaskRunner` made
afterwards sleeps at most 20 ms a poll, so new rollouts start within 20 ms of the resume (its
other use of the poll, the wait for results, returns as a result arrives either way); where
`AsyncTaskRunner` no longer takes a `poll_sleep_time`, one line says so and it is left alone.

Off: `areal_patches.apply(skip={"resume_poll"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) (the 0.5 s poll on the
dispatcher's pause is still in `agenerate`, and `AsyncTaskRunner`'s default poll still 0.5 s);
not reported.
"""

from __future__ import annotations

import asyncio
import inspect

from areal_patches import logger  # the package's: AReaL replaces the logging root when it makes a logger
from areal_patches.patching import wrap_once
from areal_patches.weight_push import POLL_SECONDS

UPSTREAM_POLL = "while self.workflow_executor.is_paused():\n                await asyncio.sleep(0.5)"
RELEASED = "_resume_poll_resends_released"  # on a RemoteInfEngine: the push is over, resend


class CappedSleep:
    """`asyncio` but for `sleep`, which sleeps at most `cap` seconds."""

    def __init__(self, cap: float):
        self.cap = cap

    async def sleep(self, delay: float, result=None):
        return await asyncio.sleep(min(delay, self.cap), result)

    def __getattr__(self, name: str):
        return getattr(asyncio, name)


def holds_only_the_poll(source: str) -> bool:
    """Whether the module's one sleep is agenerate's pause poll, and that poll its one check of
    the dispatcher's pause."""
    return source.count("asyncio.sleep(") == 1 and source.count("is_paused()") == 1 and UPSTREAM_POLL in source


def hold_resends(original):
    """A pause of the dispatcher or of the servers: interrupted rollouts wait again."""

    def method(self, *args, **kwargs):
        setattr(self, RELEASED, False)
        return original(self, *args, **kwargs)

    return method


def release_resends(original):
    """The client's new version, set after a push: its interrupted rollouts may go."""

    def set_version(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        setattr(self, RELEASED, True)
        return result

    return set_version


def paused_unless_released(original):
    """The dispatcher's pause, as agenerate's resend wait sees it: over once the push is."""

    def is_paused(self) -> bool:
        return original(self) and not getattr(self.inference_engine, RELEASED, False)

    return is_paused


def capped_poll(cap: float):
    """An `AsyncTaskRunner` whose poll, while paused, sleeps at most `cap` seconds."""

    def wrapper(original):
        def __init__(self, *args, **kwargs):
            original(self, *args, **kwargs)
            self.poll_sleep_time = min(self.poll_sleep_time, cap)

        return __init__

    return wrapper


def install(cap: float = POLL_SECONDS) -> None:
    from areal.infra import remote_inf_engine
    from areal.infra.async_task_runner import AsyncTaskRunner
    from areal.infra.workflow_executor import WorkflowExecutor

    if "poll_sleep_time" in inspect.signature(AsyncTaskRunner.__init__).parameters:
        wrap_once(AsyncTaskRunner, "__init__", capped_poll(cap), "caps_its_poll")
    else:
        logger.warning("resume_poll: AsyncTaskRunner no longer takes poll_sleep_time; its poll is left as "
                       "upstream's (check its upstream status in docs/areal-bugs.md)")

    if isinstance(remote_inf_engine.asyncio, CappedSleep):
        return
    if not holds_only_the_poll(inspect.getsource(remote_inf_engine)):
        logger.warning("resume_poll: areal/infra/remote_inf_engine.py no longer holds the 0.5 s pause poll "
                       "alone; not applied (check its upstream status in docs/areal-bugs.md)")
        return
    engine = remote_inf_engine.RemoteInfEngine
    for name in ("pause", "pause_generation"):
        wrap_once(engine, name, hold_resends, "holds_resends")
    wrap_once(engine, "set_version", release_resends, "releases_resends")
    wrap_once(WorkflowExecutor, "is_paused", paused_unless_released, "pauses_unless_released")
    remote_inf_engine.asyncio = CappedSleep(cap)
