"""areal_patches/resume_poll: applied only where AReaL's source still holds the one 0.5 s poll,
as the one check of the dispatcher's pause; the dispatcher's runner polls at most 20 ms.

The resends and the runner's starts are exercised through AReaL's real RemoteSGLangEngine and
the dev server in tests/test_dev_server.py; these check the guards and the stand-in, without a
server.
"""

import asyncio
import inspect
import logging
import time

from areal.infra import remote_inf_engine

from areal_patches import resume_poll


def test_the_installed_areal_holds_the_poll_alone():
    assert resume_poll.holds_only_the_poll(inspect.getsource(remote_inf_engine))


def test_a_source_with_another_sleep_or_another_poll_is_not_patched():
    source = inspect.getsource(remote_inf_engine)
    assert not resume_poll.holds_only_the_poll(source + "\n        await asyncio.sleep(1)\n")
    assert not resume_poll.holds_only_the_poll(source.replace("asyncio.sleep(0.5)", "asyncio.sleep(0.25)"))
    assert not resume_poll.holds_only_the_poll(source + "\n        if self.workflow_executor.is_paused():\n")


def test_the_guard_says_so_in_one_line_and_changes_nothing(monkeypatch, caplog):
    from areal.infra.workflow_executor import WorkflowExecutor

    monkeypatch.setattr(remote_inf_engine, "asyncio", asyncio)
    before = {name: getattr(remote_inf_engine.RemoteInfEngine, name) for name in ("pause", "pause_generation", "set_version")}
    is_paused = WorkflowExecutor.is_paused
    monkeypatch.setattr(resume_poll.inspect, "getsource", lambda module: "await asyncio.sleep(2)")
    with caplog.at_level(logging.WARNING, logger="areal_patches"):
        resume_poll.install()
    assert remote_inf_engine.asyncio is asyncio and WorkflowExecutor.is_paused is is_paused
    assert all(getattr(remote_inf_engine.RemoteInfEngine, name) is method for name, method in before.items())
    assert len(caplog.records) == 1 and "not applied" in caplog.records[0].getMessage()


def test_a_runner_made_after_install_polls_at_most_20_ms(monkeypatch):
    from areal.infra.async_task_runner import AsyncTaskRunner

    monkeypatch.setattr(AsyncTaskRunner, "__init__", getattr(AsyncTaskRunner.__init__, "__wrapped__", AsyncTaskRunner.__init__))
    assert AsyncTaskRunner(max_queue_size=4).poll_sleep_time == 0.5  # upstream's
    resume_poll.install()
    resume_poll.install()  # idempotent
    assert AsyncTaskRunner(max_queue_size=4).poll_sleep_time == resume_poll.POLL_SECONDS
    assert AsyncTaskRunner(max_queue_size=4, poll_sleep_time=0.001).poll_sleep_time == 0.001  # a shorter one stays


def test_a_runner_without_the_poll_is_left_alone_with_one_line(monkeypatch, caplog):
    from areal.infra.async_task_runner import AsyncTaskRunner

    upstream = getattr(AsyncTaskRunner.__init__, "__wrapped__", AsyncTaskRunner.__init__)

    def renamed(self, max_queue_size, idle_wait=0.5):
        upstream(self, max_queue_size)

    monkeypatch.setattr(AsyncTaskRunner, "__init__", renamed)
    monkeypatch.setattr(remote_inf_engine, "asyncio", resume_poll.CappedSleep(resume_poll.POLL_SECONDS))  # resends done
    with caplog.at_level(logging.WARNING, logger="areal_patches"):
        resume_poll.install()
    assert AsyncTaskRunner.__init__ is renamed
    assert len(caplog.records) == 1 and "left as upstream's" in caplog.records[0].getMessage()


def test_the_stand_in_caps_sleep_and_is_asyncio_otherwise():
    capped = resume_poll.CappedSleep(0.01)
    assert capped.gather is asyncio.gather and capped.Event is asyncio.Event
    start = time.perf_counter()
    assert asyncio.run(capped.sleep(30, result="woke")) == "woke"
    assert time.perf_counter() - start < 5  # 30 s asked, 0.01 s slept
