"""areal_patches/task_callback: a rollout's completion callback that comes after its wait was
cancelled (a single-controller run shutting down) is skipped, not logged as a traceback."""

from __future__ import annotations

import asyncio
import threading

import pytest
from areal.api.cli_args import InferenceEngineConfig
from areal.infra.controller.rollout_controller import RolloutController

from areal_patches import task_callback


@pytest.fixture
def upstream_resolve():
    """AReaL's own `_resolve_task_future`, restored after the test whatever it installed."""
    original = RolloutController._resolve_task_future
    yield getattr(original, "__wrapped__", original)
    RolloutController._resolve_task_future = original


def callback_errors(controller: RolloutController, cancel_first: bool) -> tuple[list[str], bool]:
    """A task waits on its future, the run cancels the wait (or not), then the callback for that
    task arrives from the HTTP thread; returns what the event loop logged and whether the
    future ended with a result."""
    loop = asyncio.new_event_loop()
    logged: list[str] = []
    loop.set_exception_handler(lambda _, context: logged.append(repr(context.get("exception"))))
    future = loop.create_future()
    controller._pending_futures[7] = future
    if cancel_first:
        future.cancel()
    http_thread = threading.Thread(target=controller._resolve_task_future, args=(7,))
    http_thread.start()
    http_thread.join()
    loop.run_until_complete(asyncio.sleep(0.01))  # runs the callback the thread scheduled
    loop.close()
    return logged, future.done() and not future.cancelled()


def controller() -> RolloutController:
    # The real controller, unstarted: the callback path touches only its futures and their lock.
    return RolloutController(inf_engine=object, config=InferenceEngineConfig(backend="sglang:d1"), scheduler=None)


def test_upstream_logs_invalid_state_for_a_cancelled_wait(upstream_resolve):
    RolloutController._resolve_task_future = upstream_resolve
    logged, _ = callback_errors(controller(), cancel_first=True)
    assert len(logged) == 1 and "InvalidStateError" in logged[0]


def test_the_patched_callback_skips_a_cancelled_wait_and_still_resolves_a_live_one(upstream_resolve):
    task_callback.install()
    task_callback.install()  # idempotent: wraps AReaL's method once
    assert RolloutController._resolve_task_future.__wrapped__ is upstream_resolve
    assert callback_errors(controller(), cancel_first=True) == ([], False)
    assert callback_errors(controller(), cancel_first=False) == ([], True)
