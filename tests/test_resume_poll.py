"""areal_patches/resume_poll: applied only where AReaL's source still holds the one 0.5 s poll,
as the one check of the dispatcher's pause.

The resends themselves are exercised through AReaL's real RemoteSGLangEngine and the dev server
in tests/test_dev_server.py; these check the guard and the stand-in, without a server.
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


def test_the_stand_in_caps_sleep_and_is_asyncio_otherwise():
    capped = resume_poll.CappedSleep(0.01)
    assert capped.gather is asyncio.gather and capped.Event is asyncio.Event
    start = time.perf_counter()
    assert asyncio.run(capped.sleep(30, result="woke")) == "woke"
    assert time.perf_counter() - start < 5  # 30 s asked, 0.01 s slept
