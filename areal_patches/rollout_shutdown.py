"""Stop the rollout controller's callback server after its workers, not before.

Upstream behaviour (areal 1.0.4): single controller, `RolloutController.destroy` stops its
dispatcher (closing the event loop that every rollout's waiting future belongs to), then its
callback server, and only then tells the workers to stop (`_collective_rpc("destroy")`) and
deletes them. A rollout a worker finishes in between still reports to
`/callback/rollout_complete`: the worker logs `ERROR: Callback to http://HOST:PORT/callback/
rollout_complete failed` with `Connection aborted` / `ConnectionResetError` (the server no
longer accepts, its socket is reset when the controller exits), `Connection refused`, or a
`500 Server Error` when the callback reaches a future whose loop is closed. Seen at the end of
complete CPU demos: the run exits 0 with every result written, but an ERROR on the last lines
sends users looking for a bug.

Effect: where upstream stopped the server, the controller forgets the waits instead (the
dispatcher that awaited them is gone), and the server stops once the workers are deleted, so
a late callback is answered 200 and resolves nothing. Everything else in `destroy` runs as
upstream, in its order.

Off: `areal_patches.apply(skip={"rollout_shutdown"})`.

Upstream: `RolloutController.destroy` unchanged on AReaL's main as of cbff54d (2026-08-22) and
in the v2.0.0 tag; not reported.
"""

from __future__ import annotations

import functools

from areal_patches.patching import wrap_once


def forget_waits(controller) -> None:
    """Drop every rollout's waiting future: after the dispatcher stopped, nobody awaits them,
    and their event loop is closed, so a late callback must not touch them."""
    with controller._futures_lock:
        controller._pending_futures.clear()


def install() -> None:
    from areal.infra.controller.rollout_controller import RolloutController

    def callback_server_last(original):
        def destroy(self) -> None:
            # Upstream's destroy calls `self._stop_callback_server()` right after the dispatcher;
            # an instance attribute shadows the method for that one call.
            self._stop_callback_server = functools.partial(forget_waits, self)
            try:
                original(self)
            finally:
                del self._stop_callback_server
                self._stop_callback_server()

        return destroy

    wrap_once(RolloutController, "destroy", callback_server_last, "stops_callback_server_last")
