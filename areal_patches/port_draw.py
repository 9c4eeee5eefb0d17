"""Ports that do not follow the run's seed.

Upstream behaviour (areal 1.0.4): `areal.utils.network.find_free_ports` draws candidate ports
with the module-level `random`, which the trainer has just seeded with the config's `seed`
(`seeding.set_random_seed`). Every run with the same seed draws the same ports in the same
order. Two such runs started together on one machine (two experiments sharing a GPU host)
race for them: the later run's worker fails to bind ("Address already in use"), while the
controller's health check is answered by the other run's worker on that port, and the run
goes on talking to the other run's processes until it hangs.

Effect: the draw uses a generator of its own, seeded by the operating system, so concurrent
runs pick different ports whatever their seed. Nothing else that uses `random` changes: the
seed still decides the data order, the sampling and the initial weights. Measured with two
demos started together on CPU (docs/results/areal-fixes.md, "Two runs with one seed on one
machine").

Off: `areal_patches.apply(skip={"port_draw"})`.

Upstream: `find_free_ports` still draws from the module-level `random` on AReaL's main as of
cbff54d (2026-08-22) and in the v2.0.0 tag (PR #1436 changed only its range check); not
reported.
"""

from __future__ import annotations

import random


def install() -> None:
    from areal.utils import network

    if not isinstance(network.random, random.SystemRandom):
        network.random = random.SystemRandom()
