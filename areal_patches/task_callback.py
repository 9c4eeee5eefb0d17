"""Skip a rollout's completion callback when nobody waits for it any more.

Upstream behaviour (areal 1.0.4): in single-controller mode each rollout task waits on an
asyncio future that the controller's HTTP callback resolves (`RolloutController.
_resolve_task_future`: `call_soon_threadsafe(future.set_result, None)`). When the wait has
already ended, because the run is shutting down and cancelled its tasks or because the wait
timed out, the future is cancelled but may still be in `_pending_futures`; a callback that
arrives then sets a result on a cancelled future, and the event loop logs
`Exception in callback ... set_result` / `asyncio.exceptions.InvalidStateError: invalid state`
after "Training completes". Seen once in a fresh clone's `make demo`: harmless (exit 0,
every result written), but a traceback at the end of a good run sends users looking for a bug.

Effect: the callback resolves the future only if it is still pending; nothing else changes.

Off: `areal_patches.apply(skip={"task_callback"})`.

Upstream: `RolloutController._resolve_task_future` unchanged on AReaL's main as of cbff54d
(2026-08-22) and in the v2.0.0 tag; not reported.
"""

from __future__ import annotations

import asyncio

from areal_patches.patching import wrap_once


def resolve_unless_done(future: asyncio.Future) -> None:
    """Resolve `future` unless it was cancelled (or resolved) before the callback came."""
    if not future.done():
        future.set_result(None)


def install() -> None:
    from areal.infra.controller.rollout_controller import RolloutController

    def skipping_done_futures(original):
        def _resolve_task_future(self, task_id: int) -> None:
            with self._futures_lock:
                future = self._pending_futures.pop(task_id, None)
            if future:
                future.get_loop().call_soon_threadsafe(resolve_unless_done, future)

        return _resolve_task_future

    wrap_once(RolloutController, "_resolve_task_future", skipping_done_futures, "skips_done_futures")
