"""Let `stats_logger.wandb.mode=offline` run without a W&B account or network.

Upstream behaviour (areal 1.0.4): `StatsLogger.init` calls `wandb.login()` for every mode but
`disabled`, offline included. With no API key configured (a machine that never ran `wandb
login`, or no network to log in over), wandb raises `UsageError: No API key configured`
and the run fails at start, before its first step.

Effect: in offline mode the process's wandb settings say offline (`wandb.setup`, wandb's
own way to set them, also where wandb was set up before) before AReaL's `init`, so the login
skips the key ("Unable to verify login in offline mode"); the run then writes its wandb folder,
`<fileroot>/logs/<user>/<experiment>/<trial>/wandb/offline-run-*`, which `wandb sync <folder>`
uploads later. Online runs and their login are AReaL's.

Off: `areal_patches.apply(skip={"wandb_offline"})`.

Upstream: `StatsLogger.init` unchanged on AReaL's main as of cbff54d (2026-08-22) and in the
v2.0.0 tag (`wandb.login()` for every mode but disabled); not reported.
"""

from __future__ import annotations

from areal_patches.patching import wrap_once


def install() -> None:
    import wandb
    from areal.utils.stats_logger import StatsLogger

    def offline_first(original):
        def init(self) -> None:
            if self.config.wandb.mode == "offline":
                wandb.setup(settings=wandb.Settings(mode="offline"))
            return original(self)

        return init

    wrap_once(StatsLogger, "init", offline_first, "logs_in_offline")
