"""Let `stats_logger.wandb.mode=offline` run without a W&B account or network.

Upstream behaviour (areal 1.0.4): `StatsLogger.init` calls `wandb.login()` for every mode but
`disabled`, offline included. With no API key configured (a machine that never ran `wandb
login`, or no network to log in over), wandb raises `UsageError: No API key configured`
and the run fails at start, before its first step.

Effect: in offline mode the login runs as wandb's own offline mode does it (`WANDB_MODE=offline`
for the call: it skips the key and says "Unable to verify login in offline mode"); the run then
writes its wandb folder, `<fileroot>/logs/<user>/<experiment>/<trial>/wandb/offline-run-*`,
which `wandb sync <folder>` uploads later. Online runs and their login are AReaL's.

Off: `areal_patches.install(wandb_offline=False)`.
"""

from __future__ import annotations

import functools
import os


def install() -> None:
    from areal.utils.stats_logger import StatsLogger

    original = StatsLogger.init
    if getattr(original, "logs_in_offline", False):
        return

    @functools.wraps(original)
    def init(self) -> None:
        if self.config.wandb.mode != "offline":
            return original(self)
        previous = os.environ.get("WANDB_MODE")
        os.environ["WANDB_MODE"] = "offline"
        try:
            return original(self)
        finally:
            if previous is None:
                os.environ.pop("WANDB_MODE")
            else:
                os.environ["WANDB_MODE"] = previous

    init.logs_in_offline = True
    StatsLogger.init = init
