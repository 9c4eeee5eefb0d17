"""The project's one substitution: where AReaL starts an SGLang server, the dev server starts.

Active only in processes whose PYTHONPATH holds this folder (the CPU demo, the tests, and GPU
runs without SGLang; `tools.sglang_seam.environment()` adds it). Python imports this file at
start-up, before the command's own module; everything else AReaL does is unchanged.

- Every path to an SGLang server in areal 1.0.4 (the single-controller rollout worker, the
  local, Ray and Slurm launchers' server wrapper) runs `python3 -m
  areal.experimental.inference_service.sglang.launch_server <SGLang flags>`. Here that module
  name resolves to `tools.sglang_launch_server`, which serves the same model with the dev
  server on the same host and port.
- AReaL's trainer refuses to start unless package metadata reports sglang >= 0.5.10.post1; the
  `sglang-*.dist-info` folder beside this file declares the version whose HTTP protocol the
  dev server speaks. No `sglang` module exists: nothing can import it.
"""

import importlib.abc
import importlib.util
import sys

SGLANG_SERVER_MODULE = "areal.experimental.inference_service.sglang.launch_server"
STAND_IN_MODULE = "tools.sglang_launch_server"


class DevServerForSGLang(importlib.abc.MetaPathFinder):
    """Finds the dev server's launcher under the name of AReaL's SGLang server module."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != SGLANG_SERVER_MODULE:
            return None
        stand_in = importlib.util.find_spec(STAND_IN_MODULE)
        return importlib.util.spec_from_file_location(fullname, stand_in.origin)


sys.meta_path.insert(0, DevServerForSGLang())
