"""areal_patches/rollout_shutdown: a rollout a worker finishes while the single controller shuts
down reports to a callback server that still answers, instead of logging
`ERROR: Callback to ... failed` on the worker.

AReaL's RolloutController runs with its real Flask callback server; what cannot run in a unit
test is mocked: the dispatcher (its `destroy` closes the event loop the waits belong to, as
the real one does) and the workers (`_collective_rpc("destroy")` is one worker that finishes
a last rollout while it stops and posts its completion as `BatchTaskDispatcher._send_callback`
does)."""

from __future__ import annotations

import asyncio

import pytest
import requests
from areal.api.cli_args import InferenceEngineConfig
from areal.infra.controller.rollout_controller import RolloutController

from areal_patches import rollout_shutdown


@pytest.fixture
def upstream_destroy():
    """AReaL's own `destroy`, restored after the test whatever it installed."""
    original = RolloutController.destroy
    yield getattr(original, "__wrapped__", original)
    RolloutController.destroy = original


class StoppingDispatcher:
    """Stands in for BatchTaskDispatcher: stopping it closes the loop the waits belong to."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop

    def destroy(self) -> None:
        self.loop.close()


def shut_down(worker_fails: bool = False) -> tuple[RolloutController, list]:
    """Start a controller's callback server with one rollout waiting, destroy the controller,
    and return it with what the stopping worker's completion post got back (a status code or
    the name of the exception)."""
    controller = RolloutController(
        inf_engine=object, config=InferenceEngineConfig(backend="sglang:d1"), scheduler=None
    )
    loop = asyncio.new_event_loop()
    controller._pending_futures[7] = loop.create_future()
    controller._dispatcher = StoppingDispatcher(loop)
    controller._start_callback_server()
    url = f"http://{controller.callback_addr}/callback/rollout_complete"
    outcomes: list = []

    def worker_stops(method: str, *args, **kwargs) -> None:
        assert method == "destroy"
        try:
            outcomes.append(requests.post(url, json={"task_id": 7}, timeout=2).status_code)
        except requests.RequestException as error:
            outcomes.append(type(error).__name__)
        if worker_fails:
            raise RuntimeError("worker gone")

    controller._collective_rpc = worker_stops
    if worker_fails:
        with pytest.raises(RuntimeError, match="worker gone"):
            controller.destroy()
    else:
        controller.destroy()
    return controller, outcomes


def test_upstream_stops_the_server_before_the_workers_report(upstream_destroy):
    RolloutController.destroy = upstream_destroy
    controller, outcomes = shut_down()
    assert len(outcomes) == 1 and outcomes[0] != 200
    assert controller._callback_server is None


def test_the_patched_destroy_answers_the_last_callback_then_stops_the_server(upstream_destroy):
    rollout_shutdown.install()
    rollout_shutdown.install()  # idempotent: wraps AReaL's method once
    assert RolloutController.destroy.__wrapped__ is upstream_destroy
    controller, outcomes = shut_down()
    assert outcomes == [200]
    assert controller._callback_server is None and controller._pending_futures == {}
    assert "_stop_callback_server" not in vars(controller)


def test_the_server_stops_even_when_stopping_the_workers_fails(upstream_destroy):
    rollout_shutdown.install()
    controller, outcomes = shut_down(worker_fails=True)
    assert outcomes == [200]
    assert controller._callback_server is None
