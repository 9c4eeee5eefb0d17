"""Stop a single-controller run whose rollout server died, instead of retrying forever.

Upstream behaviour (areal 1.0.4): in single-controller mode nothing watches the inference
servers once they answer. When one dies, every generation request to it fails after its
retries, the failed rollouts are simply tried again, and the controller waits for a batch
that never fills: killed mid-run on CPU, the run was still retrying minutes later with no
end. (Under the SPMD launchers AReaL's server wrapper exits when its server does, and the
launcher stops the run; this watchdog is for the single controller only.)

Effect: a daemon thread in the controller asks every rollout server for /health every few
seconds. Once one has not answered for `grace` seconds, the run prints one line naming the
server and what to do, stops every process it started (workers, servers) and exits with
status 1; the last recover checkpoint is on disk, so the same command resumes.

Off: `CountDownConfig.server_health_grace=0` (train.py passes it as `grace`).

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0 tag: nothing
watches a server once it has answered (PR #1545 covers a server that dies at start only); not
reported.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

from areal_patches import clean_exit


def healthy(address: str, timeout: float) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=timeout) as response:
            return response.status == 200
    except OSError:
        return False


def watch(
    addresses: list[str], grace: float, interval: float = 5.0, on_dead: Callable[[str], None] = clean_exit.end_now
) -> threading.Thread:
    """Check each address every `interval` s; call `on_dead(message)` once one has been silent
    for `grace` s. Returns the (daemon) thread."""

    def run() -> None:
        last_ok = dict.fromkeys(addresses, time.monotonic())
        while True:
            for address in addresses:
                if healthy(address, timeout=interval):
                    last_ok[address] = time.monotonic()
                elif time.monotonic() - last_ok[address] > grace:
                    on_dead(
                        f"train.py: rollout server {address} has not answered /health for "
                        f"{grace:.0f} s (it died or hangs; its output is in the rollout worker's "
                        "log); stopping the run. Rerun the same command to resume from the last "
                        "recover checkpoint."
                    )
                    return
            time.sleep(interval)

    thread = threading.Thread(target=run, name="server-watchdog", daemon=True)
    thread.start()
    return thread


def watch_rollout_servers(trainer, grace: float) -> None:
    """Watch the servers of a single-controller PPOTrainer (no-op in SPMD mode or at grace 0)."""
    from areal.utils.environ import is_single_controller
    from areal.utils.network import format_hostport

    if grace <= 0 or not is_single_controller():
        return
    addresses = [format_hostport(s.host, s.port) for s in trainer.rollout.server_infos]
    if addresses:
        watch(addresses, grace)
