"""areal_patches/submit_ahead: applied only where AReaL's prepare_batch rounds still queue at most
one batch from the dispatcher's queue of inputs.

What it changes, that the next batch runs while the trainer trains and never beyond the
staleness bound, is exercised through AReaL's real RemoteSGLangEngine and the dev server in
tests/test_dev_server.py; these check the guard, without a server.
"""

import inspect
import logging

from areal.infra.workflow_executor import BatchTaskDispatcher

from areal_patches import submit_ahead


def upstream_method():
    method = BatchTaskDispatcher.active_submit_and_wait
    return getattr(method, "__wrapped__", method)


def test_the_installed_areal_queues_one_batch_a_round():
    assert submit_ahead.holds_the_one_batch_cap(inspect.getsource(BatchTaskDispatcher), inspect.getsource(upstream_method()))


def test_a_dispatcher_that_queues_more_or_keeps_no_queue_is_not_patched():
    dispatcher, method = inspect.getsource(BatchTaskDispatcher), inspect.getsource(upstream_method())
    assert not submit_ahead.holds_the_one_batch_cap(dispatcher, method.replace(submit_ahead.UPSTREAM_CAP, "for _ in range(capacity):"))
    assert not submit_ahead.holds_the_one_batch_cap(dispatcher.replace("self._pending_inputs", "self._inputs"), method)


def test_the_guard_says_so_in_one_line_and_changes_nothing(monkeypatch, caplog):
    monkeypatch.setattr(BatchTaskDispatcher, "active_submit_and_wait", upstream_method())
    monkeypatch.setattr(submit_ahead, "UPSTREAM_CAP", "a line upstream no longer has")
    with caplog.at_level(logging.WARNING, logger="areal_patches"):
        submit_ahead.install()
    assert BatchTaskDispatcher.active_submit_and_wait is upstream_method()
    assert len(caplog.records) == 1 and "not applied" in caplog.records[0].getMessage()
