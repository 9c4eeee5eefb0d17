"""Stop waiting for an inference server that has already exited.

Upstream behaviour (areal 1.0.4): `RemoteInfEngine._wait_for_server(address, process)` polls
the new server's /health for `rollout.setup_timeout` seconds (300 by default) and never
looks at `process`. A server that fails at start (a wrong model path, out of memory, a
missing package) keeps the run waiting five minutes for "server launch failed", with the
server's own error long scrolled away.

Effect: every poll also checks the server process; once it has exited, the wait ends at once
with an error naming the server, its exit code and where its own error is.

Off: `areal_patches.apply(skip={"server_start"})`.

Upstream: fixed on main in ddec7e9 (PR #1545: the wait polls the process and raises at once),
after the v2.0.0 tag and in no release on PyPI; drop this fix once an areal release after 1.0.4
ships it.
"""

from __future__ import annotations

import subprocess
import time


def wait_for_server(self, address: str, process: subprocess.Popen | None = None) -> None:
    """`RemoteInfEngine._wait_for_server`, ending as soon as the server process exits."""
    deadline = time.time() + self.config.setup_timeout
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"inference server {address} exited with code {process.returncode} before "
                "answering /health; its own error is above, in this rollout worker's log"
            )
        if self.check_health(f"http://{address}"):
            return
        time.sleep(1)
    raise TimeoutError(f"inference server {address}: no answer to /health in {self.config.setup_timeout:.0f} s")


def install() -> None:
    from areal.infra.remote_inf_engine import RemoteInfEngine

    RemoteInfEngine._wait_for_server = wait_for_server
