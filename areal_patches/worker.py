"""AReaL's RPC worker with the project's fixes installed: the single-controller entry point.

    python3 -m areal_patches.worker ...      (train_config.yaml, `actor.scheduling_spec.cmd`)

AReaL's schedulers start every training and rollout worker with that command and their own
arguments (port, role, name_resolve, ...), which go unchanged to
`areal.infra.rpc.rpc_server.main`. The fixes must be in place before the server builds an
engine, so they are installed here, in the worker process itself.
"""

from __future__ import annotations


def main() -> None:
    from areal.infra.rpc.rpc_server import main as rpc_server_main

    import areal_patches

    areal_patches.apply()
    rpc_server_main()


if __name__ == "__main__":
    main()
