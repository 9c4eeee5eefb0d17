"""areal_patches.apply(): the fixes by kind, the off switches, and the release guard."""

import logging

import pytest

import areal_patches


def every_fix() -> set[str]:
    return {areal_patches.short_name(fix) for group in areal_patches.fixes().values() for fix in group}


def test_the_fixes_come_in_two_named_groups_each_once():
    groups = areal_patches.fixes()
    assert list(groups) == ["bug fixes", "speed-ups"]
    names = [areal_patches.short_name(fix) for group in groups.values() for fix in group]
    assert len(names) == len(set(names)) == 22
    assert all(callable(fix.install) for group in groups.values() for fix in group)


def test_a_fix_skipped_by_name_is_not_applied(monkeypatch):
    applied = []
    for group in areal_patches.fixes().values():
        for fix in group:
            monkeypatch.setattr(fix, "install", lambda name=areal_patches.short_name(fix): applied.append(name))
    areal_patches.apply(skip={"fast_step", "weight_push"})
    assert set(applied) == every_fix() - {"fast_step", "weight_push"}


def test_fixes_named_in_the_environment_are_skipped_too(monkeypatch):
    applied = []
    for group in areal_patches.fixes().values():
        for fix in group:
            monkeypatch.setattr(fix, "install", lambda name=areal_patches.short_name(fix): applied.append(name))
    monkeypatch.setenv(areal_patches.SKIP_VARIABLE, "fast_save, pause_at_load")
    areal_patches.apply(skip={"fast_step"})
    assert set(applied) == every_fix() - {"fast_step", "fast_save", "pause_at_load"}
    monkeypatch.setenv(areal_patches.SKIP_VARIABLE, "fast_sav")
    with pytest.raises(ValueError, match="no fix named fast_sav .in skip or AREAL_PATCHES_SKIP"):
        areal_patches.apply()


def test_an_unknown_name_to_skip_is_refused():
    with pytest.raises(ValueError, match="no fix named fast_stp"):
        areal_patches.apply(skip={"fast_stp"})


def test_another_areal_release_is_said_in_one_line(monkeypatch, caplog):
    import areal

    monkeypatch.setattr(areal, "__version__", "1.1.0")
    with caplog.at_level(logging.WARNING, logger="areal_patches"):
        areal_patches.apply(skip=every_fix())
    assert [r.getMessage() for r in caplog.records] == [
        "areal_patches: written for areal 1.0.4, applied to areal 1.1.0: "
        "check each fix's upstream status in docs/areal-bugs.md"
    ]
    caplog.clear()
    monkeypatch.setattr(areal, "__version__", areal_patches.WRITTEN_FOR)
    areal_patches.apply(skip=every_fix())
    assert caplog.records == []
