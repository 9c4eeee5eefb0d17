"""areal_patches/switch_interval: the trainer's process hands the interpreter to the rollout
client's thread at a 1 ms switch interval, not CPython's 5 ms. How much sooner the client's
batches finish beside a busy trainer is a benchmark's question (experiments.bench.rollout_client
--trainer busy), not a unit test's."""

import sys

import pytest

from areal_patches import switch_interval


@pytest.fixture
def interval():
    """The process's switch interval, put back afterwards."""
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_cpythons_default_is_cut_to_a_millisecond_and_installing_twice_changes_nothing(interval):
    sys.setswitchinterval(0.005)
    switch_interval.install()
    assert sys.getswitchinterval() == pytest.approx(switch_interval.SWITCH_SECONDS)
    switch_interval.install()
    assert sys.getswitchinterval() == pytest.approx(switch_interval.SWITCH_SECONDS)


def test_a_shorter_interval_already_set_is_kept(interval):
    sys.setswitchinterval(0.0002)
    switch_interval.install()
    assert sys.getswitchinterval() == pytest.approx(0.0002)
