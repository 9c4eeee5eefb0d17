"""Import-only stand-ins for packages AReaL imports but a single-process run never calls.

    python3 devkit/import_stubs.py DIR     # then put DIR first on PYTHONPATH

Why: the GPU machine has no network and takes packages only as wheels of at most 64 MiB
per call. `import areal` imports ray (a 79 MB wheel), wandb, swanlab and trackio at module
level even when a run uses none of them (SPMD mode, wandb disabled). Each stand-in turns
every attribute and every submodule into a harmless dummy, so the import succeeds; a call
into one does nothing. Never put DIR on PYTHONPATH where the real packages are wanted.
"""

from __future__ import annotations

import sys
from pathlib import Path

STUBBED = ["ray", "wandb", "swanlab", "trackio"]

STUB_SOURCE = '''"""Import-only stand-in written by devkit/import_stubs.py; see that file."""
import importlib.abc
import importlib.machinery
import sys
import types


class _DummyType(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Dummy


class Dummy(Exception, metaclass=_DummyType):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return Dummy()

    def __getattr__(self, name):
        return Dummy


class _Module(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Dummy


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Module(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.insert(0, _Finder())
__version__ = "0.0.0"


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return Dummy
'''


# Answers the stand-ins must give truthfully: a dummy is truthy, and areal's single
# controller takes its Ray paths (Ray tensors, ray.cloudpickle) when ray.is_initialized() is.
EXTRA_SOURCE = {"ray": "\n\ndef is_initialized():\n    return False\n"}


def write_stubs(root: Path) -> Path:
    for name in STUBBED:
        package = root / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(STUB_SOURCE + EXTRA_SOURCE.get(name, ""))
    return root


if __name__ == "__main__":
    print(write_stubs(Path(sys.argv[1])))
