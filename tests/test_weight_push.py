"""weight_push.install(): AReaL's wait for the "weights saved" record polls every 20 ms, not every
1 s plus a random 0-100 ms.

The sleeps are recorded instead of slept (name_resolve's `time.sleep` is replaced), so the
test checks the interval the wait asks for, not the machine's timing. The record appears
during the first sleep, as it does when the trainer finishes saving.
"""

import pytest

from areal.api.cli_args import NameResolveConfig
from areal.utils import name_resolve

from areal_patches import weight_push


@pytest.fixture
def repository(tmp_path, monkeypatch):
    """A fresh NFS name_resolve repository with AReaL's own wait, whatever was installed before.

    Another test may have installed weight_push in this process, so each test starts from the unwrapped wait and the module state is restored afterwards.
    """
    for cls in weight_push.REPOSITORIES:
        monkeypatch.setattr(cls, "wait", getattr(cls.wait, "__wrapped__", cls.wait))
    for attr in ["DEFAULT_REPOSITORY", "add", "get", "wait", "reset"]:
        monkeypatch.setattr(name_resolve, attr, getattr(name_resolve, attr))
    name_resolve.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=str(tmp_path / "nr")))
    return name_resolve


@pytest.fixture
def sleeps(monkeypatch, repository):
    """The intervals waits sleep for; the record a wait looks for is written during its first sleep."""
    asked = []

    def sleep(seconds):
        asked.append(seconds)
        repository.add(f"weights/v{len(asked)}", "saved")

    monkeypatch.setattr(name_resolve.time, "sleep", sleep)
    return asked


def test_areal_waits_a_second_without_install(repository, sleeps):
    """The premise: areal 1.0.4 sleeps its default poll_frequency of 1 s (if AReaL changes, drop the module)."""
    assert repository.wait("weights/v1", timeout=120) == "saved"
    assert len(sleeps) == 1 and sleeps[0] >= 1.0


def test_installed_wait_polls_every_20_ms_without_a_random_addition(repository, sleeps):
    weight_push.install()
    for version in (1, 2, 3):
        assert repository.wait(f"weights/v{version}", timeout=120) == "saved"
    assert sleeps == [weight_push.POLL_SECONDS] * 3


def test_installed_wait_survives_reconfigure_and_keeps_explicit_intervals(tmp_path, repository, sleeps):
    weight_push.install()
    weight_push.install()  # a second install wraps AReaL's wait, not the first wrapper
    repository.reconfigure(NameResolveConfig(type="nfs", nfs_record_root=str(tmp_path / "other")))
    assert repository.wait("weights/v1", timeout=120) == "saved"
    assert repository.wait("weights/v2", timeout=120, poll_frequency=15) == "saved"
    assert sleeps[0] < 0.2 and sleeps[1] >= 15


def test_missing_record_still_times_out(repository, monkeypatch):
    weight_push.install()
    monkeypatch.setattr(name_resolve.time, "sleep", lambda seconds: None)
    with pytest.raises(TimeoutError, match="weights/v9"):
        repository.wait("weights/v9", timeout=0.05)
