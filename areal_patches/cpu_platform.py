"""Give AReaL's CPU platform a device-control variable, so the SPMD launchers run without GPUs.

Upstream behaviour (areal 1.0.4): `CpuPlatform.device_control_env_var` is the empty string.
The local launcher prefixes every job it starts with `<variable>=<device ids>`, so on a
machine without GPUs the server command becomes `... =0 stdbuf -oL python3 -m
areal.infra.launcher.sglang_server ...` and the shell stops at `/bin/sh: 1: =0: not found`.

Effect: the CPU platform names `CUDA_VISIBLE_DEVICES`, which nothing reads on a machine
without GPUs, so the launcher's job commands are well formed and every job starts.

Where and how to turn it off: only CPU runs apply it, through devkit/dev_server/sglang_seam (whose
`sitecustomize` calls `install()` right after AReaL imports its CPU platform module): the
launcher process is AReaL's own `__main__`, so nothing of the project runs there earlier. GPU
machines use `CudaPlatform` and never reach this; a run without the seam on PYTHONPATH has
AReaL's behaviour.

Upstream: `CpuPlatform.device_control_env_var` is still empty on AReaL's main as of cbff54d
(2026-08-22) and in the v2.0.0 tag, and the local launcher still prefixes jobs with it; AReaL
issue #1002 (closed) reported related CPU-platform problems of the local scheduler, not this
launcher path.
"""

from __future__ import annotations

import types

DEVICE_CONTROL_ENV_VAR = "CUDA_VISIBLE_DEVICES"


def install(cpu_module: types.ModuleType | None = None) -> None:
    """Name the variable on the CPU platform class (of `cpu_module`, once it is imported)."""
    if cpu_module is None:
        from areal.infra.platforms import cpu as cpu_module
    if not cpu_module.CpuPlatform.device_control_env_var:
        cpu_module.CpuPlatform.device_control_env_var = DEVICE_CONTROL_ENV_VAR
