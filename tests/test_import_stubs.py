"""devkit/import_stubs.py: the stand-ins that let areal import on the GPU machine without ray,
wandb, swanlab or trackio. Each imports, turns any attribute into a harmless dummy, and
answers truthfully where areal branches on it."""

import subprocess
import sys

from devkit import ROOT

CHECK = """
import ray, wandb, ray.util.placement_group as pg
assert ray.is_initialized() is False        # areal's single controller would take its Ray paths
ray.init(address="auto"); wandb.log({"x": 1}); pg.anything(1)   # calls do nothing
print(ray.__file__)
"""


def test_stand_ins_import_and_ray_is_not_initialized(tmp_path):
    subprocess.run([sys.executable, "devkit/import_stubs.py", str(tmp_path)], cwd=ROOT, check=True)
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / "ray" / "__init__.py")
