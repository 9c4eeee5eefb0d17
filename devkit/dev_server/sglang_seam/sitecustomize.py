"""What CPU runs change in AReaL's own processes; nothing else differs from a GPU run.

Active only in processes whose PYTHONPATH holds this folder (the CPU demo and the tests;
`devkit.launch.seam_env()` adds it). Python imports this file at start-up, before the command's own
module: the one place where the project reaches processes that AReaL starts by itself (its
launchers, RPC workers and server wrappers).

- **The one substitution.** Every path to an SGLang server in areal 1.0.4 (the
  single-controller rollout worker; the local, Ray and Slurm launchers' server wrapper)
  runs `python3 -m areal.experimental.inference_service.sglang.launch_server <SGLang flags>`.
  Here that module name resolves to `devkit.dev_server.sglang_launch_server`, which serves the same model
  with the dev server on the same host and port. AReaL's trainer also refuses to start unless
  package metadata reports sglang >= 0.5.10.post1: the `sglang-*.dist-info` folder beside this
  file declares the version whose HTTP protocol the dev server speaks. No `sglang` module
  exists: nothing can import it.
- **A CPU-only upstream bug.** `areal_patches.cpu_platform` is applied as soon as AReaL imports
  its CPU platform module (see that module for why).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import sys

SGLANG_SERVER_MODULE = "areal.experimental.inference_service.sglang.launch_server"
STAND_IN_MODULE = "devkit.dev_server.sglang_launch_server"
CPU_PLATFORM_MODULE = "areal.infra.platforms.cpu"


class ThenPatch(importlib.abc.Loader):
    """Runs a module as its own loader would, then patches it."""

    def __init__(self, loader, patch):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.patch(module)


def patch_cpu_platform(module) -> None:
    from areal_patches import cpu_platform

    cpu_platform.install(module)


class CpuRunFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == SGLANG_SERVER_MODULE:
            stand_in = importlib.util.find_spec(STAND_IN_MODULE)
            return importlib.util.spec_from_file_location(fullname, stand_in.origin)
        if fullname == CPU_PLATFORM_MODULE:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
            spec.loader = ThenPatch(spec.loader, patch_cpu_platform)
            return spec
        return None


sys.meta_path.insert(0, CpuRunFinder())
